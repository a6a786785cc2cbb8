"""A Celery app for the worker-side history tests (``tests/test_worker_history.py``): real worker
processes run its tasks and write their history. Configured from the environment, as the tests
start it: ``WORKER_APP_PREFIX``, ``WORKER_APP_BROKER``, and ``WORKER_APP_BACKEND`` to write
history through another URL (a proxy) than the tasks take."""

from __future__ import annotations

import os
import time
from pathlib import Path

from celery import Celery

BROKER = os.environ.get("WORKER_APP_BROKER") or os.environ.get(
    "ANARCHON_TEST_BROKER", "amqp://guest:guest@127.0.0.1:5672//"
)
NEVER = "0 3 1 1 *"  # the runs are sent by the tests, not by a beat


def make_app(prefix: str, backend: str | None = None) -> Celery:
    """The app, with its jobs, for queue prefix ``prefix``."""
    app = Celery("worker_app", broker=BROKER, set_as_current=False)
    app.conf.update(
        imports=("anarchon_celery",),
        task_default_queue=f"{prefix}tasks",
        broker_connection_retry_on_startup=True,
        anarchon_prefix=prefix,
        anarchon_history_size=2000,
        beat_schedule={
            "quick": {"task": "worker_app.quick", "schedule": NEVER},
            # Celery sends a task whose expiry has passed with a message TTL of 0: RabbitMQ hands
            # it to a consumer that has room at once, and the worker discards it as expired.
            "expiring": {
                "task": "worker_app.quick",
                "schedule": NEVER,
                "options": {"expires": "2000-01-01T00:00:00+00:00"},
            },
            # The tests send its runs with a path of their own; a job's arguments must fit its task.
            "waiting": {"task": "worker_app.wait_for", "schedule": NEVER, "args": (os.devnull,)},
        },
    )
    if backend:
        app.conf.anarchon_backend = backend

    @app.task(name="worker_app.quick", shared=False)
    def quick() -> None:
        """Nothing: only its history counts."""

    @app.task(name="worker_app.wait_for", shared=False)
    def wait_for(path: str, timeout: float = 120) -> None:
        """Return once ``path`` exists (or after ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        while not Path(path).exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    return app


app = make_app(os.environ.get("WORKER_APP_PREFIX", "workerapp."), os.environ.get("WORKER_APP_BACKEND"))
