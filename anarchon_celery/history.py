"""Run history: the events of a run, their JSON form, and the fold of events into runs.

A run is written as small events keyed by its run id: ``sent`` by the beat that won it (or by
``run_now``), then ``running`` and ``succeeded`` or ``failed`` by the worker. Task arguments and
results are never recorded. A run whose worker died stays ``running``: nothing can tell it stopped.
Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["EVENTS", "Run", "decode_event", "encode_event", "fold"]

SCHEMA = 1
#: Events in the order a run goes through them.
EVENTS = ("sent", "running", "succeeded", "failed")
_RANK = {"sent": 0, "running": 1, "succeeded": 2, "failed": 2}
#: Error messages are cut to this many characters.
MAX_ERROR_CHARS = 500
#: Fields each event may carry besides its kind, run, job and time.
_FIELDS = {
    "sent": ("slot", "task_id", "task", "instance", "trigger"),
    "running": ("worker",),
    "succeeded": ("worker",),
    "failed": ("worker", "error_type", "error"),
}


def encode_event(event: str, *, run: str, job: str, at_ms: int, **fields: Any) -> bytes:
    """One event as compact JSON. Unknown fields are an error: nothing else is ever recorded."""
    if event not in _FIELDS:
        raise ValueError(f"unknown history event {event!r}")
    extra = set(fields) - set(_FIELDS[event])
    if extra:
        raise ValueError(f"history event {event!r} cannot carry {sorted(extra)}")
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
    status: str  # sent, running, succeeded or failed
    trigger: str | None  # "schedule" or "manual"; None when the sent event was trimmed away
    slot: int | None
    task_id: str | None
    task: str | None
    instance: str | None  # the beat (host:pid) that sent it
    worker: str | None
    sent_at_ms: int | None
    started_at_ms: int | None
    finished_at_ms: int | None
    error_type: str | None
    error: str | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def fold(events: Iterable[Mapping[str, Any]], limit: int | None = None) -> list[Run]:
    """Runs from their events (in stream order), newest first, at most ``limit`` of them.

    A run's status is its most advanced event; events of one run may arrive in any order.
    """
    runs: dict[str, dict[str, Any]] = {}
    for event in events:
        run = runs.setdefault(event["run"], {"run_id": event["run"], "job": event.get("job"), "rank": -1})
        kind = event["event"]
        if _RANK[kind] >= run["rank"]:
            run["rank"], run["status"] = _RANK[kind], kind
        if kind == "sent":
            run.update({k: event.get(k) for k in _FIELDS["sent"]}, sent_at_ms=event["at_ms"])
        elif kind == "running":
            run.setdefault("worker", event.get("worker"))
            run["started_at_ms"] = event["at_ms"]
        else:
            run["worker"] = event.get("worker", run.get("worker"))
            run["finished_at_ms"] = event["at_ms"]
            run["error_type"], run["error"] = event.get("error_type"), event.get("error")
        run.setdefault("first_ms", event["at_ms"])
        run["first_ms"] = min(run["first_ms"], event["at_ms"])
    ordered = sorted(runs.values(), key=lambda r: (r.get("sent_at_ms") or r["first_ms"], r["run_id"]), reverse=True)
    if limit is not None:
        ordered = ordered[: max(0, limit)]
    fields = Run.__dataclass_fields__
    return [Run(**{name: r.get(name) for name in fields}) for r in ordered]  # type: ignore[arg-type]
