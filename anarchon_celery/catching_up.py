"""Catch-up: which runs a gap stands for, by a job's policy. Pure: no I/O.

A claim won on a store that moves a job's cursor up past slots nobody decided (every instance was
down, frozen, or cut off from the store meanwhile) leaves a gap (:class:`~.backends.Gap`), which
is its winner's alone. The runs missed are the job's slots inside it; those older than the job's
``catch_up_window_ms`` are not sent, and said so (counted, logged, and recorded ``skipped``).
``latest`` sends one run, for the newest slot missed, standing for all of them; ``all`` sends
one run per slot missed, in slot order, the newest :data:`ALL_CAP` at most.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from .backends.base import CATCH_UP, Gap
from .jobs import Job
from .schedule import Interval

__all__ = ["ALL_CAP", "COUNT_CAP", "GapRuns", "count_slots", "runs_of_gap"]

#: ``catch_up="all"`` sends at most this many runs for one gap: the newest ones (Kubernetes
#: CronJobs stop at 100 missed runs too). The older ones are counted and recorded ``skipped``.
ALL_CAP = 100
#: A cron schedule's slots counted one by one at most, when counting the runs of a gap (a cron job
#: every second, away for days): past it, the count stops there (an interval's is exact).
COUNT_CAP = 100_000


@dataclass(frozen=True)
class GapRuns:
    """The runs of catch-up of one gap: each slot to send with how many missed runs it stands
    for (in slot order; the gap's own claim first, when it is one of them), and the runs not
    sent: older than the window (``too_old``, from ``first_dropped``), or past the cap."""

    job: str
    send: list[tuple[int, int]] = field(default_factory=list)
    too_old: int = 0
    over_cap: int = 0
    first_dropped: int | None = None
    last_dropped: int | None = None

    @property
    def dropped(self) -> int:
        return self.too_old + self.over_cap


def runs_of_gap(job: Job, gap: Gap, now_ms: int) -> GapRuns:
    """The runs of ``gap`` to send, by ``job``'s policy, at ``now_ms`` (whose window bounds them).
    A :data:`~.backends.CATCH_UP` claim's own slot is one of the runs missed, and is always sent
    (the store let it be won inside the window); a regular claim's slot is not (it is sent as any
    run). The newest runs are found from the end of the gap, so a long gap costs no more than
    the runs sent and a count."""
    claim = gap.claim
    own = claim.kind == CATCH_UP
    end = claim.slot + 1 if own else claim.slot
    start = gap.after + 1
    window_start = max(start, now_ms - job.catch_up_window_ms)
    if own:
        window_start = min(window_start, claim.slot)
    wanted = 1 if job.catch_up == "latest" else ALL_CAP
    newest = _newest(job, window_start, end, wanted)
    missed = count_slots(job, window_start, end)
    too_old = count_slots(job, start, min(window_start, end))
    first_dropped = job.next_slot(start - 1) if too_old else None
    last_dropped = job.schedule.last_slot(start, min(window_start, end)) if too_old else None
    if not newest:
        return GapRuns(job.name, too_old=too_old, first_dropped=first_dropped, last_dropped=last_dropped)
    if job.catch_up == "latest":
        return GapRuns(job.name, [(newest[-1], missed)], too_old, 0, first_dropped, last_dropped)
    over_cap = missed - len(newest)
    if over_cap:
        last_dropped = job.schedule.last_slot(window_start, newest[0])
        first_dropped = first_dropped if first_dropped is not None else job.next_slot(window_start - 1)
    return GapRuns(job.name, [(slot, 1) for slot in newest], too_old, over_cap, first_dropped, last_dropped)


def _newest(job: Job, start: int, end: int, count: int) -> list[int]:
    """The newest ``count`` slots of ``job`` in ``[start, end)``, in slot order."""
    found: list[int] = []
    while len(found) < count:
        slot = job.schedule.last_slot(start, end)
        if slot is None:
            break
        found.append(slot)
        end = slot
    return found[::-1]


def count_slots(job: Job, start: int, end: int) -> int:
    """How many slots ``job`` has in ``[start, end)``: by arithmetic for an interval; counted one
    by one for a cron schedule, up to :data:`COUNT_CAP` (a cron job every second away for days)."""
    if end <= start:
        return 0
    schedule = job.schedule
    if isinstance(schedule, Interval):
        first = schedule.next_slot(start - 1)
        return 0 if first >= end else (end - 1 - first) // schedule.every_ms + 1
    return sum(1 for _ in itertools.islice(schedule.slots(start, end), COUNT_CAP))
