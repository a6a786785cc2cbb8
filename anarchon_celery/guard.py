"""Beats that are not ours, running an app that uses anarchon_celery: a worker's embedded beat is
refused, a standalone beat logs a loud error.

``celery worker -B -S anarchon_celery.Scheduler`` looks right and is not: for ``worker``, ``-S``
is ``--statedb``, so every such worker would embed Celery's own scheduler. Each of them would
then send every plain ``beat_schedule`` entry (duplicates), ``@anarchon_celery.cron`` jobs would
never run, and cron strings in ``beat_schedule`` crash it while the worker looks healthy. Such a
worker is stopped before it starts anything (its pool, its beat, the state file of ``--statedb``):
a worker step, added to the app when the worker initialises, checks the ``-B`` scheduler after the
worker's logging is set up and before any step is made. Connected when ``anarchon_celery`` is
imported, which every ``celery`` command does while the package is installed (it registers the
``anarchon`` sub-command).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import bootsteps
from celery.signals import beat_init, worker_init

from . import docs

__all__ = ["foreign_scheduler_error"]

logger = logging.getLogger(__name__)

OURS = "anarchon_celery.Scheduler"


def _uses_anarchon(app: Any) -> bool:
    from .jobs import _decorated_entries

    conf = app.conf
    if any(isinstance(key, str) and key.lower().startswith(("anarchon_", "celery_anarchon_")) for key in conf):
        return True
    return bool(_decorated_entries(app))


def _is_ours(scheduler: Any) -> bool:
    from celery.utils.imports import load_extension_class_names, symbol_by_name

    from .scheduler import Scheduler

    try:
        aliases = dict(load_extension_class_names("celery.beat_schedulers"))
        cls = symbol_by_name(scheduler, aliases=aliases) if isinstance(scheduler, str) else scheduler
    except Exception:  # noqa: BLE001 - a scheduler that cannot be imported fails on its own, loudly
        return True
    return isinstance(cls, type) and issubclass(cls, Scheduler)


def foreign_scheduler_error(app: Any, scheduler: Any, *, embedded: bool, statedb: str | None = None) -> str | None:
    """What is wrong when ``scheduler`` runs ``app``'s schedule although the app uses
    anarchon_celery (``@cron`` jobs or ``anarchon_*`` settings); None when all is well."""
    if scheduler is None or _is_ours(scheduler) or not _uses_anarchon(app):
        return None
    name = scheduler if isinstance(scheduler, str) else f"{scheduler.__module__}.{scheduler.__qualname__}"
    where = "this worker's embedded beat (-B)" if embedded else "this beat"
    message = (
        f"{where} runs {name}, not {OURS}, although the app uses anarchon_celery: it sends every "
        "beat_schedule entry itself (each instance: duplicates), @anarchon_celery.cron jobs never "
        "run, and cron strings in beat_schedule crash it. "
    )
    if embedded:
        message += f"The worker is not started. Start it with `-B --scheduler {OURS}` or set beat_scheduler = {OURS!r}"
        if statedb and os.path.basename(statedb).startswith("anarchon_celery"):
            message += " (for `celery worker`, -S is --statedb, the file of revoked tasks, not the scheduler)"
        message += f". See {docs.EMBEDDED_SCHEDULER}"
    else:
        message += f"Start it with `celery beat -S {OURS}` or set beat_scheduler = {OURS!r}"
    return message


class EmbeddedBeatCheck(bootsteps.Step):
    """A worker step that stops a worker whose ``-B`` would embed another scheduler than ours in
    an app that uses anarchon_celery. Its check runs when the worker makes its steps, before any
    of them starts anything: Celery's Beat step (the plain beat), its StateDB step (the
    ``--statedb`` file), the pool. It makes nothing itself."""

    label = "anarchon embedded beat check"

    def __init__(self, parent: Any, beat: bool = False, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.enabled = False
        if not beat:
            return
        try:
            error = foreign_scheduler_error(
                parent.app, parent.scheduler, embedded=True, statedb=getattr(parent, "statedb", None)
            )
        except Exception:  # noqa: BLE001 - a failed check must not stop a worker
            logger.debug("anarchon: embedded beat check failed", exc_info=True)
            return
        if error:
            # One clear line and a failed exit, as beat does for a configuration error: a worker
            # that ran without the beat its command asks for would leave the schedule to nobody
            # without a sign but this line.
            logger.critical("anarchon: %s", error)
            raise SystemExit(1)


@worker_init.connect
def _add_embedded_beat_check(sender: Any = None, **_: Any) -> None:
    """Add the check to the app's worker steps: the worker makes its steps after this signal."""
    steps = getattr(getattr(sender, "app", None), "steps", None)
    if steps is not None:
        steps["worker"].add(EmbeddedBeatCheck)


@beat_init.connect
def _check_beat(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if app is None:
        return
    try:
        error = foreign_scheduler_error(app, getattr(sender, "scheduler_cls", None), embedded=False)
    except Exception:  # noqa: BLE001 - a check must never stop beat
        logger.debug("anarchon: beat check failed", exc_info=True)
        return
    if error:
        logger.error("anarchon: %s", error)
