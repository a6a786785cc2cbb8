"""A Celery app whose tasks all live in other modules, found as ``celery beat`` and ``celery worker``
find them: one listed in ``include``, one in ``imports``, one by ``autodiscover_tasks``. This module
imports none of them (nor anarchon_celery)."""

from __future__ import annotations

import os

from celery import Celery

PREFIX = os.environ.get("CLI_IMPORTS_APP_PREFIX", "cliimports.")

BROKER = os.environ.get("ANARCHON_TEST_BROKER", "amqp://guest:guest@127.0.0.1:5672//")
app = Celery("cli_imports_app", broker=BROKER, include=["tests.apps.cli_included_tasks"])
app.conf.update(
    imports=("tests.apps.cli_imported_tasks",),
    task_default_queue=f"{PREFIX}tasks",
    anarchon_prefix=PREFIX,
    anarchon_history_size=5,
    beat_schedule={"imported": {"task": "cli_imports.imported", "schedule": "0 5 * * *"}},
)
app.autodiscover_tasks(["tests.apps"], related_name="cli_discovered_tasks")
