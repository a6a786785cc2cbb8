"""Worker-side history: ``running``, then ``succeeded`` or ``failed``, for every task the
scheduler sent (tasks without the ``anarchon_run`` header are ignored).

Connected when ``anarchon_celery`` is imported in the worker, which ``@anarchon_celery.cron``
does; for apps that only use ``beat_schedule``, add ``"anarchon_celery"`` to Celery's ``imports``
setting. Recording never fails a task: a history event that cannot be written is logged.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from celery.signals import task_postrun, task_prerun

from . import clock
from .backends import Backend
from .history import encode_event

__all__ = ["run_headers_of"]

logger = logging.getLogger(__name__)

_lock = threading.Lock()
#: Per process (a prefork child must not share its parent's connection) and per app.
_deployments: dict[tuple[int, int], Any] = {}


def run_headers_of(request: Any) -> dict[str, Any] | None:
    """The ``anarchon_*`` headers of a task request, or None for tasks the scheduler did not send."""
    headers = getattr(request, "headers", None) or {}
    run = headers.get("anarchon_run") or getattr(request, "anarchon_run", None)
    if not run:
        return None

    def get(key: str) -> Any:
        return headers.get(key, getattr(request, key, None))

    return {"run": run, "job": get("anarchon_job"), "slot": get("anarchon_slot"), "trigger": get("anarchon_trigger")}


def _deployment(app: Any) -> Any:
    from .control import configure

    key = (os.getpid(), id(app))
    with _lock:
        if key not in _deployments:
            _deployments[key] = configure(app)
        return _deployments[key]


def _record(task: Any, event: str, **fields: Any) -> None:
    try:
        run = run_headers_of(task.request)
        if run is None or not run["job"]:
            return
        deployment = _deployment(task.app)
        job = deployment.jobs.get(run["job"])
        history_size = job.history_size if job else deployment.settings.history_size
        if not history_size:
            return  # the job keeps no history
        body = encode_event(
            event,
            run=run["run"],
            job=run["job"],
            at_ms=clock.now_ms(),
            worker=task.request.hostname or f"pid {os.getpid()}",
            **fields,
        )
        backend: Backend = deployment.backend
        with _lock:  # one connection per process, shared by a thread pool's threads
            backend.record(run["job"], body, history_size)
    except Exception:  # noqa: BLE001 - history must never fail the task
        logger.warning("anarchon: %s event of task %s not recorded", event, getattr(task, "name", task), exc_info=True)


@task_prerun.connect
def _on_prerun(sender: Any = None, task: Any = None, **_: Any) -> None:
    if task is not None:
        _record(task, "running")


@task_postrun.connect
def _on_postrun(sender: Any = None, task: Any = None, retval: Any = None, state: str | None = None, **_: Any) -> None:
    if task is None:
        return
    if state == "SUCCESS":
        _record(task, "succeeded")
    elif state == "FAILURE":
        _record(task, "failed", error_type=type(retval).__name__, error=str(retval))
