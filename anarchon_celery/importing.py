"""Runtime jobs from django-celery-beat: its ``PeriodicTask`` rows, read from its database with
plain SQL (no Django needed), each mapped to a runtime job (see :mod:`.runtime`) or listed with the
reason it cannot be. Nothing is dropped silently: a row that does not map says why.

What maps: a crontab (its five fields, as a Celery crontab, and its time zone) or an interval (every N days, hours,
minutes, seconds: aligned to the Unix epoch here, where django-celery-beat counts from the last
run), the task, its JSON ``args`` and ``kwargs``, ``queue``, ``exchange``, ``routing_key``,
``priority``, ``headers`` and ``expire_seconds`` (Celery's ``expires``). A disabled task is added
paused; one whose ``start_time`` is to come is added paused until then, when it resumes by
itself (django-celery-beat does not run it before). What does not: a task whose ``expires`` has
passed (django-celery-beat never runs it again), one-off and clocked tasks (a single run: ``run-now``
does that), solar schedules, intervals in microseconds, and rows whose JSON does not parse. An
``expires`` still to come is not kept (listed with a note). Times the database keeps without a
zone (SQLite) are read as UTC, as Django keeps them with ``USE_TZ = True``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import clock
from .backends.pauses import Pause
from .errors import BrokerUnavailable, ConfigError

__all__ = ["Imported", "import_django_celery_beat", "job_names", "map_row", "read_periodic_tasks", "shown_time"]

_PERIOD_S = {"days": 86_400, "hours": 3_600, "minutes": 60, "seconds": 1}
#: The kinds of schedule a row names, as its ``<kind>_id`` column.
_KINDS = ("interval", "crontab", "solar")
_NAME = re.compile(r"[^A-Za-z0-9_-]+")


@dataclass
class Imported:
    """One ``PeriodicTask`` row: the job it becomes (``entry``, None when it cannot map, with
    ``reason``), whether it is added paused (disabled there) or paused until its start
    (``until_ms``), and what of it was left out."""

    source: str  # its name in django-celery-beat
    job: str
    entry: dict[str, Any] | None
    reason: str = ""
    paused: bool = False
    notes: list[str] = field(default_factory=list)
    #: What the import did: ``created``, ``would create`` (a dry run), ``exists`` (a runtime job of
    #: that name is there: left as it is), ``not imported`` (``reason`` says why).
    action: str = ""
    #: Its ``start_time``, when it is to come: the job is added paused until then (epoch ms).
    until_ms: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "job": self.job,
            "entry": self.entry,
            "reason": self.reason or None,
            "paused": self.paused,
            "paused_until": None if self.until_ms is None else shown_time(self.until_ms),
            "notes": self.notes,
            "action": self.action,
        }


def shown_time(ms: int) -> str:
    """An instant as the listing shows it: ISO 8601 in UTC, with its offset."""
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc).isoformat(timespec="seconds")


def _rewritten(source: str, row_id: int) -> str:
    return _NAME.sub("-", source).strip("-")[:100] or f"periodic-task-{row_id}"


def job_names(rows: Sequence[tuple[int, str]]) -> dict[int, str]:
    """A job name for each row ``(id, name)``, by row id. A name is free text there; here
    letters, digits, ``_`` and ``-``. A name that is one already keeps it; the others are rewritten
    (each run of other characters becomes ``-``) and get what is left: a rewritten name that
    another row has, or that an earlier rewritten one took, ends with its row id."""
    names: dict[int, str] = {}
    taken: set[str] = set()
    for row_id, source in rows:
        if _rewritten(source, row_id) == source and source not in taken:
            names[row_id] = source
            taken.add(source)
    for row_id, source in rows:
        if row_id in names:
            continue
        name = base = _rewritten(source, row_id)
        more = 0
        while name in taken:  # (with its row id, a name that another row has already, now and then)
            more += 1
            name = f"{base[:90]}-{row_id}" + (f"-{more - 1}" if more > 1 else "")
        names[row_id] = name
        taken.add(name)
    return names


class _Unmapped(Exception):
    """Why a row cannot become a job."""


def map_row(row: Mapping[str, Any], name: str, now_ms: int | None = None) -> Imported:
    """The runtime job a ``PeriodicTask`` row (with its schedule's columns, see
    :func:`read_periodic_tasks`) becomes, read at ``now_ms`` (by default now): a row expired
    by then does not become one; a row that starts later is paused until its start."""
    source = str(row["name"])
    now = clock.now_ms() if now_ms is None else now_ms
    notes: list[str] = []
    try:
        expires, starts = _instant(row, "expires"), _instant(row, "start_time")
        if expires is not None and expires <= now:
            raise _Unmapped(f"expired at {shown_time(expires)} (its expires): django-celery-beat never runs it again")
        entry = {"task": str(row["task"]), **_schedule(row, notes), **_call(row)}
        options = _options(row)
    except _Unmapped as exc:
        return Imported(source, name, None, str(exc))
    if options:
        entry["options"] = options
    if expires is not None:
        notes.append(f"expires {shown_time(expires)} is not kept: remove the job then")
    found = Imported(source, name, entry, paused=not row.get("enabled", True), notes=notes)
    if starts is not None and starts > now:
        if found.paused:
            at = shown_time(starts)
            notes.append(
                f"start_time {at} is to come: to run it from then, pause it --until {at} rather than resume it"
            )
        else:
            found.until_ms = starts
            notes.append(f"start_time {shown_time(starts)}: paused until then, when it resumes by itself")
    return found


def _instant(row: Mapping[str, Any], key: str) -> int | None:
    """The row's date ``key`` (a datetime, or text in SQLite) in epoch ms; without a zone, UTC."""
    value = row.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, dt.datetime):
        try:
            value = dt.datetime.fromisoformat(str(value))
        except ValueError:
            raise _Unmapped(f"its {key} {value!r} is not a date") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return int(value.timestamp() * 1000)


def _schedule(row: Mapping[str, Any], notes: list[str]) -> dict[str, Any]:
    if row.get("clocked_id") is not None:
        raise _Unmapped("a clocked task (one run at a set time): anarchon runs schedules; send it once with run-now")
    if row.get("one_off"):
        kind = next((kind for kind in _KINDS if row.get(f"{kind}_id") is not None), "")
        raise _Unmapped(
            f"a one-off {kind + ' ' if kind else ''}task (django-celery-beat runs it once, then disables it): "
            "anarchon runs schedules; send it once with run-now"
        )
    if row.get("solar_id") is not None:
        raise _Unmapped("a solar schedule: use a cron spec in the place's time zone")
    if row.get("crontab_id") is not None:
        fields = [row["c_minute"], row["c_hour"], row["c_day_of_month"], row["c_month_of_year"], row["c_day_of_week"]]
        # A Celery crontab: day of month and day of week must both match (a cron string runs on either).
        found: dict[str, Any] = {
            "schedule": {"crontab": " ".join(str(part or "*").replace(" ", "") for part in fields)}
        }
        if row.get("c_timezone"):
            found["tz"] = str(row["c_timezone"])
        return found
    if row.get("interval_id") is not None:
        period, every = str(row["i_period"]), row["i_every"]
        if period not in _PERIOD_S or not isinstance(every, int) or every < 1:
            raise _Unmapped(f"an interval of {every} {period}: anarchon's intervals are whole milliseconds")
        notes.append("the interval is aligned to the Unix epoch (not counted from the last run)")
        return {"schedule": every * _PERIOD_S[period]}
    raise _Unmapped("no schedule")


def _call(row: Mapping[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, kind in (("args", list), ("kwargs", dict)):
        text = row.get(key) or ("[]" if kind is list else "{}")
        try:
            value = json.loads(text)
        except ValueError:
            raise _Unmapped(f"its {key} are not JSON: {text!r}") from None
        if not isinstance(value, kind):
            raise _Unmapped(f"its {key} are not a JSON {kind.__name__}: {text!r}")
        if value:
            found[key] = value
    return found


def _options(row: Mapping[str, Any]) -> dict[str, Any]:
    options = {
        key: row[key] for key in ("queue", "exchange", "routing_key", "priority") if row.get(key) not in (None, "")
    }
    try:
        headers = json.loads(row.get("headers") or "{}")
    except ValueError:
        raise _Unmapped(f"its headers are not JSON: {row.get('headers')!r}") from None
    if headers:
        options["headers"] = headers
    if row.get("expire_seconds"):
        options["expires"] = int(row["expire_seconds"])
    return options


_SELECT = """
SELECT t.id, t.name, t.task, t.args, t.kwargs, t.queue, t.exchange, t.routing_key, t.headers,
       t.priority, t.expires, t.expire_seconds, t.one_off, t.start_time, t.enabled,
       t.crontab_id, t.interval_id, t.solar_id, t.clocked_id,
       c.minute AS c_minute, c.hour AS c_hour, c.day_of_month AS c_day_of_month,
       c.month_of_year AS c_month_of_year, c.day_of_week AS c_day_of_week, c.timezone AS c_timezone,
       i.every AS i_every, i.period AS i_period
FROM django_celery_beat_periodictask AS t
LEFT JOIN django_celery_beat_crontabschedule AS c ON c.id = t.crontab_id
LEFT JOIN django_celery_beat_intervalschedule AS i ON i.id = t.interval_id
ORDER BY t.name
"""


def read_periodic_tasks(url: str) -> list[Imported]:
    """Every ``PeriodicTask`` of the django-celery-beat database at ``url`` (``sqlite:///path`` or
    ``postgresql://...``), named (:func:`job_names`) and mapped (:func:`map_row`). ConfigError
    for another kind of database or one without django-celery-beat's tables; BrokerUnavailable
    when it cannot be reached."""
    with _rows(url) as rows:
        names = job_names([(int(row["id"]), str(row["name"])) for row in rows])
        now = clock.now_ms()
        return [map_row(row, names[int(row["id"])], now) for row in rows]


@contextlib.contextmanager
def _rows(url: str) -> Iterator[list[dict[str, Any]]]:
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///") :]
        try:
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        except sqlite3.Error as exc:
            raise BrokerUnavailable(f"cannot open the django-celery-beat database {path}: {exc}") from exc
        try:
            db.row_factory = sqlite3.Row
            yield [dict(row) for row in _select(db.execute, sqlite3.Error, url)]
        finally:
            db.close()
    elif url.startswith(("postgresql://", "postgres://")):
        try:
            import psycopg
            from psycopg.rows import dict_row
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ConfigError("reading PostgreSQL needs psycopg: pip install 'anarchon_celery[postgres]'") from exc
        try:
            pg = psycopg.connect(url, row_factory=dict_row, connect_timeout=10)
        except psycopg.Error as exc:
            raise BrokerUnavailable(f"cannot reach the django-celery-beat database: {_safe(url)}: {exc}") from exc
        with pg:
            yield list(_select(pg.execute, psycopg.Error, url))
    else:
        raise ConfigError(
            f"{_safe(url)!r} is not a database this reads: give sqlite:///PATH or postgresql://USER@HOST/DB "
            "(the database django-celery-beat's tables are in)"
        )


def _select(execute: Any, errors: type[BaseException], url: str) -> list[Any]:
    try:
        return list(execute(_SELECT).fetchall())
    except errors as exc:
        raise ConfigError(f"{_safe(url)} has no django-celery-beat tables that can be read ({exc})") from exc


def _safe(url: str) -> str:
    """The URL without its password."""
    return re.sub(r"(//[^:/@]+:)[^@/]*@", r"\1**@", url)


def import_django_celery_beat(
    app: Any, url: str, *, apply: bool = False, by: str | None = None, deployment: Any = None
) -> list[Imported]:
    """The runtime jobs the ``PeriodicTask`` rows of the database at ``url`` become, each
    validated as :func:`~.runtime.add_job` would (a task this app does not have is not imported,
    with why); with ``apply``, added (a disabled task paused, one that starts later paused until
    its start), else a dry run. A job of that name kept already is left as it is (``exists``):
    importing twice adds nothing twice."""
    from .control import configure
    from .runtime import _checked

    found = read_periodic_tasks(url)
    own = deployment is None
    deployment = deployment or configure(app)
    try:
        kept = deployment.backend.runtime_jobs()
        for item in found:
            if item.entry is None:
                item.action = "not imported"
                continue
            if item.job in kept:
                item.action = "exists"
                continue
            try:
                _checked(deployment, item.job, item.entry, 1)
            except ConfigError as exc:
                item.action, item.reason = "not imported", str(exc)
                continue
            if not apply:
                item.action = "would create"
                continue
            _add(app, deployment, item, by)
            item.action = "created"
    finally:
        if own:
            deployment.release()
    return found


def _add(app: Any, deployment: Any, item: Imported, by: str | None) -> None:
    """Add the job, paused first when it must be: its pause is kept before its definition, so
    that no instance ever sees it active (a pause of a job not defined yet waits for it)."""
    from .runtime import _author, add_job

    assert item.entry is not None
    entry = dict(item.entry)
    task, schedule = entry.pop("task"), entry.pop("schedule")
    now = clock.now_ms()
    pause = None
    if item.paused:
        pause = Pause(by=_author(by), at_ms=now, note="disabled in django-celery-beat")
    elif item.until_ms is not None and item.until_ms > now:
        note = f"start_time in django-celery-beat: runs from {shown_time(item.until_ms)}"
        pause = Pause(by=_author(by), at_ms=now, note=note, until_ms=item.until_ms)
    if pause is not None:
        deployment.backend.pause(item.job, pause)
    try:
        add_job(app, item.job, task=task, schedule=schedule, by=by, deployment=deployment, **entry)
    except Exception:
        if pause is not None:  # ours, on a job not added (or added meanwhile by another import)
            with contextlib.suppress(Exception):  # (the error that matters is the add's)
                if deployment.backend.pauses().get(item.job) == pause:
                    deployment.backend.resume(item.job)
        raise
