"""A Celery app whose broker is Redis and whose runs are claimed in RabbitMQ (``anarchon_backend``),
or in Redis itself (``REDIS_APP_BACKEND=app-broker``), for tests/test_redis_broker.py. Every
execution of its task appends one JSON line, with the task id and the ``anarchon_*`` headers it was
sent with, to the file named by ``REDIS_APP_LOG``."""

from __future__ import annotations

import json
import os
from typing import Any

from celery import Celery

PREFIX = os.environ.get("REDIS_APP_PREFIX", "redisapp.")
HEADERS = ("anarchon_job", "anarchon_slot", "anarchon_run", "anarchon_trigger")

app = Celery("redis_app", broker=os.environ.get("REDIS_APP_BROKER", "redis://127.0.0.1:6379/5"))
app.conf.update(
    # Every key kombu writes (queues, bindings, the worker's unacked messages) under one prefix.
    broker_transport_options={"global_keyprefix": os.environ.get("REDIS_APP_KEYPREFIX", PREFIX)},
    broker_connection_retry_on_startup=True,
    task_default_queue=f"{PREFIX}tasks",
    task_ignore_result=True,
    # "app-broker": none set, so the runs are decided in the app's broker, Redis
    anarchon_backend=None
    if os.environ.get("REDIS_APP_BACKEND") == "app-broker"
    else os.environ.get("REDIS_APP_BACKEND")
    or os.environ.get("ANARCHON_TEST_BROKER", "amqp://guest:guest@127.0.0.1:5672//"),
    anarchon_prefix=PREFIX,
    anarchon_slot_ttl_ms=60_000,
    anarchon_max_late_ms=5_000,
    anarchon_jitter_ms=300,
    anarchon_history_size=0,
    beat_schedule={"every": {"task": "redis_app.record", "schedule": 1.0, "args": ("x",)}},
)


@app.task(name="redis_app.record", bind=True, shared=False)
def record(self: Any, *args: Any) -> None:
    request = self.request
    headers = request.headers or {}
    line = {
        "task_id": request.id,
        "args": list(args),
        **{key: headers.get(key, getattr(request, key, None)) for key in HEADERS},
    }
    with open(os.environ["REDIS_APP_LOG"], "a", encoding="utf-8") as log:
        log.write(json.dumps(line) + "\n")
