"""Runtime jobs: added, changed and removed without a restart, for every instance at once.

A runtime job is a ``beat_schedule`` entry (JSON values only) kept where runs are decided, with a
version: the SQL stores' ``anarchon_defs`` table, a Redis hash, or RabbitMQ's control log (see
:mod:`.backends.definitions`). It is validated exactly as a job of the code, when the change is
made, by the instance (or command) making it: a bad schedule, an unknown task, the safety rule,
an option the backend refuses are the same errors. Each change names the version it is based on;
one based on another version than the one kept is refused (:class:`~.backends.definitions.JobConflict`),
so two operators never overwrite each other. The beat instances act on each change within about
a second, on that job only (see :mod:`.live_jobs`). A job of the code and a runtime job never
share a name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .backends.definitions import JobDef, entry_of
from .control import Deployment, configure
from .errors import ConfigError
from .jobs import JOB_KEYS, runtime_job
from .pausing import who

__all__ = ["add_job", "remove_job", "runtime_jobs", "update_job"]

#: An entry key whose value None in :func:`update_job` is taken out of the entry (back to its default).
_OPTIONAL = JOB_KEYS - {"task", "schedule"}


def _author(by: str | None) -> str:
    if by is not None and not isinstance(by, str):
        raise ConfigError(f"by names who makes the change, as text, not {by!r}")
    return " ".join((who() if by is None else by).split())[:200] or "?"


def _checked(deployment: Deployment, name: str, entry: Mapping[str, Any], version: int) -> dict[str, Any]:
    """The entry as kept (JSON values), once validated as a job of the code would be."""
    if name in deployment.jobs:
        raise ConfigError(f"job {name!r} is defined in code: change it there (a runtime job cannot take its name)")
    try:
        kept = entry_of(entry)
    except ConfigError as exc:
        raise ConfigError(f"job {name!r}: {exc}") from None
    runtime_job(name, version, kept, deployment.app, deployment.settings, deployment.backend)
    return kept


def _with(app: Any, deployment: Deployment | None) -> tuple[Deployment, bool]:
    return (deployment, False) if deployment is not None else (configure(app), True)


def add_job(
    app: Any,
    name: str,
    *,
    task: str,
    schedule: Any,
    by: str | None = None,
    deployment: Deployment | None = None,
    **keys: Any,
) -> JobDef:
    """Add the runtime job ``name``: its ``task`` on ``schedule`` (a cron string or a number of
    seconds), with any other key of a ``beat_schedule`` entry (``args``, ``kwargs``, ``options``,
    ``tz``, ``jitter_ms``, ``max_late_ms``, ``backup_runners``, ``catch_up``, ``overlap``...).
    Every instance runs it from its next slot on. Returns its definition (version 1). ConfigError
    for an invalid job, one of the code's names, or a runtime job that exists (JobConflict);
    BrokerError when it could not be kept."""
    deployment, own = _with(app, deployment)
    try:
        entry = _checked(deployment, name, {"task": task, "schedule": schedule, **keys}, 1)
        return deployment.backend.put_job(name, entry, base=None, by=_author(by))
    finally:
        if own:
            deployment.release()


def update_job(
    app: Any,
    name: str,
    *,
    if_version: int | None = None,
    by: str | None = None,
    deployment: Deployment | None = None,
    **changes: Any,
) -> JobDef:
    """Change the runtime job ``name``: each key given replaces the entry's (None takes an
    optional key out, back to its default). Based on the version kept, or on ``if_version``: a
    job changed meanwhile is not overwritten (JobConflict, with the version kept). The next run
    follows the new definition on every instance; a changed schedule starts at the change.
    Returns the definition kept. ConfigError for an invalid change (the old definition stays)."""
    deployment, own = _with(app, deployment)
    try:
        kept = _kept(deployment, name)
        base = kept.version if if_version is None else if_version
        entry = dict(kept.entry)
        for key, value in changes.items():
            if value is None and key in _OPTIONAL:
                entry.pop(key, None)
            else:
                entry[key] = value
        checked = _checked(deployment, name, entry, base + 1)
        return deployment.backend.put_job(name, checked, base=base, by=_author(by))
    finally:
        if own:
            deployment.release()


def remove_job(app: Any, name: str, *, if_version: int | None = None, deployment: Deployment | None = None) -> JobDef:
    """Remove the runtime job ``name`` (only at ``if_version``, if given), with its pause: no
    instance claims a run of it once it is removed (a run already won is still sent). Its history
    and state stay until ``prune``. Returns the definition removed."""
    deployment, own = _with(app, deployment)
    try:
        _kept(deployment, name)
        return deployment.backend.remove_job(name, base=if_version)
    finally:
        if own:
            deployment.release()


def runtime_jobs(app: Any, *, deployment: Deployment | None = None) -> dict[str, JobDef]:
    """Every runtime job kept, by name, with its version."""
    deployment, own = _with(app, deployment)
    try:
        return deployment.backend.runtime_jobs()
    finally:
        if own:
            deployment.release()


def _kept(deployment: Deployment, name: str) -> JobDef:
    if name in deployment.jobs:
        raise ConfigError(f"job {name!r} is defined in code: change it there")
    kept = deployment.backend.runtime_jobs([name]).get(name)
    if kept is None:
        raise ConfigError(f"no runtime job named {name!r} (celery anarchon jobs lists them)")
    return kept
