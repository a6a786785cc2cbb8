"""A small Celery app scheduled by anarchon_celery: run by ``examples/demo.py``, on RabbitMQ or, with
``ANARCHON_DEMO_BACKEND`` and ``ANARCHON_DEMO_FOLDER``, on a SQLite file and kombu's filesystem
transport (nothing to install).

Each task appends one JSON line per execution to the file named by ``ANARCHON_DEMO_LOG``, with the
task id and the job and slot the scheduler sent it for (``anarchon_celery.scheduled_run``).
"""

from __future__ import annotations

import json
import os
from datetime import timedelta

from celery import Celery
from celery.schedules import crontab

import anarchon_celery

PREFIX = os.environ.get("ANARCHON_DEMO_PREFIX", "demo.")

app = Celery("demo_app", broker=os.environ.get("ANARCHON_DEMO_BROKER", "amqp://guest:guest@127.0.0.1:5672//"))
app.conf.update(
    timezone="Europe/Paris",
    beat_scheduler="anarchon_celery.Scheduler",
    task_default_queue=f"{PREFIX}tasks",
    anarchon_prefix=PREFIX,
    anarchon_jitter_ms=500,
    anarchon_max_late_ms=5_000,  # examples/demo.py's LATEST_SEND_MS is jitter + this
    anarchon_slot_ttl_ms=60_000,
    broker_connection_retry_on_startup=True,
    beat_schedule={
        # A plain beat_schedule entry: a cron string with seconds (first field) and arguments.
        "squares": {"task": "demo_app.square", "schedule": "*/3 * * * * *", "args": (7,)},
        # A Celery crontab: once a minute, on the app's time zone.
        "minutely": {"task": "demo_app.record", "schedule": crontab()},
    },
)


#: On a store with leases, a winner holds its run this long before a backup may send it: shorter
#: than max_late_ms, or no backup could ever act.
LEASE_MS = 2_000

if os.environ.get("ANARCHON_DEMO_BACKEND"):  # runs decided elsewhere than the broker (a SQLite file)
    app.conf.anarchon_backend = os.environ["ANARCHON_DEMO_BACKEND"]
    app.conf.anarchon_lease_ms = LEASE_MS
if os.environ.get("ANARCHON_DEMO_FOLDER"):  # kombu's filesystem:// transport: messages are files
    folder = os.environ["ANARCHON_DEMO_FOLDER"]
    app.conf.broker_transport_options = {
        "data_folder_in": os.path.join(folder, "messages"),
        "data_folder_out": os.path.join(folder, "messages"),
        "control_folder": os.path.join(folder, "control"),
        "polling_interval": 0.1,
    }
    app.conf.worker_enable_remote_control = False  # no broadcast over files


def _record(task, **extra) -> None:
    run = anarchon_celery.scheduled_run(task.request)  # the job and slot the scheduler sent it for
    line = {
        "task_id": task.request.id,
        "task": task.name,
        "job": run.job if run else None,
        "slot": run.slot_ms if run else None,
        "pid": os.getpid(),
        **extra,
    }
    path = os.environ.get("ANARCHON_DEMO_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps(line) + "\n")


@anarchon_celery.cron("*/2 * * * * *")  # every 2 seconds
@app.task(bind=True)
def tick(self) -> None:
    _record(self)


@anarchon_celery.cron(timedelta(seconds=5), name="report", jitter_ms=200)  # epoch-aligned interval
@app.task(bind=True)
def build_report(self) -> None:
    _record(self)


@anarchon_celery.cron("*/10 * * * * *", name="fails")  # shows a failed run in the history
@app.task(bind=True)
def always_fails(self) -> None:
    _record(self)
    raise RuntimeError("this job fails on purpose")


@app.task(bind=True)
def square(self, n: int) -> int:
    _record(self, result=n * n)
    return n * n


@app.task(bind=True)
def record(self) -> None:
    _record(self)
