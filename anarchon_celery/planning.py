"""What a beat instance has to claim, and when: each job's next run, due at its slot plus this
instance's jitter (the runs found too late skipped, and said so), claims made again, the tries
of the runs it is a backup of, and the gates it declares ahead (``anarchon_lead_ms``)."""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Callable, Mapping

from . import clock
from .backends import Backend, Claim, Outcome
from .backends.base import CATCH_UP
from .errors import AnarchonError
from .holding import AWAY_RETRY_MS
from .jobs import Job, catch_up_key
from .runqueue import ClaimAgain, FirstClaim, Item, Prepare, RunQueue
from .schedule import Schedule

__all__ = ["Plan", "births_at_start"]

logger = logging.getLogger(__name__)


def _nothing(job: str) -> None:
    return None


def births_at_start(
    backend: Backend, jobs: Mapping[str, Job], made_at: Mapping[str, int], start: int, reachable: bool
) -> dict[str, int]:
    """When each job came to be, by every instance's word (see :meth:`.Backend.introduce`): this
    instance knew the jobs of its code from ``start`` and each runtime job from when it was made
    (``made_at``). Unknown (the backend away, or failing): from ``start``, so that a run from
    before a job existed is never sent; a run every instance missed during a deploy is then lost."""
    since = {name: min(made_at.get(name) or start, start) for name in jobs}
    if not reachable:
        return since
    try:
        return backend.introduce(since)
    except AnarchonError as exc:
        logger.warning(
            "anarchon: %s; the runs due before this start are not claimed (whether their job existed then "
            "is not known)",
            exc,
        )
        return since


class Plan:
    """The runs of ``jobs`` this instance claims on ``backend``, by when (:attr:`queue`), and the
    gates it declares ahead (:attr:`prepares`)."""

    def __init__(self, jobs: Mapping[str, Job], backend: Backend, lead_ms: int, rng: random.Random) -> None:
        self.jobs = jobs
        self.backend = backend
        self._random = rng
        #: The claims and backup tries to make, by when.
        self.queue: RunQueue[Item] = RunQueue()
        #: The gates to declare ahead, by when.
        self.prepares: RunQueue[Prepare] = RunQueue()
        self.lead_ms = lead_ms
        #: Told the job of each run this instance found too late and skipped (the metrics).
        self.on_too_late: Callable[[str], None] = _nothing
        #: Each job's catch-up key, carried by its claims ("" for a job without catch-up).
        self.keys = {name: catch_up_key(job) if backend.leases else "" for name, job in jobs.items()}
        #: Gates are declared ``lead_ms - prepare_phase_ms`` before their run (never earlier than
        #: ``lead_ms``): a phase of this instance that puts the declares of runs on whole seconds
        #: between a quarter and three quarters into a second, away from the claims.
        if lead_ms >= 1000:  # declared at slot - lead_ms + phase: (phase - lead_ms) mod 1000 into a second
            self.prepare_phase_ms = (lead_ms + rng.randint(250, 750)) % 1000
        else:  # too short a lead to reach the middle of a second: as far from the slot as it allows
            self.prepare_phase_ms = rng.randint(lead_ms // 4, lead_ms * 3 // 4)

    def start(self, now: int, births: Mapping[str, int]) -> None:
        """Queue each job's first run: from the runs still within their lateness, so that a run
        due while no instance was up (a deploy that stopped them all) is claimed like any late
        run, decided once as ever; but none from before the job came to be (``births``, see
        :func:`births_at_start`): a new job starts when it is first seen."""
        for job in self.jobs.values():
            born = births.get(job.name, now)
            self.push(job, job.next_slot(max(now - job.max_late_ms, born) - 1))
            if job.catch_up:  # the newest run already too late: won if no instance claimed it
                self._catch_up(job, now, now - job.max_late_ms, born)

    def _catch_up(self, job: Job, now: int, end: int, born: int | None = None) -> None:
        """Queue a catch-up claim of the job's newest slot before ``end`` inside its window (and
        not before ``born``): the store finds the gap, if any, from the job's cursor (see
        :mod:`.catching_up`)."""
        start = now - job.catch_up_window_ms
        newest = job.schedule.last_slot(start if born is None else max(start, born), end)
        if newest is not None:
            self.queue.push(ClaimAgain(now, job.name, newest, newest))

    def replan(self, changed: Mapping[str, Job | None], starts: Mapping[str, int], now: int) -> None:
        """Runtime jobs changed (``None``: gone): their queued claims, backup tries and declares
        are dropped, and each job still here is queued again by its schedule from its change on
        (``starts``: when each changed; a run due since is claimed if its lateness allows)."""
        self.queue.drop(set(changed))
        self.prepares.drop(set(changed))
        for name, job in changed.items():
            if job is None:
                self.keys.pop(name, None)
                continue
            self.keys[name] = catch_up_key(job) if self.backend.leases else ""
            self.push(job, job.next_slot(max(starts.get(name, now), now - job.max_late_ms) - 1))

    def push(self, job: Job, slot: int) -> None:
        jitter = self._random.randint(0, job.jitter_ms) if job.jitter_ms else 0
        self.queue.push(FirstClaim(slot + jitter, job.name, slot))
        if self.lead_ms:
            self.prepares.push(Prepare(slot + jitter - self.prepare_lead_ms, job.name, slot, slot + jitter))

    @property
    def prepare_lead_ms(self) -> int:
        """How long before its claim a run's gate is declared."""
        return self.lead_ms - self.prepare_phase_ms

    def prepares_due(self, now: int, limit: int) -> list[Claim]:
        """The runs whose gates are due to be declared ahead (``limit`` at most); a run whose
        claim is already due is left to the claim."""
        return [Claim(item.job, item.slot) for item in self.prepares.take(now, limit) if item.claim_ms > now]

    def queue_next(self, taken: list[tuple[Item, int]]) -> None:
        """Queue the next run of each job whose first claim was taken off the queue (at the time
        given with it)."""
        known: dict[tuple[Schedule, int], int] = {}  # worked out once per schedule and slot
        for item, now in taken:
            if isinstance(item, FirstClaim):  # a claim made again or a backup: queued the first time
                self._schedule_after(self.jobs[item.job], item.slot, now, known)

    def claim_of(self, item: FirstClaim | ClaimAgain, now: int) -> Claim | None:
        """The claim of a run due, or None when it is found too late (logged). For a job that
        catches up, a run too late is claimed for catch-up when it is the newest one too late
        and inside the window; the store says whether it was missed (see :mod:`.catching_up`)."""
        job = self.jobs[item.job]
        # Lateness counts from this instance's planned claim (slot + its jitter), so the last
        # claim of a slot is at most jitter_ms + max_late_ms after it: the safety rule.
        late = now - item.planned_ms
        kind = ""
        if late > job.max_late_ms:
            if not job.catch_up:
                logger.log(
                    self._skip_level(job.name, item.slot, item.slot + 1),
                    "anarchon: job %r slot %d: found %d ms late (max_late_ms %d); skipped, runs are not caught up",
                    job.name,
                    item.slot,
                    late,
                    job.max_late_ms,
                )
                self.on_too_late(job.name)
                return None
            if item.slot < now - job.catch_up_window_ms or job.next_slot(item.slot) + job.max_late_ms < now:
                # Not the newest run too late: the claim of the newest catches it up, within the window.
                logger.debug("anarchon: job %r slot %d: found %d ms late; left to catch-up", job.name, item.slot, late)
                return None
            kind = CATCH_UP
        # A catch-up claim may be made until its window ends; any other, until its lateness does.
        deadline = item.slot + job.catch_up_window_ms if kind else item.planned_ms + job.max_late_ms
        return Claim(
            job.name,
            item.slot,
            deadline_ms=deadline,
            backups=job.backup_runners,
            key=self.keys[job.name],
            kind=kind,
            overlap=job.overlap if self.backend.leases else "",
            queued_ms=job.overlap_queued_ms,
            version=job.version,
        )

    def claim_again(self, claim: Claim, outcome: Outcome = Outcome.AWAY) -> None:
        """Queue the claim of a run again, a moment later, if its deadline allows: it is away (its
        gate's node is down, or the store cannot be reached: once they are back, they still say
        whether anyone won the run), or the store's clock says it is not due yet (this instance's
        clock is ahead)."""
        job = self.jobs[claim.job]
        deadline = claim.deadline_ms if claim.deadline_ms is not None else clock.now_ms()
        # (a catch-up claim's deadline is the end of its window: it stays a catch-up claim)
        planned = claim.slot if claim.kind == CATCH_UP else deadline - job.max_late_ms
        again = clock.now_ms() + AWAY_RETRY_MS
        away = outcome is Outcome.AWAY
        backend = self.backend
        away_now, away_still = backend.away_text
        why = away_now if away else "the store's clock says it is not due yet"
        if again > deadline:
            level = logging.WARNING
            if away and backend.in_outage():
                backend.missed(claim.job, [claim.slot])  # told with the others when the outage ends
                level = logging.DEBUG
            logger.log(
                level,
                "anarchon: job %r slot %d: %s until the run's deadline (max_late_ms %d); not run by this instance",
                claim.job,
                claim.slot,
                away_still
                if away
                else "the store's clock said it was not due (this host's clock is ahead: check its time sync)",
                job.max_late_ms,
            )
            return
        logger.debug(
            "anarchon: job %r slot %d: %s; claiming it again in %d ms", claim.job, claim.slot, why, AWAY_RETRY_MS
        )
        self.queue.push(ClaimAgain(again, claim.job, claim.slot, planned))

    def _skip_level(self, job: str, first: int, end: int, schedule: Schedule | None = None) -> int:
        """The log level of runs of ``job`` skipped as too late (the slots in ``[first, end)`` of
        ``schedule``, or the one at ``first``): debug during an outage, which the backend reports
        with the runs missed (these named in) when it ends."""
        backend = self.backend
        if not backend.in_outage():
            return logging.WARNING
        if schedule is None:
            backend.missed(job, [first])
        else:
            backend.missed(job, list(itertools.islice(schedule.slots(first, end), 10_000)))  # cheap: a cap
        return logging.DEBUG

    def _schedule_after(self, job: Job, slot: int, now: int, known: dict[tuple[Schedule, int], int]) -> None:
        """Queue the job's next run; runs already too late to claim are skipped at once. ``known``
        holds the next slots already worked out, by schedule and slot."""
        following = known.get((job.schedule, slot))
        if following is None:
            following = known[job.schedule, slot] = job.next_slot(slot)
        if following + job.max_late_ms < now and job.catch_up:
            resume = job.next_slot(now - job.max_late_ms - 1)
            logger.info(
                "anarchon: job %r: runs from slot %d on are more than max_late_ms (%d) late; catching up (%s)",
                job.name,
                following,
                job.max_late_ms,
                job.catch_up,
            )
            self._catch_up(job, now, resume)
            following = resume
        elif following + job.max_late_ms < now:
            resume = job.next_slot(now - job.max_late_ms - 1)
            logger.log(
                self._skip_level(job.name, following, resume, job.schedule),
                "anarchon: job %r: runs from slot %d up to slot %d are more than max_late_ms "
                "(%d) late; skipped, runs are not caught up",
                job.name,
                following,
                resume,
                job.max_late_ms,
            )
            following = resume
        self.push(job, following)
