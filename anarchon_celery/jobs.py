"""Jobs: what runs when, collected from ``@cron`` tasks and ``beat_schedule``, and validated.

Everything here fails at start with a :class:`ConfigError` naming the job and the fix, never in
the middle of a run.
"""

from __future__ import annotations

import datetime as dt
import difflib
import hashlib
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from . import docs
from .arguments import check_arguments, check_binding
from .errors import ConfigError
from .gates import live_gates
from .schedule import Cron, Schedule, parse_schedule, resolve_tz
from .settings import MAX_BACKUP_RUNNERS, MINIMUMS, Settings, check_catch_up, check_minimum, check_overlap

__all__ = ["Job", "check_arguments", "collect_jobs", "cron", "definition", "live_gates", "task_id_for"]

JOB_NAME_RE = re.compile(r"[A-Za-z0-9_-]+\Z")

#: Per-job keys of a ``beat_schedule`` entry (``@cron`` takes the same as keyword arguments).
JOB_KEYS = frozenset(
    {
        "task",
        "schedule",
        "args",
        "kwargs",
        "options",
        "jitter_ms",
        "max_late_ms",
        "history_size",
        "tz",
        "relative",
        "backup_runners",
        "catch_up",
        "catch_up_window_ms",
        "overlap",
    }
)

#: The backend named in the errors of a job read without a backend at hand (the default one).
RABBITMQ = "the RabbitMQ backend"


def claim_only(title: str) -> str:
    """Why a backend without leases (``title``, as "the RabbitMQ backend") takes no lease option."""
    return (
        f"{title} is claim only (a winner that dies before sending loses its run). Use a backend "
        f"that holds leases: anarchon_backend = 'redis://…', 'postgresql://…' or 'sqlite:///…' (see {docs.CLAIM_ONLY})"
    )


_NOT_YET = "anarchon_celery does not offer it yet"
#: Options of anarchon that anarchon_celery does not take, with why.
REFUSED_KEYS = {
    "backups": "the key is backup_runners",
    "no_overlap": "the key is overlap: 'skip', 'buffer_one' or 'buffer_all'",
    "hand_over": "a backend with leases hands over by itself on SIGTERM: there is nothing to set",
    "handover": "a backend with leases hands over by itself on SIGTERM: there is nothing to set",
    "history_ttl_ms": "history is trimmed by size only (a RabbitMQ stream, or rows of the store): use history_size",
}

#: apply_async options the scheduler sets itself.
RESERVED_OPTIONS = frozenset({"task_id", "producer", "link", "link_error", "add_to_parent", "retry", "retry_policy"})

_TASK_ID_NAMESPACE = uuid.UUID("5b0c4b8e-8f1e-4a57-9d0e-5f3b8e6d2a11")


def task_id_for(prefix: str, job: str, slot: int) -> str:
    """The deterministic task id of a scheduled run: the same on every instance."""
    return str(uuid.uuid5(_TASK_ID_NAMESPACE, f"{prefix}{job}.slot.{slot}"))


@dataclass(frozen=True, kw_only=True)
class Job:
    """One scheduled job: a Celery task and when to send it."""

    name: str
    task: str
    schedule: Schedule
    tz: dt.tzinfo
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    jitter_ms: int
    max_late_ms: int
    history_size: int
    #: How many instances that lose a run's claim are armed as its backups (0 without leases).
    backup_runners: int = 0
    #: The runs missed while no instance could claim them: None (skipped), ``"latest"`` (one run
    #: for the newest) or ``"all"`` (each one); those older than ``catch_up_window_ms`` are not.
    catch_up: str | None = None
    catch_up_window_ms: int = 0
    #: What is done with a run due while the job's last run is busy: ``"allow"`` (sent anyway),
    #: ``"skip"``, ``"buffer_one"`` or ``"buffer_all"`` (see :mod:`~anarchon_celery.backends.busy`);
    #: and how long a run sent counts as busy before a worker starts it.
    overlap: str = "allow"
    overlap_queued_ms: int = 0
    #: 0 for a job defined in code; a runtime job's version (see :mod:`anarchon_celery.runtime`).
    version: int = 0

    def next_slot(self, after_ms: int) -> int:
        """The first slot strictly after ``after_ms``."""
        return self.schedule.next_slot(after_ms)


def definition(job: Job) -> dict[str, str]:
    """What every instance of a deployment must agree on for ``job``, field by field, as text: its
    task, when it runs, with what, and its lateness and history settings. Instances that differ
    run the union of their schedules (see :meth:`~anarchon_celery.Backend.share_definitions`)."""
    schedule = job.schedule.describe()
    if isinstance(job.schedule, Cron) and not job.schedule.day_or:
        schedule += " (day of month and day of week must both match)"
    return {
        "task": job.task,
        "schedule": schedule,
        "args": repr(tuple(job.args)),
        "kwargs": repr(dict(sorted(job.kwargs.items()))),
        "options": repr(dict(sorted(job.options.items()))),
        "jitter_ms": str(job.jitter_ms),
        "max_late_ms": str(job.max_late_ms),
        "history_size": str(job.history_size),
        **({"catch_up": f"{job.catch_up} within {job.catch_up_window_ms} ms"} if job.catch_up else {}),
        **({"overlap": job.overlap} if job.overlap != "allow" else {}),
    }


def catch_up_key(job: Job) -> str:
    """What the store keeps of a job's schedule and catch-up policy, to tell when either changed:
    a changed job catches up nothing from before the change. Empty for a job without catch-up."""
    if not job.catch_up:
        return ""
    seen = definition(job)["schedule"] + f"|{job.tz}|{job.catch_up}"
    return hashlib.sha1(seen.encode()).hexdigest()[:16]


def _check_int(job: str, key: str, value: Any) -> int:
    """A per-job integer, against the minimum of the setting that is its default."""
    try:
        return check_minimum(key, value, MINIMUMS[key])
    except ConfigError as exc:
        raise ConfigError(f"job {job!r}: {exc}") from None


def _unknown_key_error(job: str, key: str) -> ConfigError:
    where = job if job.startswith("@cron(") else f"job {job!r}"
    if key in REFUSED_KEYS:
        return ConfigError(f"{where}: {key} is not available: {REFUSED_KEYS[key]}")
    close = difflib.get_close_matches(key, sorted(JOB_KEYS), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ConfigError(f"{where}: unknown key {key!r}.{hint} Known keys: {', '.join(sorted(JOB_KEYS))}")


def make_job(
    name: Any,
    entry: Mapping[str, Any],
    settings: Settings,
    app_tz: dt.tzinfo,
    *,
    leases: bool = False,
    title: str = RABBITMQ,
) -> Job:
    """Build and validate one job from a ``beat_schedule``-style entry."""
    task = _check_entry(name, entry)
    try:
        tz = resolve_tz(entry["tz"]) if entry.get("tz") is not None else app_tz
        schedule = parse_schedule(entry["schedule"], tz)
    except ConfigError as exc:
        raise ConfigError(f"job {name!r}: {exc}") from exc
    args, kwargs, options = _check_call(name, entry)

    def setting(key: str) -> Any:
        value = entry.get(key)
        return getattr(settings, key) if value is None else value

    return Job(
        name=name,
        task=task,
        schedule=schedule,
        tz=tz,
        args=args,
        kwargs=kwargs,
        options=options,
        jitter_ms=_check_int(name, "jitter_ms", setting("jitter_ms")),
        max_late_ms=_check_int(name, "max_late_ms", setting("max_late_ms")),
        history_size=_check_int(name, "history_size", setting("history_size")),
        backup_runners=_backup_runners(name, entry, settings, leases, title),
        **_catch_up(name, entry, settings, leases, title),
        **_overlap(name, entry, settings, leases, title, options),
    )


def _check_entry(name: Any, entry: Any) -> str:
    """The job's name, keys, task and schedule key checked; returns its task."""
    if not isinstance(name, str) or not JOB_NAME_RE.match(name):
        raise ConfigError(
            f"job name {name!r} is invalid: use only letters, digits, '_' and '-' (it becomes part of queue names)"
        )
    if not isinstance(entry, Mapping):
        raise ConfigError(f"job {name!r}: the entry must be a dict, not {type(entry).__name__}")
    for key in entry:
        if key not in JOB_KEYS:
            raise _unknown_key_error(name, str(key))
    task = entry.get("task")
    if not isinstance(task, str) or not task:
        raise ConfigError(f"job {name!r}: 'task' must be the name of a Celery task, not {task!r}")
    if "schedule" not in entry:
        raise ConfigError(f"job {name!r}: 'schedule' is missing")
    if entry.get("relative"):
        raise ConfigError(
            f"job {name!r}: relative=True is not supported: intervals are aligned to the Unix epoch "
            "so that every instance computes the same runs"
        )
    return task


def _check_call(name: str, entry: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any], dict[str, Any]]:
    """The job's ``args``, ``kwargs`` and ``options`` checked."""
    args = entry.get("args") or ()
    if not isinstance(args, (list, tuple)):
        raise ConfigError(f"job {name!r}: args must be a list or tuple, not {args!r}")
    kwargs = entry.get("kwargs") or {}
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise ConfigError(f"job {name!r}: kwargs must be a dict with string keys, not {kwargs!r}")
    options = entry.get("options") or {}
    if not isinstance(options, Mapping):
        raise ConfigError(f"job {name!r}: options must be a dict of apply_async options, not {options!r}")
    reserved = sorted(RESERVED_OPTIONS.intersection(options))
    if reserved:
        raise ConfigError(f"job {name!r}: options {reserved} are set by the scheduler and cannot be given")
    if "headers" in options and not isinstance(options["headers"], Mapping):
        raise ConfigError(f"job {name!r}: options['headers'] must be a dict")
    return tuple(args), dict(kwargs), dict(options)


def _backup_runners(name: str, entry: Mapping[str, Any], settings: Settings, leases: bool, title: str) -> int:
    given = entry.get("backup_runners")
    if given is not None and not leases:
        raise ConfigError(f"job {name!r}: backup_runners is not available: {claim_only(title)}")
    if not leases:
        return 0
    value = _check_int(name, "backup_runners", settings.backup_runners if given is None else given)
    if value > MAX_BACKUP_RUNNERS:
        raise ConfigError(f"job {name!r}: backup_runners must be at most {MAX_BACKUP_RUNNERS}, not {value}")
    return value


def _catch_up(name: str, entry: Mapping[str, Any], settings: Settings, leases: bool, title: str) -> dict[str, Any]:
    """The job's catch-up policy and window, checked: on a backend with leases only, and a window
    at least as long as the job's lateness (a shorter one would catch nothing up)."""
    for key in ("catch_up", "catch_up_window_ms"):
        if entry.get(key) not in (None, False) and not leases:
            raise ConfigError(f"job {name!r}: {key} is not available: {claim_only(title)}")
    if not leases:
        return {}
    given = entry.get("catch_up")
    try:
        policy = check_catch_up("catch_up", settings.catch_up if given is None else given)
    except ConfigError as exc:
        raise ConfigError(f"job {name!r}: {exc}") from None
    if not policy:
        return {}
    window = entry.get("catch_up_window_ms")
    window = _check_int(name, "catch_up_window_ms", settings.catch_up_window_ms if window is None else window)
    max_late = entry.get("max_late_ms")
    max_late = settings.max_late_ms if max_late is None else max_late
    if window < max_late:
        raise ConfigError(
            f"job {name!r}: catch_up_window_ms ({window}) must be at least max_late_ms ({max_late}): runs later "
            "than max_late_ms are the ones caught up, within the window"
        )
    return {"catch_up": policy, "catch_up_window_ms": window}


def _overlap(
    name: str, entry: Mapping[str, Any], settings: Settings, leases: bool, title: str, options: Mapping[str, Any]
) -> dict[str, Any]:
    """The job's overlap policy, checked (on a backend with leases only), and how long a run sent
    counts as busy: the message's ``expires`` (seconds) when it is sooner than
    ``anarchon_overlap_queued_ms``."""
    given = entry.get("overlap")
    if given not in (None, "allow") and not leases:
        raise ConfigError(f"job {name!r}: overlap is not available: {claim_only(title)}")
    if not leases:
        return {}
    try:
        policy = check_overlap("overlap", settings.overlap if given is None else given)
    except ConfigError as exc:
        raise ConfigError(f"job {name!r}: {exc}") from None
    if policy == "allow":
        return {}
    queued = settings.overlap_queued_ms
    expires = options.get("expires")
    if isinstance(expires, (int, float)) and not isinstance(expires, bool) and expires > 0:
        queued = min(queued, max(1, int(expires * 1000)))
    return {"overlap": policy, "overlap_queued_ms": queued}


#: A backup comes back this long after the lease's end, so that the store finds it over.
BACKUP_MARGIN_MS = 20


def backups_never_act(job: Job, lease_ms: int) -> bool:
    """Whether the job has backups that could never take a run over: its runs' deadline comes
    before the winner's lease has run out and a backup has come back."""
    return bool(job.backup_runners) and lease_ms + BACKUP_MARGIN_MS >= job.max_late_ms


class JobRules(Protocol):
    """What the jobs are checked against: the backend they run on (see
    :meth:`~anarchon_celery.backends.Backend.check_job`)."""

    title: str
    leases: bool

    def check_job(self, job: Job, lead_ms: int = 0) -> None: ...


# -- the @cron decorator ------------------------------------------------------------------------

#: Tasks (or their lazy proxies) decorated above ``@app.task``, with their entries. Functions
#: decorated below ``@app.task`` carry their entries in ``__anarchon_cron__`` instead.
_DECORATED_TASKS: list[tuple[Any, dict[str, Any]]] = []


def cron(
    spec: Any,
    *,
    name: str | None = None,
    tz: str | dt.tzinfo | None = None,
    jitter_ms: int | None = None,
    max_late_ms: int | None = None,
    history_size: int | None = None,
    backup_runners: int | None = None,
    catch_up: str | bool | None = None,
    catch_up_window_ms: int | None = None,
    overlap: str | None = None,
    args: tuple[Any, ...] | list[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    **refused: Any,
) -> Callable[[Any], Any]:
    """Schedule a Celery task. Put it above or below ``@app.task``::

        @anarchon_celery.cron("*/5 * * * *", tz="Europe/Paris")
        @app.task
        def refresh(): ...

    ``spec`` is anything a ``beat_schedule`` entry's ``schedule`` may be (a cron string, a Celery
    ``crontab``, a ``timedelta`` or seconds). The job's name defaults to the task function's name;
    the other arguments are the per-job keys, defaulting to the ``anarchon_*`` settings. Several
    ``@cron`` on one task make several jobs (give them distinct names).
    """
    # Checked with the app's other jobs (collect_jobs), not here: an error raised while Celery
    # imports the app's modules is shown as "Unable to load celery application" and a traceback,
    # where beat, the worker and `celery anarchon` show a job's error as one line naming it.
    entry: dict[str, Any] = {"schedule": spec, "args": args, "kwargs": kwargs or {}, "_name": name, **refused}
    for key, value in (
        ("tz", tz),
        ("jitter_ms", jitter_ms),
        ("max_late_ms", max_late_ms),
        ("history_size", history_size),
        ("backup_runners", backup_runners),
        ("catch_up", catch_up),
        ("catch_up_window_ms", catch_up_window_ms),
        ("overlap", overlap),
        ("options", options),
    ):
        if value is not None:
            entry[key] = value

    def decorate(target: Any) -> Any:
        from celery.app.task import Task
        from celery.local import Proxy

        # type(), not isinstance(): isinstance would evaluate a lazy task proxy too early.
        if issubclass(type(target), (Task, Proxy)):
            _DECORATED_TASKS.append((target, entry))
        elif callable(target):
            target.__anarchon_cron__ = [*getattr(target, "__anarchon_cron__", []), entry]
        else:
            raise ConfigError(f"@cron must decorate a Celery task, not {target!r}")
        return target

    return decorate


def _decorated_entries(app: Any) -> list[tuple[str, dict[str, Any]]]:
    """The ``@cron`` jobs of ``app``, as (name, entry) pairs, in a stable order."""
    tasks = app.tasks
    found: list[tuple[Any, dict[str, Any]]] = []
    for task in tasks.values():
        fun = getattr(task, "__wrapped__", None)
        fun = getattr(fun, "__func__", fun)  # bound for bind=True tasks
        found += [(task, entry) for entry in getattr(fun, "__anarchon_cron__", ())]
    for target, entry in _DECORATED_TASKS:
        getter = getattr(type(target), "_get_current_object", None)
        task = getter(target) if getter else target  # a lazy proxy's task, once the app is ready
        if tasks.get(task.name) is task:  # else a task of another app
            found.append((task, entry))
    result = []
    for task, entry in found:
        entry = dict(entry)
        job_name = entry.pop("_name") or task.name.rsplit(".", 1)[-1]
        result.append((job_name, dict(entry, task=task.name)))
    return result


def collect_jobs(app: Any, settings: Settings, backend: JobRules) -> list[Job]:
    """Every job of ``app``: its ``@cron`` tasks, then its ``beat_schedule`` entries.

    Checks names (valid, unique), tasks (registered), per-job keys, that the arguments bind to
    the task's parameters and encode with the task's serializer, and the rules of the
    ``backend`` they run on (the safety rule...).
    """
    try:
        app_tz = app.timezone
    except Exception as exc:  # noqa: BLE001 - Celery raises what zoneinfo or its own loader raises
        raise ConfigError(
            f"the app's timezone setting {app.conf.timezone!r} is not a known time zone: "
            "use an IANA name such as 'Europe/Paris' or 'UTC'"
        ) from exc
    entries = _decorated_entries(app)
    schedule = app.conf.beat_schedule or {}
    if not isinstance(schedule, Mapping):
        raise ConfigError(f"beat_schedule must be a dict, not {type(schedule).__name__}")
    entries += list(schedule.items())
    jobs: dict[str, Job] = {}
    for name, entry in entries:
        job = make_job(name, entry, settings, app_tz, leases=backend.leases, title=backend.title)
        if name in jobs:
            raise ConfigError(
                f"two jobs are named {name!r}: give one another name (@cron(name=...) or another beat_schedule key)"
            )
        check_runnable(job, app, settings, backend)
        jobs[name] = job
    return list(jobs.values())


def check_runnable(job: Job, app: Any, settings: Settings, backend: JobRules) -> None:
    """ConfigError unless ``app`` can run ``job`` on ``backend``: its task registered, its
    arguments bound to the task's parameters (for a task with ``typing`` on) and encoded with the
    task's serializer, the backend's rules kept (the safety rule...)."""
    registered = app.tasks
    if job.task not in registered:
        close = difflib.get_close_matches(job.task, sorted(registered), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"job {job.name!r}: task {job.task!r} is not registered in app {app.main!r}.{hint} "
            "Import its module in the beat process (imports/include settings)"
        )
    check_binding(job, registered[job.task])
    check_arguments(job, registered[job.task], app)
    backend.check_job(job, settings.lead_ms)


def runtime_job(
    name: str, version: int, entry: Mapping[str, Any], app: Any, settings: Settings, backend: JobRules
) -> Job:
    """A runtime job (version ``version`` of its ``entry``), as ``app`` would run it on ``backend``:
    validated exactly as a job of the code (:func:`make_job`, :func:`check_runnable`)."""
    try:
        app_tz = app.timezone
    except Exception as exc:  # noqa: BLE001 - as collect_jobs
        raise ConfigError(f"the app's timezone setting {app.conf.timezone!r} is not a known time zone") from exc
    job = make_job(name, entry, settings, app_tz, leases=backend.leases, title=backend.title)
    check_runnable(job, app, settings, backend)
    return replace(job, version=version)
