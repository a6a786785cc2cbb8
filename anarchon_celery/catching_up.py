"""Catch-up: which runs a gap stands for, by a job's policy (pure), and the step that claims and
hands them to the scheduler to send (:class:`CatchUps`).

A claim won on a store that moves a job's cursor up past slots nobody decided (every instance was
down, frozen, or cut off from the store meanwhile) leaves a gap (:class:`~.backends.Gap`), which
is its winner's alone. The runs missed are the job's slots inside it; those older than the job's
``catch_up_window_ms`` are not sent, and said so (counted, logged, and recorded ``skipped``).
``latest`` sends one run, for the newest slot missed, standing for all of them; ``all`` sends
one run per slot missed, in slot order, the newest :data:`ALL_CAP` at most.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from . import clock
from .backends.base import CATCH_UP, GAP, Backend, Claim, Gap, Outcome
from .history import encode_event
from .jobs import Job, task_id_for
from .pausing import PausedRuns
from .schedule import Interval
from .sending import Outgoing

__all__ = ["ALL_CAP", "COUNT_CAP", "CatchUps", "GapRuns", "count_slots", "runs_of_gap"]

logger = logging.getLogger(__name__)

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


class CatchUps:
    """The catch-up of one scheduler on a store: after each claim call, the gaps its wins left
    (:meth:`~.backends.LeaseStore.gaps`) are turned into runs by each job's policy, the runs
    inside them claimed (one call for all) and those won handed back to be sent, with trigger
    ``catch_up``; the runs not sent are logged, and recorded ``skipped`` (:meth:`skipped`)."""

    def __init__(self, jobs: Mapping[str, Job], instance: str, prefix: str) -> None:
        self.jobs = jobs
        self.instance = instance
        self.prefix = prefix
        self._skipped: list[tuple[str, bytes, int]] = []
        #: The runs of gaps decided while their job was paused (paused after the win that found
        #: the gap): logged and recorded as the scheduler's own claims' are.
        self._paused = PausedRuns(jobs, instance, prefix)

    def runs(
        self,
        backend: Backend,
        won: list[Claim],
        outgoing: Callable[[Claim, int, int, int], Outgoing],
        not_sent: Collection[tuple[str, int]] = (),
    ) -> list[Outgoing]:
        """The runs of catch-up to send now, made by ``outgoing(claim, now, token, coalesced)``.
        ``won``: the catch-up claims just won, each sent whether or not its gap was told (an
        answer lost with its connection is found won again, without its gap: then it stands for
        itself); ``not_sent``: the catch-up claims won while their job was busy (overlap), whose
        gaps are caught up all the same."""
        store = backend.lease_store
        gaps = store.gaps() if store is not None else []
        if not gaps and not won:
            return []
        now = clock.now_ms()
        told = {(gap.claim.job, gap.claim.slot) for gap in gaps}
        runs = [outgoing(claim, now, 1, 1) for claim in won if (claim.job, claim.slot) not in told]
        inside: list[tuple[Claim, int]] = []  # the gaps' runs to claim, with how many each stands for
        for gap in gaps:
            job = self.jobs[gap.claim.job]
            found = runs_of_gap(job, gap, now)
            self._not_caught_up(found, job)
            for slot, coalesced in found.send:
                if gap.claim.kind == CATCH_UP and slot == gap.claim.slot:  # won already
                    if (gap.claim.job, gap.claim.slot) not in not_sent:
                        runs.append(outgoing(gap.claim, now, 1, coalesced))
                else:
                    claim = Claim(  # (no backups armed)
                        job.name,
                        slot,
                        slot + job.catch_up_window_ms,
                        kind=GAP,
                        overlap=job.overlap,
                        queued_ms=job.overlap_queued_ms,
                    )
                    inside.append((claim, coalesced))
        if inside:
            outcomes = backend.claim([claim for claim, _ in inside], self.instance)
            self._paused.note([claim for claim, _ in inside], outcomes)
            for (claim, coalesced), outcome in zip(inside, outcomes):
                if outcome is Outcome.WON:
                    runs.append(outgoing(claim, now, 1, coalesced))
                elif outcome is not Outcome.LOST and outcome is not Outcome.PAUSED:
                    logger.warning(
                        "anarchon: job %r slot %d: a missed run not caught up, its claim was %s",
                        claim.job,
                        claim.slot,
                        outcome.value,
                    )
        runs.sort(key=lambda run: (run.job.name, run.slot))
        for name in sorted({run.job.name for run in runs}):
            slots = [run.slot for run in runs if run.job.name == name]
            logger.warning(
                "anarchon: job %r: catching up %d missed run(s) (catch_up %r), slots %d to %d",
                name,
                sum(run.coalesced for run in runs if run.job.name == name),
                self.jobs[name].catch_up,
                slots[0],
                slots[-1],
            )
        return runs

    def skipped(self) -> list[tuple[str, bytes, int]]:
        """The history events of the runs not caught up since the last call (``skipped``, and
        ``paused`` for those of a job paused meanwhile): ``(job, event, history_size)``, for
        :meth:`~.backends.Backend.record_many`."""
        events, self._skipped = self._skipped, []
        return events + self._paused.events()

    def _not_caught_up(self, found: GapRuns, job: Job) -> None:
        """Log and record (``skipped``) the missed runs of a gap that are not sent."""
        if not found.dropped or found.first_dropped is None or found.last_dropped is None:
            return
        reason = "catch_up_window" if found.too_old else "catch_up_cap"
        logger.warning(
            "anarchon: job %r: %d missed run(s), slots %d to %d, not caught up: %s",
            job.name,
            found.dropped,
            found.first_dropped,
            found.last_dropped,
            f"older than catch_up_window_ms ({job.catch_up_window_ms})"
            + (f", and {found.over_cap} past the cap of catch_up='all'" if found.over_cap else "")
            if found.too_old
            else "past the cap of catch_up='all'",
        )
        if job.history_size:
            event = encode_event(
                "skipped",
                run=task_id_for(self.prefix, job.name, found.last_dropped),
                job=job.name,
                at_ms=clock.now_ms(),
                slot=found.last_dropped,
                first_slot=found.first_dropped,
                count=found.dropped,
                instance=self.instance,
                reason=reason,
            )
            self._skipped.append((job.name, event, job.history_size))
