"""Run history: the events of a run, their JSON form, and the fold of events into runs.

A run is written as small events keyed by its run id: ``sent`` by the beat that won it (or by
``run_now``), then ``running`` and ``succeeded`` or ``failed`` by the worker. Task arguments and
results are never recorded.

Three more kinds tell of runs that went otherwise:

* ``unsent`` (from the beat): the run was won but its task could not be sent, with the error. A
  task written but not confirmed may still arrive and run, so a later ``running`` supersedes it.
* ``revoked`` (from the worker, Celery's ``task_revoked``): the task was discarded or stopped, with
  a ``reason``: ``revoked`` (by id, before it ran), ``expired`` (its ``expires`` had passed when a
  worker got it) or ``terminated`` (stopped while running; ``error`` then names the signal). A task
  the broker dropped unseen (a message TTL) leaves no such event: its run stays ``sent``.
* ``abandoned`` (from the worker's main process): the pool process running the task died (Celery's
  ``WorkerLostError``, with ``error`` saying how), and the run will not be run again: its message
  was not put back in the queue. A run whose whole worker died (nothing left to tell) still stays
  ``running``.

* ``skipped`` (from the beat): runs missed while no instance could claim them, which the job's
  catch-up policy does not send: older than its window (reason ``catch_up_window``) or past the
  cap of ``all`` (``catch_up_cap``). One record stands for ``count`` runs, from ``first_slot`` to
  ``slot``. And a run of a job protected from overlap that was due while the job's last run was
  busy (reason ``overlap``; ``overlap_buffer_full`` past the cap of ``buffer_all``), from the beat
  that won it, or from the worker whose start check refused it (with ``worker``).
* ``pending`` (from the beat, or a worker's start check): a run of a job under ``buffer_one`` or
  ``buffer_all`` due while its last run was busy, kept to be sent once it ends (with trigger
  ``buffered``); its ``sent`` event follows.
* ``abandoned`` is also written by whoever finds that a worker stopped renewing its hold on a job
  protected from overlap (``error_type`` ``LeaseExpired``): its whole worker died.
* ``paused`` (from the beat that decided it): a run due while its job was paused, not sent.

A run's ``status`` is the kind of its most advanced event: ``sent`` or ``unsent`` (rank 0), then
``running`` (1), then ``succeeded``, ``failed``, ``revoked``, ``abandoned``, ``skipped`` or
``paused`` (2, final); between two events of one rank, the later one in the stream counts.
``Run.reason`` is a revoked run's reason (so an expired task is status ``revoked``, reason
``expired``), None for any other status; ``error_type`` and ``error`` are those of a ``failed``,
``revoked``, ``abandoned`` or ``unsent`` status.

Version 1 of the JSON form gained ``unsent``, ``revoked``, ``abandoned``, ``skipped``, ``pending``
and ``paused``; a reader that predates them skips them, as it skips anything not of ours. Pure: no
I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["EVENTS", "REVOKE_REASONS", "SKIP_REASONS", "Run", "decode_event", "encode_event", "fold"]

SCHEMA = 1
#: Every kind of event, roughly in the order a run goes through them.
EVENTS = ("pending", "sent", "unsent", "skipped", "paused", "running", "succeeded", "failed", "revoked", "abandoned")
#: The most events one run gets (not counting an event written twice): sent or unsent, running,
#: and a final one.
EVENTS_PER_RUN = 3
#: Why a task was revoked: the ``reason`` of a ``revoked`` event.
REVOKE_REASONS = ("revoked", "expired", "terminated")
#: Why runs were not sent: the ``reason`` of a ``skipped`` event.
SKIP_REASONS = ("catch_up_window", "catch_up_cap", "overlap", "overlap_buffer_full")
_RANK = {
    "pending": -1,
    "sent": 0,
    "unsent": 0,
    "skipped": 2,
    "paused": 2,
    "running": 1,
    "succeeded": 2,
    "failed": 2,
    "revoked": 2,
    "abandoned": 2,
}
#: Error messages are cut to this many characters.
MAX_ERROR_CHARS = 500
#: Fields each event may carry besides its kind, run, job and time.
_SENT_FIELDS = ("slot", "task_id", "task", "instance", "trigger", "coalesced")
_FIELDS = {
    "sent": _SENT_FIELDS,
    "unsent": (*_SENT_FIELDS, "error_type", "error"),
    "skipped": ("slot", "instance", "reason", "count", "first_slot", "worker"),
    "pending": ("slot", "instance", "worker"),
    "paused": ("slot", "instance"),
    "running": ("worker", "instance"),  # the instance whose message started it
    "succeeded": ("worker",),
    "failed": ("worker", "error_type", "error"),
    "revoked": ("worker", "reason", "error"),
    "abandoned": ("worker", "error_type", "error"),
}


def encode_event(event: str, *, run: str, job: str, at_ms: int, **fields: Any) -> bytes:
    """One event as compact JSON. Unknown fields are an error: nothing else is ever recorded."""
    if event not in _FIELDS:
        raise ValueError(f"unknown history event {event!r}")
    extra = set(fields) - set(_FIELDS[event])
    if extra:
        raise ValueError(f"history event {event!r} cannot carry {sorted(extra)}")
    if event == "revoked" and fields.get("reason") not in REVOKE_REASONS:
        raise ValueError(f"a revoked event's reason is one of {list(REVOKE_REASONS)}, not {fields.get('reason')!r}")
    if event == "skipped" and fields.get("reason") not in SKIP_REASONS:
        raise ValueError(f"a skipped event's reason is one of {list(SKIP_REASONS)}, not {fields.get('reason')!r}")
    if "error" in fields and fields["error"] is not None:
        fields["error"] = str(fields["error"])[:MAX_ERROR_CHARS]
    record = {"v": SCHEMA, "event": event, "run": run, "job": job, "at_ms": at_ms}
    record.update({k: v for k, v in fields.items() if v is not None})
    return json.dumps(record, separators=(",", ":")).encode()


def decode_event(body: bytes | str) -> dict[str, Any] | None:
    """An event from its JSON form; None for anything that is not one of ours."""
    try:
        record = json.loads(body)
    except (ValueError, TypeError):
        return None
    if (
        not isinstance(record, dict)
        or record.get("v") != SCHEMA
        or record.get("event") not in _FIELDS
        or not isinstance(record.get("run"), str)
        or not isinstance(record.get("at_ms"), int)
    ):
        return None
    return record


@dataclass(frozen=True)
class Run:
    """One run of a job, folded from its events."""

    run_id: str
    job: str
    status: str  # sent, unsent, skipped, paused, running, succeeded, failed, revoked or abandoned
    trigger: str | None  # schedule, catch_up, backfill or manual; None when the sent event was trimmed away
    slot: int | None
    task_id: str | None
    task: str | None
    instance: str | None  # the beat (host:pid) whose message started it; before it starts, that sent it
    worker: str | None
    sent_at_ms: int | None  # when that instance's message was written
    started_at_ms: int | None
    finished_at_ms: int | None  # when it succeeded, failed, was revoked or abandoned
    error_type: str | None
    error: str | None
    reason: str | None = None  # a revoked run's: revoked, expired or terminated; a skipped one's
    #: A run of catch-up: how many missed runs it stands for; of a ``skipped`` record: how many
    #: runs were not sent (its slot is the newest of them).
    coalesced: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _apply(run: dict[str, Any], event: Mapping[str, Any]) -> None:
    """Fold one event into what is known of its run."""
    kind = event["event"]
    rank = _rank(event)
    leads = rank >= run["rank"]  # the run's status now, as far as the events so far tell
    if leads and not (kind == "pending" and run["rank"] >= 0):
        run["rank"], run["status"] = rank, kind
    if kind in ("sent", "unsent"):
        _apply_sent(run, event)
        if kind == "sent":
            run["sent_at_ms"] = event["at_ms"]
            run.setdefault("sent_by", {})[event.get("instance")] = event["at_ms"]
        else:
            run["unsent_error"] = event.get("error_type"), event.get("error")
    elif kind == "skipped":
        _apply_skipped(run, event)
    elif kind == "pending":  # won while its job was busy: sent once it is free
        _fill(run, event, ("slot", "instance"))
    elif kind == "paused":  # due while its job was paused: not sent
        _fill(run, event, ("slot", "instance"))
        run["finished_at_ms"] = event["at_ms"]
    elif kind == "running":
        if run.get("worker") is None:  # a final event's worker, if any, counts
            run["worker"] = event.get("worker")
        run["started_at_ms"] = event["at_ms"]
        if event.get("instance"):
            run["started_by"] = event["instance"]
    elif leads:  # a final event, unless a more telling one came (see _rank)
        if event.get("worker") is not None:
            run["worker"] = event["worker"]
        run["finished_at_ms"] = event["at_ms"]
        run["error_type"], run["error"] = event.get("error_type"), event.get("error")
        run["reason"] = event.get("reason")
    run["first_ms"] = min(run.get("first_ms", event["at_ms"]), event["at_ms"])


def _rank(event: Mapping[str, Any]) -> float:
    """How advanced an event is. An ``abandoned`` written by whoever found a worker's hold run
    out (``LeaseExpired``) ranks below the worker's own final events: a worker that only stalled
    may still tell how its run ended."""
    if event["event"] == "abandoned" and event.get("error_type") == "LeaseExpired":
        return 1.5
    return _RANK[event["event"]]


def _apply_sent(run: dict[str, Any], event: Mapping[str, Any]) -> None:
    for key in _SENT_FIELDS:  # (a field it lacks leaves the one known)
        if event.get(key) is not None or key not in run:
            run[key] = event.get(key)


def _fill(run: dict[str, Any], event: Mapping[str, Any], keys: tuple[str, ...]) -> None:
    """Set the fields of ``keys`` the run does not know yet (those of its sent event count)."""
    for key in keys:
        if run.get(key) is None:
            run[key] = event.get(key)


def _apply_skipped(run: dict[str, Any], event: Mapping[str, Any]) -> None:
    """Runs not sent (or not started), for a reason: missed ones (catch-up) stand for others."""
    reason = event.get("reason")
    if str(reason).startswith("catch_up"):  # runs missed: the newest of them, standing for the others
        run.update(trigger="catch_up")
        run["coalesced"] = event.get("count")
    _fill(run, event, ("slot", "instance", "worker"))
    run["reason"] = reason
    run["finished_at_ms"] = event["at_ms"]


def fold(events: Iterable[Mapping[str, Any]], limit: int | None = None) -> list[Run]:
    """Runs from their events (in stream order), newest first, at most ``limit`` of them.

    A run's status is its most advanced event; events of one run may arrive in any order, and
    an event written twice counts once.
    """
    runs: dict[str, dict[str, Any]] = {}
    for event in events:
        run = runs.setdefault(event["run"], {"run_id": event["run"], "job": event.get("job"), "rank": -1})
        _apply(run, event)
    for run in runs.values():
        starter = run.get("started_by")
        if starter is not None:  # sent twice (a takeover): the message that started the run counts
            run["instance"] = starter
            run["sent_at_ms"] = run.get("sent_by", {}).get(starter, run.get("sent_at_ms"))
        if run["status"] == "unsent":  # why it was not sent (once it ran, that no longer matters)
            run["error_type"], run["error"] = run["unsent_error"]
    ordered = sorted(runs.values(), key=lambda r: (r.get("sent_at_ms") or r["first_ms"], r["run_id"]), reverse=True)
    if limit is not None:
        ordered = ordered[: max(0, limit)]
    fields = Run.__dataclass_fields__
    return [Run(**{name: r.get(name) for name in fields}) for r in ordered]  # type: ignore[arg-type]
