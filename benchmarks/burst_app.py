"""The Celery app of the burst and idle benchmarks: BURST_JOBS jobs on the cron BURST_CRON (every
minute by default), all due at once, run by anarchon_celery (jitter 0) or by plain celery beat
(BURST_IMPL). Every run is one ``burst_app.tick(job)`` message on ``<BURST_PREFIX>tasks``."""

from __future__ import annotations

import os

from celery import Celery
from celery.schedules import crontab

PREFIX = os.environ.get("BURST_PREFIX", "burst.")
JOBS = int(os.environ.get("BURST_JOBS", "1000"))
IMPL = os.environ.get("BURST_IMPL", "anarchon")
CRON = os.environ.get("BURST_CRON", "* * * * *")

app = Celery("burst_app", broker=os.environ.get("BENCH_BROKER", "amqp://guest:guest@127.0.0.1:5672//"))
app.conf.update(task_default_queue=f"{PREFIX}tasks", broker_connection_retry_on_startup=True)
names = [f"job-{n:04d}" for n in range(JOBS)]
if IMPL == "anarchon":
    app.conf.update(
        beat_scheduler="anarchon_celery.Scheduler",
        anarchon_prefix=PREFIX,
        anarchon_jitter_ms=int(os.environ.get("BURST_JITTER_MS", "0")),
        anarchon_max_late_ms=30_000,
        anarchon_history_size=int(os.environ.get("BURST_HISTORY_SIZE", "10")),
        anarchon_lead_ms=int(os.environ.get("BURST_LEAD_MS", "10000")),
        beat_schedule={name: {"task": "burst_app.tick", "schedule": CRON, "args": (name,)} for name in names},
    )
    if os.environ.get("BURST_BACKEND"):  # runs decided elsewhere (a SQLite file); tasks on the broker
        app.conf.anarchon_backend = os.environ["BURST_BACKEND"]
    if os.environ.get("BURST_CATCH_UP"):  # a catch-up policy on every job (a store's claims carry its key)
        app.conf.anarchon_catch_up = os.environ["BURST_CATCH_UP"]
    if os.environ.get("BURST_OVERLAP"):  # an overlap policy on every job (each win admitted by its job's state)
        app.conf.anarchon_overlap = os.environ["BURST_OVERLAP"]
        # No worker ends the runs (a raw consumer counts them): a run sent at start holds its job
        # for a second only, so that the burst's runs find their jobs free, as after a run's end.
        app.conf.anarchon_overlap_queued_ms = 1_000
else:  # plain celery beat: the same runs as crontab entries
    minute, hour, day, month, weekday = CRON.split()
    every = crontab(minute=minute, hour=hour, day_of_month=day, month_of_year=month, day_of_week=weekday)
    app.conf.beat_schedule = {name: {"task": "burst_app.tick", "schedule": every, "args": (name,)} for name in names}


@app.task(name="burst_app.tick")
def tick(job: str) -> None:
    """Nothing to do: the benchmark counts the messages, not the work."""
