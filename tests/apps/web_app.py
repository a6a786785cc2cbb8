"""A Celery project for the schedules page's tests (``tests/test_web.py``) and its screenshots
(``tests/support/web_screenshots.py``), configured from a mapping by :func:`make`, so that a test
makes in its own process the app its beats and its page run. The environment's keys:

* ``WEB_APP_PREFIX``: the task queue's prefix (``<prefix>tasks``), and the claims' unless
  ``WEB_APP_STORE_PREFIX`` is given;
* ``WEB_APP_BACKEND``: where runs are decided (empty: the broker, RabbitMQ); on a store the
  project has a job protected from overlap, ``sync-ledger``;
* ``WEB_APP_EXTRA``: ``1`` gives the app a task the others lack (``shop.import_legacy``), so that
  a runtime job added with it is one the others cannot run;
* ``WEB_APP_JITTER_MS``: the jobs' jitter (0 by default).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from celery import Celery

import anarchon_celery

#: The runtime job the tests add and edit, and the one only an app with WEB_APP_EXTRA can run.
RUNTIME_JOB = "customer-42-report"
FOREIGN_JOB = "legacy-import"


def make(env: Mapping[str, str]) -> Celery:
    """The project, as ``env`` configures it."""
    prefix = env.get("WEB_APP_PREFIX", "webapp.")
    backend = env.get("WEB_APP_BACKEND", "")
    app = Celery(
        "shop",
        broker=env.get("ANARCHON_TEST_BROKER", "amqp://guest:guest@127.0.0.1:5672//"),
        set_as_current=False,
    )
    schedule: dict[str, dict[str, object]] = {
        "refresh_prices": {"task": "shop.refresh_prices", "schedule": 2},
        "nightly-report": {
            "task": "shop.report",
            "schedule": "30 2 * * *",
            "tz": "Europe/Paris",
            "args": ["daily"],
        },
        "audit-export": {"task": "shop.report", "schedule": 3600, "args": ["audit"], "history_size": 0},
    }
    if backend and not backend.startswith("amqp"):
        schedule["sync-ledger"] = {"task": "shop.sync_ledger", "schedule": 2, "overlap": "skip"}
    app.conf.update(
        imports=("anarchon_celery",),
        timezone="Europe/Paris",
        task_default_queue=f"{prefix}tasks",
        broker_connection_retry_on_startup=True,
        anarchon_prefix=env.get("WEB_APP_STORE_PREFIX") or prefix,
        anarchon_slot_ttl_ms=60_000,
        anarchon_max_late_ms=5_000,
        anarchon_lead_ms=10_000,
        anarchon_jitter_ms=int(env.get("WEB_APP_JITTER_MS", "0")),
        anarchon_history_size=30,
        beat_schedule=schedule,
    )
    if backend:
        app.conf.anarchon_backend = backend

    @app.task(name="shop.refresh_prices", shared=False)
    def refresh_prices() -> None:
        run = anarchon_celery.scheduled_run()
        if run is not None and run.slot_ms // 2_000 % 7 == 3:
            raise ConnectionError("the price feed did not answer within 5 s")

    @app.task(name="shop.report", shared=False)
    def report(kind: str, format: str = "csv") -> str:
        return kind

    @app.task(name="shop.sync_ledger", shared=False)
    def sync_ledger() -> None:
        time.sleep(25)  # longer than its interval: its job is busy, and the runs due meanwhile skipped

    if env.get("WEB_APP_EXTRA") == "1":

        @app.task(name="shop.import_legacy", shared=False)
        def import_legacy() -> None: ...

    return app


app = make(os.environ)
