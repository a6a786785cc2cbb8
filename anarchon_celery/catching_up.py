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

__all__ = ["ALL_CAP", "GapRuns", "runs_of_gap"]

#: ``catch_up="all"`` sends at most this many runs for one gap: the newest ones (Kubernetes
#: CronJobs stop at 100 missed runs too). The older ones are counted and recorded ``skipped``.
ALL_CAP = 100
#: Slots counted one by one at most, when counting the runs older than the window (a job every
#: second, away for a day, has 86,400): past it, the count says "at least".
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
    A :data:`~.backends.CATCH_UP` claim's own slot is one of the runs missed; a regular claim's
    slot is not (it is sent as any run)."""
    claim = gap.claim
    end = claim.slot + 1 if claim.kind == CATCH_UP else claim.slot
    start = gap.after + 1
    window_start = max(start, now_ms - job.catch_up_window_ms)
    missed = list(itertools.islice(job.schedule.slots(window_start, end), COUNT_CAP))
    too_old = sum(1 for _ in itertools.islice(job.schedule.slots(start, min(window_start, end)), COUNT_CAP))
    first_dropped = job.next_slot(start - 1) if too_old else None
    last_dropped = job.schedule.last_slot(start, min(window_start, end)) if too_old else None
    if not missed:
        return GapRuns(job.name, too_old=too_old, first_dropped=first_dropped, last_dropped=last_dropped)
    if job.catch_up == "latest":
        return GapRuns(job.name, [(missed[-1], len(missed))], too_old, 0, first_dropped, last_dropped)
    kept = missed[-ALL_CAP:]
    over_cap = len(missed) - len(kept)
    if over_cap:
        last_dropped = missed[over_cap - 1]
        first_dropped = first_dropped if first_dropped is not None else missed[0]
    return GapRuns(job.name, [(slot, 1) for slot in kept], too_old, over_cap, first_dropped, last_dropped)
