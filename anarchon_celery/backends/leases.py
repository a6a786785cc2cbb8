"""The lease of a run won on a store (SQLite, PostgreSQL; Redis's scripts do the same in Lua): pure,
so that each store only reads the run's record and writes what changed, in its own transaction,
on its own clock.

A run won is ``claimed`` by its winner, with fencing token 1 and a lease until ``lease_end_ms``.
Once its task is sent the winner marks it ``sent``; the worker that starts it marks it ``started``.
An instance that loses the claim of a run still ``claimed`` may be armed as one of its backups
(``rank`` 1, 2, … up to the number the job wants): it comes back when the lease ends, and if the
run is still only ``claimed``, before its deadline, takes it over: it becomes the holder, with
the next token and a new lease, and sends the same task. The worker runs a task only if its
message carries the run's current token and the run has not started (see :mod:`anarchon_celery.worker.start_check`), so
a first holder that was only slow and sends late causes no second execution.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CLAIMED", "SENT", "STARTED", "RunRecord", "arm", "hand_back", "mark_sent", "start", "take_over"]

CLAIMED, SENT, STARTED = "claimed", "sent", "started"


@dataclass(slots=True)
class RunRecord:
    """What the store keeps of a run won (times on the store's clock, epoch milliseconds)."""

    holder: str
    token: int
    state: str
    lease_end_ms: int
    deadline_ms: int | None
    backups: int = 0  # backups armed so far
    #: The cursor its win moved up from, when that left a gap (see :class:`.base.Gap`).
    gap_after: int | None = None


def arm(record: RunRecord | None, wanted: int, now_ms: int) -> tuple[int, int] | None:
    """Arm the loser of a claim as a backup of the run, if it still needs one: returns its rank
    (1 for the first) and the milliseconds left on the lease, or None."""
    if record is None or record.state != CLAIMED or record.backups >= wanted or not record.lease_end_ms:
        return None  # (a run won before leases, lease_end_ms 0, was sent without a token: left alone)
    if record.deadline_ms is not None and now_ms > record.deadline_ms:
        return None
    record.backups += 1
    return record.backups, max(0, record.lease_end_ms - now_ms)


def take_over(record: RunRecord | None, instance: str, now_ms: int, lease_ms: int) -> tuple[str, int]:
    """A backup's try at a run: ``("won", token)`` when it now holds the run; ``("held", ms)``
    while the lease runs (ms left); ``("done", 0)`` when it needs no backup (sent, started, or
    no record); ``("late", ms)`` past the run's deadline."""
    if record is None or record.state != CLAIMED or not record.lease_end_ms:
        return "done", 0  # (lease_end_ms 0: won before leases, by a winner whose task carries no token)
    if record.deadline_ms is not None and now_ms > record.deadline_ms:
        return "late", now_ms - record.deadline_ms
    if now_ms < record.lease_end_ms:
        if record.holder == instance:  # taken over by this instance: the answer was lost
            return "won", record.token
        return "held", record.lease_end_ms - now_ms
    record.holder = instance
    record.token += 1
    record.lease_end_ms = now_ms + lease_ms
    return "won", record.token


def mark_sent(record: RunRecord | None, token: int) -> bool:
    """The holder with ``token`` sent the task: True unless another holder took the run over."""
    if record is None or record.token != token:
        return False
    if record.state == CLAIMED:
        record.state = SENT
    return True


def start(record: RunRecord | None, token: int, redelivered: bool) -> bool | None:
    """May a task carrying ``token`` start? None when the run is not known (its record is gone):
    the caller decides. A message the broker delivers again (the worker that had it died) starts
    again; a second message with the same token (a send made again) does not."""
    if record is None:
        return None
    if record.token != token:
        return False
    if record.state == STARTED:
        return redelivered
    record.state = STARTED
    return True


def hand_back(record: RunRecord | None, instance: str, token: int, now_ms: int) -> bool:
    """The holder gives its lease up (it is stopping, or its send failed): the run's backups may
    take it over at once. True when it was given back."""
    if record is None or record.state != CLAIMED or record.holder != instance or record.token != token:
        return False
    record.lease_end_ms = min(record.lease_end_ms, now_ms)
    return True
