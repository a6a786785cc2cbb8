"""A Celery app for the tests of a job's first runs: one job every second with a long lateness,
and another added to the code when BIRTHS_APP_ADDED is set, under BIRTHS_APP_PREFIX, on the store
that BIRTHS_APP_BACKEND names (RabbitMQ by default)."""

from __future__ import annotations

import os

from celery import Celery

PREFIX = os.environ["BIRTHS_APP_PREFIX"]

app = Celery("births_app", broker=os.environ.get("ANARCHON_TEST_BROKER", "amqp://guest:guest@127.0.0.1:5672//"))
app.conf.update(
    imports=("anarchon_celery",),
    task_default_queue=f"{PREFIX}tasks",
    anarchon_prefix=PREFIX,
    anarchon_slot_ttl_ms=60_000,
    anarchon_max_late_ms=20_000,  # a start sends the runs missed in the last 20 s: of jobs that existed then
    anarchon_jitter_ms=0,
    anarchon_history_size=0,
    anarchon_runtime_check_ms=1_000,
    beat_schedule={"every": {"task": "births_app.work", "schedule": 1.0}},
)
if os.environ.get("BIRTHS_APP_BACKEND"):
    app.conf.anarchon_backend = os.environ["BIRTHS_APP_BACKEND"]
if os.environ.get("BIRTHS_APP_ADDED"):  # a job added to the code of a deployment that runs
    app.conf.beat_schedule["added"] = {"task": "births_app.work", "schedule": 1.0}


@app.task(name="births_app.work", shared=False)
def work() -> None: ...
