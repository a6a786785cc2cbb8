"""Backfill: send the runs of a past range of a job on purpose (``celery anarchon backfill``).

Catch-up sends what was missed, within a window, by itself; a backfill is asked for: the runs of
``[since, until)`` by the job's schedule, whatever its catch-up policy and window, in slot order,
at a bounded rate. Each is sent once however often the backfill is asked for: the store marks the
run backfilled before its task is sent (a mark kept until the job's state is deleted with
``celery anarchon prune``), and takes the mark back when the send fails before its message was
written, so that asking again sends it. A message written whose confirm did not come may have
been queued: its mark is kept. A process killed between the mark and the send loses that run
(rather than risk sending it twice): the output of the backfill it was part of does not list it
as sent.

Each run gets its own task id (not the scheduled run's), trigger ``backfill``, and its slot, which
the task reads with :func:`~anarchon_celery.scheduled_run`. Redis, PostgreSQL and SQLite only.
"""

from __future__ import annotations

import datetime as dt
import itertools
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import clock
from .errors import ConfigError
from .history import encode_event
from .jobs import Job, claim_only
from .schedule import from_ms, to_ms
from .sending import Outgoing, TaskSender, instance_id, task_connection

__all__ = ["MAX_BACKFILL_RUNS", "BackfillReport", "backfill_runs", "backfill_task_id", "instant_ms"]

#: The most runs one backfill sends: a longer range is refused, to be split.
MAX_BACKFILL_RUNS = 10_000
_NAMESPACE = uuid.UUID("0f7e2b1c-3d4a-4c8e-9b6f-2a1d5e8c7b90")


def backfill_task_id(prefix: str, job: str, slot: int) -> str:
    """The task id of the backfilled run of ``job`` at ``slot``: the same each time it is asked
    for, and not the scheduled run's."""
    return str(uuid.uuid5(_NAMESPACE, f"{prefix}{job}.backfill.{slot}"))


def instant_ms(value: Any, tz: dt.tzinfo, what: str) -> int:
    """An instant given as epoch milliseconds, an aware or naive ``datetime`` (naive: in ``tz``)
    or ISO 8601 text, as epoch milliseconds; ConfigError naming ``what`` otherwise."""
    if isinstance(value, bool):
        raise ConfigError(f"{what} must be a date and time, not {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value)
        except ValueError:
            raise ConfigError(
                f"{what} {value!r} is not an ISO 8601 date and time (2026-12-01T00:00, with an offset or in the "
                "job's time zone)"
            ) from None
    if isinstance(value, dt.datetime):
        return to_ms(value if value.tzinfo is not None else value.replace(tzinfo=tz))
    raise ConfigError(f"{what} must be a date and time, not {value!r}")


@dataclass
class BackfillReport:
    """What a backfill did: the runs sent, those backfilled already (by an earlier backfill: not
    sent again), those whose send failed (not marked: asking again sends them)."""

    job: str
    since_ms: int
    until_ms: int
    sent: list[int] = field(default_factory=list)
    already: list[int] = field(default_factory=list)
    failed: list[tuple[int, str]] = field(default_factory=list)
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "since": from_ms(self.since_ms).isoformat(),
            "until": from_ms(self.until_ms).isoformat(),
            "dry_run": self.dry_run,
            "sent": self.sent,
            "already": self.already,
            "failed": [{"slot": slot, "error": error} for slot, error in self.failed],
        }


def backfill_runs(
    app: Any,
    backend: Any,
    job: Job,
    since_ms: int,
    until_ms: int,
    *,
    rate: float,
    dry_run: bool = False,
    sleep: Callable[[float], None] = time.sleep,
) -> BackfillReport:
    """Backfill ``job``'s runs of ``[since_ms, until_ms)`` on ``backend`` (opened), at ``rate``
    runs a second at most (see the module's text)."""
    store = backend.lease_store
    if store is None:
        raise ConfigError(f"backfill is not available: {claim_only(backend.title)}")
    now = clock.now_ms()
    if until_ms > now:
        raise ConfigError(
            f"job {job.name!r}: backfill sends past runs: until ({from_ms(until_ms).isoformat()}) is in the future"
        )
    if since_ms >= until_ms:
        raise ConfigError(f"job {job.name!r}: since must come before until")
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1_000:
        raise ConfigError(f"rate must be a number of runs a second, above 0 and at most 1000, not {rate!r}")
    slots = list(itertools.islice(job.schedule.slots(since_ms, until_ms), MAX_BACKFILL_RUNS + 1))
    if len(slots) > MAX_BACKFILL_RUNS:
        raise ConfigError(
            f"job {job.name!r}: more than {MAX_BACKFILL_RUNS} runs from {from_ms(since_ms).isoformat()} to "
            f"{from_ms(until_ms).isoformat()}: backfill a shorter range at a time"
        )
    report = BackfillReport(job.name, since_ms, until_ms, dry_run=dry_run)
    if dry_run:
        known = store.backfilled(job.name, slots)
        report.already = [slot for slot in slots if slot in known]
        report.sent = [slot for slot in slots if slot not in known]
        return report
    instance = instance_id()
    connection = task_connection(app)
    try:
        sender = TaskSender(app, connection, instance=instance)
        for slot in slots:
            started = time.monotonic()
            _backfill_one(backend, store, sender, job, slot, instance, report)
            sleep(max(0.0, 1 / rate - (time.monotonic() - started)))
    finally:
        connection.release()
    return report


def _backfill_one(
    backend: Any, store: Any, sender: TaskSender, job: Job, slot: int, instance: str, report: BackfillReport
) -> None:
    """Mark one run backfilled, send it (or take the mark back), and record it."""
    if not store.mark_backfilled(job.name, [slot], instance)[0]:
        report.already.append(slot)
        return
    task_id = backfill_task_id(backend.prefix, job.name, slot)
    now = clock.now_ms()
    run = Outgoing(job, slot, task_id, task_id, "backfill", now + max(job.max_late_ms, 10_000))
    error = sender.send([run])[0]
    if error is not None:
        if task_id in sender.written_at:  # written, with no confirm: the broker may have queued it
            report.failed.append((slot, f"{type(error).__name__}: {error} (it may have been sent: kept as backfilled)"))
            return
        store.unmark_backfilled(job.name, [slot])
        report.failed.append((slot, f"{type(error).__name__}: {error}"))
        return
    report.sent.append(slot)
    if job.history_size:
        event = encode_event(
            "sent",
            run=task_id,
            job=job.name,
            at_ms=clock.now_ms(),
            slot=slot,
            task_id=task_id,
            task=job.task,
            instance=instance,
            trigger="backfill",
        )
        backend.record(job.name, event, job.history_size)
