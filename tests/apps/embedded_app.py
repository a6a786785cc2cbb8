"""A Celery app that uses anarchon_celery (an ``anarchon_*`` setting), for the tests of workers
started with ``-B``. Its one job runs every second on an interval, which Celery's own scheduler
runs too (a cron string would crash that one before it sends anything). Configured from the
environment: ``EMBEDDED_APP_PREFIX`` and ``EMBEDDED_APP_BROKER``."""

from __future__ import annotations

import os

from celery import Celery

PREFIX = os.environ.get("EMBEDDED_APP_PREFIX", "embedded.")

app = Celery(
    "embedded_app",
    broker=os.environ.get("EMBEDDED_APP_BROKER")
    or os.environ.get("ANARCHON_TEST_BROKER", "amqp://guest:guest@127.0.0.1:5672//"),
)
app.conf.update(
    imports=("anarchon_celery",),
    task_default_queue=f"{PREFIX}tasks",
    anarchon_prefix=PREFIX,
    beat_schedule={"every1": {"task": "embedded_app.tick", "schedule": 1.0}},
)


@app.task(name="embedded_app.tick", shared=False)
def tick() -> str:
    return "tick"
