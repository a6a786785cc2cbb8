"""A loud error when a beat that is not ours runs an app that uses anarchon_celery.

``celery worker -B -S anarchon_celery.Scheduler`` looks right and is not: for ``worker``, ``-S``
is ``--statedb``, so every such worker embeds Celery's own scheduler. Each of them then sends
every plain ``beat_schedule`` entry (duplicates), ``@anarchon_celery.cron`` jobs never run, and
cron strings in ``beat_schedule`` crash it while the worker looks healthy. Connected when
``anarchon_celery`` is imported, which every ``celery`` command does while the package is
installed (it registers the ``anarchon`` sub-command).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery.signals import beat_init, celeryd_after_setup

from . import docs

__all__ = ["foreign_scheduler_error"]

logger = logging.getLogger(__name__)

OURS = "anarchon_celery.Scheduler"
#: Set in a worker once its embedded beat was checked: the beat process it forks says no more.
_worker_checked = False


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
        message += f"Start the worker with `-B --scheduler {OURS}` or set beat_scheduler = {OURS!r}"
        if statedb and os.path.basename(statedb).startswith("anarchon_celery"):
            message += f" (for `celery worker`, -S is --statedb: it made a state file {statedb!r})"
        message += f". See {docs.EMBEDDED_SCHEDULER}"
    else:
        message += f"Start it with `celery beat -S {OURS}` or set beat_scheduler = {OURS!r}"
    return message


@celeryd_after_setup.connect
def _check_embedded_beat(sender: Any = None, instance: Any = None, **_: Any) -> None:
    global _worker_checked
    if instance is None or getattr(instance, "beat", None) is None:
        return  # no -B
    _worker_checked = True
    try:
        error = foreign_scheduler_error(
            instance.app, instance.scheduler, embedded=True, statedb=getattr(instance, "statedb", None)
        )
    except Exception:  # noqa: BLE001 - a check must never stop a worker
        logger.debug("anarchon: embedded beat check failed", exc_info=True)
        return
    if error:
        logger.error("anarchon: %s", error)


@beat_init.connect
def _check_beat(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if app is None or _worker_checked:
        return
    try:
        error = foreign_scheduler_error(app, getattr(sender, "scheduler_cls", None), embedded=False)
    except Exception:  # noqa: BLE001 - a check must never stop beat
        logger.debug("anarchon: beat check failed", exc_info=True)
        return
    if error:
        logger.error("anarchon: %s", error)
