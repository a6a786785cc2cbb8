"""The Celery app of the steady-lateness benchmark: STEADY_JOBS jobs on second-level schedules
(every 1 s, 2 s, 3 s and the cron ``*/5 * * * * *``, in turn), run by anarchon_celery with
jitter 0, so that every instance claims each run at its slot."""

from __future__ import annotations

import os

from celery import Celery

PREFIX = os.environ.get("STEADY_PREFIX", "steady.")
JOBS = int(os.environ.get("STEADY_JOBS", "200"))
SCHEDULES: list[object] = [1.0, 2.0, 3.0, "*/5 * * * * *"]

app = Celery("steady_app", broker=os.environ.get("BENCH_BROKER", "amqp://guest:guest@127.0.0.1:5672//"))
app.conf.update(
    task_default_queue=f"{PREFIX}tasks",
    broker_connection_retry_on_startup=True,
    beat_scheduler="anarchon_celery.Scheduler",
    anarchon_prefix=PREFIX,
    anarchon_jitter_ms=0,
    anarchon_max_late_ms=10_000,
    anarchon_slot_ttl_ms=int(os.environ.get("STEADY_SLOT_TTL_MS", "60000")),
    anarchon_lead_ms=int(os.environ.get("STEADY_LEAD_MS", "10000")),
    anarchon_history_size=int(os.environ.get("STEADY_HISTORY_SIZE", "10")),
    beat_schedule={
        f"job-{n:03d}": {
            "task": "steady_app.tick",
            "schedule": SCHEDULES[n % len(SCHEDULES)],
            "args": (f"job-{n:03d}",),
        }
        for n in range(JOBS)
    },
)


@app.task(name="steady_app.tick")
def tick(job: str) -> None:
    """Nothing to do: the benchmark times the messages, not the work."""
