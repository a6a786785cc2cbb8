"""What the backends on a store with a cursor per job (Redis, PostgreSQL, SQLite) share: the claim
loop around a store's own decision (see :mod:`.ordered`), and how an outage of the store is told.

A store answers each claim on its own clock. A claim a little early (at most
:data:`EARLY_WAIT_MS`) waits for its slot and is made again inside the same call; one further
ahead is EARLY, for the scheduler to make again later. When the store's answer may have been lost
with its connection, the claims are made once more on a new one, saying so: the store then counts
a run that this instance holds already as won (the first answer's win), never as lost.

When the store cannot be reached (or refuses), the claims are AWAY: the scheduler makes them
again every second until their deadline, since the store still decides each run once, atomically,
when it is back. A claim whose answer may have been lost is made again with the same recovery, so
a run this instance won unknowingly is found won, not lost.
"""

from __future__ import annotations

import abc
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

from .. import clock
from ..errors import BrokerUnavailable, ConfigError
from ..jobs import Job, backups_never_act
from .base import (
    Armed,
    Backend,
    Claim,
    Finding,
    Gap,
    JobState,
    LeaseStore,
    Outcome,
    Overlapped,
    Start,
    Takeover,
    TakeoverKind,
    check_prefix,
    check_slot_ttl,
)
from .busy import Freed
from .definitions import JobDef
from .outages import Outages
from .pauses import Pause

__all__ = ["DEFAULT_LEASE_MS", "EARLY_WAIT_MS", "Answer", "StoreBackend", "check_lease"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: A claim found early by at most this much on the store's clock waits for its slot in the claim.
EARLY_WAIT_MS = 1_000
#: How long a winner holds a run before its backups may take it over, by default.
DEFAULT_LEASE_MS = 5_000
#: How long a worker holds a job protected from overlap between two heartbeats, by default.
DEFAULT_BUSY_LEASE_MS = 30_000


def check_lease(lease_ms: object) -> int:
    """A valid lease_ms, or ConfigError."""
    if isinstance(lease_ms, bool) or not isinstance(lease_ms, int) or not 100 <= lease_ms <= 3_600_000:
        raise ConfigError(f"lease_ms must be an integer from 100 to 3600000 (milliseconds), not {lease_ms!r}")
    return lease_ms


class Answer(NamedTuple):
    """The store's answer to one claim: its outcome, with the milliseconds it is early by
    (EARLY) or late by (UNDECIDED); a loser armed as a backup has its ``rank`` and the
    milliseconds left on the winner's lease in ``amount``."""

    outcome: Outcome
    amount: int = 0
    rank: int = 0
    #: A win that left a gap: the cursor it moved up from (see :class:`.base.Gap`).
    after: int | None = None
    #: A win not sent, its job busy: ``skipped``, ``pending`` or ``dropped`` (see :mod:`.busy`).
    verdict: str = ""


_Store = TypeVar("_Store", bound="StoreBackend")

#: ``celery anarchon check`` warns when this host's clock is further than this off the store's.
CLOCK_WARNING_MS = 1_000


class StoreBackend(Backend, LeaseStore, JobState):
    """A backend whose store decides each job's runs in slot order behind a cursor."""

    forgets_runs = False
    leases = True
    #: How the store's clock is named in logs ("Redis's clock").
    clock_name = "the store's clock"
    away_text = ("the store cannot be reached", "the store could not be reached")
    #: Errors after which the answer to a claim may have been lost: made again once, recovering.
    answer_lost_errors: tuple[type[BaseException], ...] = ()
    #: Errors that leave the claims undecided (the store is unreachable, or refused).
    failure_errors: tuple[type[BaseException], ...] = ()
    #: Seconds between two reminders that an outage goes on.
    outage_reminder_s = 60.0

    def __init__(self, prefix: str, slot_ttl_ms: int, timeout: float, lease_ms: int = DEFAULT_LEASE_MS) -> None:
        self.prefix = check_prefix(prefix)
        self.slot_ttl_ms = check_slot_ttl(slot_ttl_ms)
        self.lease_ms = check_lease(lease_ms)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ConfigError(f"timeout must be a positive number of seconds, not {timeout!r}")
        self.timeout = float(timeout)
        self._outages = Outages(
            self.describe, lambda: (*self.answer_lost_errors, *self.failure_errors), lambda: self.outage_reminder_s
        )
        self._armed: list[Armed] = []
        self._gaps: list[Gap] = []
        self._overlapped: list[Overlapped] = []
        self._freed: list[tuple[str, Freed]] = []
        #: Runs whose claim's answer may have been lost with every try: made again (by the
        #: scheduler, as AWAY), they are asked with recovery, which finds a win of this instance.
        self._in_doubt: set[tuple[str, int]] = set()

    @abc.abstractmethod
    def _decide(self, claims: Sequence[Claim], instance: str, recover: Collection[tuple[str, int]]) -> list[Answer]:
        """Decide the claims in one atomic step of the store (see :class:`Answer`). A win holds
        the run for ``lease_ms``; a loser of a run still only claimed is armed as a backup while
        the claim wants more (``Claim.backups``). A run ``(job, slot)`` in ``recover`` already
        decided that ``instance`` holds is WON (the answer of an earlier try was lost), with the
        gap its win left, which the run's record keeps."""

    @abc.abstractmethod
    def _take_over(self, claims: Sequence[Claim], instance: str) -> list[tuple[str, int]]:
        """:func:`.leases.take_over` for each claim's run, in one atomic step of the store."""

    @abc.abstractmethod
    def _mark_sent(self, runs: Sequence[tuple[str, int, int]]) -> list[bool]:
        """:func:`.leases.mark_sent` for each ``(job, slot, token)``, in one atomic step."""

    @abc.abstractmethod
    def _start(self, job: str, slot: int, token: int, redelivered: bool, run: str, worker: str, lease_ms: int) -> Start:
        """:func:`.leases.start` (for a ``token``), then :func:`.busy.start` (for a job
        protected from overlap), in one atomic step: a run refused by either is not marked."""

    @abc.abstractmethod
    def _renew_busy(self, runs: Sequence[tuple[str, int, str]], lease_ms: int) -> list[str | None]:
        """:func:`.busy.renew` for each run, in one atomic step."""

    @abc.abstractmethod
    def _end_busy(self, job: str, slot: int, holder: str, retrying: bool) -> bool:
        """:func:`.busy.end` (or :func:`.busy.retrying`), in one atomic step."""

    @abc.abstractmethod
    def _next_pending(
        self, jobs: Sequence[str], instance: str, deadline_ms: Mapping[str, int]
    ) -> tuple[list[tuple[str, int, int]], list[tuple[str, Freed]]]:
        """:func:`.busy.next_pending` for each job, in one atomic step: each run taken is held by
        ``instance`` (its record made, or its token moved up, with a lease), with the runs freed."""

    @abc.abstractmethod
    def _hand_back(self, runs: Sequence[tuple[str, int, int]], instance: str) -> int:
        """:func:`.leases.hand_back` for each ``(job, slot, token)``; returns how many."""

    @abc.abstractmethod
    def store_now_ms(self) -> int:
        """The store's clock, in epoch milliseconds."""

    @abc.abstractmethod
    def store_version(self) -> str:
        """What the store is (name and version), for ``check``."""

    def claim(
        self, claims: Sequence[Claim], instance: str, *, on_won: Callable[[Claim], None] | None = None
    ) -> list[Outcome]:
        outcomes: dict[int, Outcome] = {}
        todo = list(range(len(claims)))
        keys = [(claim.job, claim.slot) for claim in claims]
        self._forget_doubts()
        # Only the runs whose answer was lost are asked with recovery: a run this instance holds
        # otherwise (won inside a gap since) is lost to a claim of it, never won twice.
        recover = {key for key in keys if key in self._in_doubt}
        waited = failed = again = False
        while todo:
            try:
                with self._outages.asking():
                    answers = self._decide([claims[i] for i in todo], instance, recover)
            except self.answer_lost_errors as exc:
                self._in_doubt.update(keys[i] for i in todo)
                recover.update(keys[i] for i in todo)
                if not again:  # once more, on a new connection: a win whose answer was lost is found
                    again = True
                    logger.log(
                        logging.DEBUG if self.in_outage() else logging.INFO,  # (the outage is told)
                        "anarchon: claiming again on a new connection to %s (%s)",
                        self.describe(),
                        exc,
                    )
                    continue
                self._failed("decide claims", exc)
                failed = True
                break
            except self.failure_errors as exc:
                self._failed("decide claims", exc)
                failed = True
                break
            self._recovered()
            self._in_doubt.difference_update(keys[i] for i in todo)
            soon: list[tuple[int, int]] = []  # a little early: claimed again at their slot
            for i, answer in zip(todo, answers):
                if answer.outcome is Outcome.EARLY and not waited and answer.amount <= EARLY_WAIT_MS:
                    soon.append((i, answer.amount))
                    continue
                outcomes[i] = answer.outcome
                self._answered(claims[i], answer, on_won)
            if not soon:
                break
            time.sleep(max(amount for _, amount in soon) / 1000)
            waited = True
            todo = [i for i, _ in soon]
        self._after_claims()
        # Not decided for want of the store: claimed again until their deadline (see the module).
        left = Outcome.AWAY if failed else Outcome.UNDECIDED
        return [outcomes.get(i, left) for i in range(len(claims))]

    def _answered(self, claim: Claim, answer: Answer, on_won: Callable[[Claim], None] | None) -> None:
        """Note a claim's final answer: a backup armed, a gap left, a deadline passed, a win, a
        win not sent (its job busy)."""
        outcome, amount, rank, after, verdict = answer
        if verdict:
            self._overlapped.append(Overlapped(claim, verdict))
        if rank:
            self._armed.append(Armed(claim, rank, amount))
        if after is not None and (outcome is Outcome.WON or verdict):  # (won, even if not sent)
            self._gaps.append(Gap(claim, after))
        if outcome is Outcome.UNDECIDED:
            logger.warning(
                "anarchon: job %r slot %d: past its deadline by %d ms on %s; not run by this instance",
                claim.job,
                claim.slot,
                amount,
                self.clock_name,
            )
        elif outcome is Outcome.WON and on_won is not None:
            try:
                on_won(claim)
            except Exception:  # the run is won all the same
                logger.exception("anarchon: job %r slot %d: on_won failed", claim.job, claim.slot)

    def _forget_doubts(self) -> None:
        """Drop the doubts about runs older than any claim of them can be (``slot_ttl_ms``)."""
        if self._in_doubt:
            oldest = clock.now_ms() - self.slot_ttl_ms
            self._in_doubt = {key for key in self._in_doubt if key[1] >= oldest}

    # -- leases ---------------------------------------------------------------------------------

    def armed(self) -> list[Armed]:
        armed, self._armed = self._armed, []
        return armed

    def gaps(self) -> list[Gap]:
        gaps, self._gaps = self._gaps, []
        return gaps

    def take_over(self, claims: Sequence[Claim], instance: str) -> list[Takeover]:
        if not claims:
            return []
        try:
            # Made again on a new connection when the answer was lost: a takeover this instance
            # made already is found held by it, and answered "won" with its token.
            answers = self._again_on_a_new_connection(lambda: self._take_over(claims, instance))
        except (*self.answer_lost_errors, *self.failure_errors) as exc:
            self._failed("take runs over", exc)
            return [Takeover(TakeoverKind.UNDECIDED)] * len(claims)
        self._recovered()
        return [Takeover(TakeoverKind(kind), value) for kind, value in answers]

    def mark_sent(self, runs: Sequence[tuple[str, int, int]], instance: str) -> list[bool | None]:
        if not runs:
            return []
        try:
            return list(self._again_on_a_new_connection(lambda: self._mark_sent(runs)))
        except (*self.answer_lost_errors, *self.failure_errors) as exc:
            logger.info(
                "anarchon: %d run(s) sent but not marked sent in %s (%s); told again until it answers",
                len(runs),
                self.describe(),
                exc,
            )
            return [None] * len(runs)

    def _again_on_a_new_connection(self, step: Callable[[], T]) -> T:
        """``step``, made once more (on a new connection) when its connection failed: for the steps
        that may be made twice (taking over, marking sent, handing back)."""
        with self._outages.asking():
            try:
                return step()
            except self.answer_lost_errors:
                return step()

    def overlapped(self) -> list[Overlapped]:
        overlapped, self._overlapped = self._overlapped, []
        return overlapped

    def freed(self) -> list[tuple[str, Freed]]:
        freed, self._freed = self._freed, []
        return freed

    def start_run(
        self, job: str, slot: int, token: int, redelivered: bool, *, run: str = "", worker: str = "", lease_ms: int = 0
    ) -> Start:
        return self._start(job, slot, token, redelivered, run, worker, lease_ms or DEFAULT_BUSY_LEASE_MS)

    def renew_busy(self, runs: Sequence[tuple[str, int, str]], lease_ms: int) -> list[str | None]:
        return self._renew_busy(runs, lease_ms) if runs else []

    def end_busy(self, job: str, slot: int, holder: str, *, retrying: bool = False) -> bool:
        return self._end_busy(job, slot, holder, retrying)

    def next_pending(
        self, jobs: Sequence[str], instance: str, deadline_ms: Mapping[str, int]
    ) -> list[tuple[str, int, int]]:
        if not jobs:
            return []
        try:
            with self._outages.asking("look for pending runs"):
                taken, freed = self._next_pending(
                    jobs, instance, deadline_ms
                )  # (once: a run taken whose answer was lost holds its job for a lease, then the next one goes)
        except (*self.answer_lost_errors, *self.failure_errors) as exc:
            logger.debug("anarchon: pending runs not looked for in %s (%s)", self.describe(), exc)
            return []
        self._freed += freed
        return taken

    def hand_back(self, runs: Sequence[tuple[str, int, int]], instance: str) -> int:
        if not runs:
            return 0
        try:
            return self._again_on_a_new_connection(lambda: self._hand_back(runs, instance))
        except (*self.answer_lost_errors, *self.failure_errors) as exc:
            logger.info(
                "anarchon: %d lease(s) not handed back in %s (%s); they run out by themselves",
                len(runs),
                self.describe(),
                exc,
            )
            return 0

    def mark_backfilled(self, job: str, slots: Sequence[int], instance: str) -> list[bool]:
        return self._backfill_step("mark runs backfilled", lambda: self._mark_backfilled(job, slots, instance))

    def unmark_backfilled(self, job: str, slots: Sequence[int]) -> None:
        self._backfill_step("take back marks of runs backfilled", lambda: self._unmark_backfilled(job, slots))

    def backfilled(self, job: str, slots: Sequence[int]) -> set[int]:
        return self._backfill_step("read the runs backfilled", lambda: self._backfilled(job, slots))

    def _backfill_step(self, what: str, step: Callable[[], T]) -> T:
        try:
            return step()
        except (*self.answer_lost_errors, *self.failure_errors) as exc:
            raise BrokerUnavailable(f"{self.describe()} cannot {what}: {type(exc).__name__}: {exc}") from exc

    @abc.abstractmethod
    def _mark_backfilled(self, job: str, slots: Sequence[int], instance: str) -> list[bool]:
        """See :meth:`mark_backfilled`; one atomic step, which may raise the store's errors."""

    @abc.abstractmethod
    def _unmark_backfilled(self, job: str, slots: Sequence[int]) -> None:
        """See :meth:`unmark_backfilled`; may raise the store's errors."""

    @abc.abstractmethod
    def _backfilled(self, job: str, slots: Sequence[int]) -> set[int]:
        """See :meth:`backfilled`; may raise the store's errors."""

    def handed_back(self) -> list[tuple[str, int]]:
        try:
            return self._handed_back()  # (what a subscription has read already: no call of the store)
        except (*self.answer_lost_errors, *self.failure_errors) as exc:
            logger.debug("anarchon: leases handed back not heard from %s (%s)", self.describe(), exc)
            return []

    def _handed_back(self) -> list[tuple[str, int]]:
        """See :meth:`handed_back`; may raise the store's errors."""
        return []

    # -- pauses ---------------------------------------------------------------------------------

    def pause(self, job: str, pause: Pause) -> None:
        self._control_step(f"pause job {job!r}", lambda: self._pause(job, pause))

    def resume(self, job: str) -> Pause | None:
        return self._control_step(f"resume job {job!r}", lambda: self._resume(job))

    def pauses(self) -> dict[str, Pause]:
        return self._control_step("read the jobs paused", self._pauses)

    def _control_step(self, what: str, step: Callable[[], T]) -> T:
        self.open()
        try:
            with self._outages.asking():
                return step()
        except (*self.answer_lost_errors, *self.failure_errors) as exc:
            raise BrokerUnavailable(f"{self.describe()} cannot {what}: {type(exc).__name__}: {exc}") from exc

    def introduce(self, since: Mapping[str, int]) -> dict[str, int]:
        return self._control_step("keep when its jobs came to be", lambda: self._introduce(since))

    @abc.abstractmethod
    def _introduce(self, since: Mapping[str, int]) -> dict[str, int]:
        """See :meth:`introduce`: :func:`.births.born` for each job, in one atomic step (in
        batches, for many jobs: each job's birth only goes down); may raise the store's errors."""

    def put_job(self, name: str, entry: Mapping[str, Any], *, base: int | None, by: str) -> JobDef:
        return self._control_step(f"keep job {name!r}", lambda: self._put_job(name, entry, base, by))

    def remove_job(self, name: str, *, base: int | None) -> JobDef:
        return self._control_step(f"remove job {name!r}", lambda: self._remove_job(name, base))

    def runtime_jobs(self, names: Sequence[str] | None = None) -> dict[str, JobDef]:
        return self._control_step("read the runtime jobs", lambda: self._runtime_jobs(names))

    def job_changes(self, since: Any) -> tuple[set[str] | None, Any]:
        """Not asked during an outage, nor for ``timeout`` after a look failed (the claims find
        the outage and its end; the next look reads what changed meanwhile): a store that does not
        answer would hold each look up for ``timeout``."""
        if self.in_outage() or time.monotonic() < self._looks_again_at:
            return set(), since
        try:
            with self._outages.asking("look for changes of runtime jobs"):
                return self._job_changes(since)
        except (*self.answer_lost_errors, *self.failure_errors) as exc:
            logger.debug("anarchon: changes of runtime jobs not read from %s (%s)", self.describe(), exc)
            self._looks_again_at = time.monotonic() + self.timeout
            return set(), since  # (read from there later)

    _looks_again_at = 0.0

    @abc.abstractmethod
    def _put_job(self, name: str, entry: Mapping[str, Any], base: int | None, by: str) -> JobDef:
        """See :meth:`put_job`: :func:`.definitions.check_change` and the write, in one atomic
        step (with a change told to :meth:`job_changes`); may raise the store's errors."""

    @abc.abstractmethod
    def _remove_job(self, name: str, base: int | None) -> JobDef:
        """See :meth:`remove_job`, in one atomic step; may raise the store's errors."""

    @abc.abstractmethod
    def _runtime_jobs(self, names: Sequence[str] | None) -> dict[str, JobDef]:
        """See :meth:`runtime_jobs`; may raise the store's errors."""

    @abc.abstractmethod
    def _job_changes(self, since: Any) -> tuple[set[str] | None, Any]:
        """See :meth:`job_changes`; may raise the store's errors."""

    @abc.abstractmethod
    def _pause(self, job: str, pause: Pause) -> None:
        """Keep ``job``'s pause, in one atomic step; may raise the store's errors."""

    @abc.abstractmethod
    def _resume(self, job: str) -> Pause | None:
        """Forget ``job``'s pause and move its cursor up to now (:func:`.ordered.resumed_cursor`),
        in one atomic step; the pause ended (None: none in effect). May raise the store's errors."""

    @abc.abstractmethod
    def _pauses(self) -> dict[str, Pause]:
        """The pauses in effect on the store's clock; may raise the store's errors."""

    # -- where runs are decided -----------------------------------------------------------------

    _place: str | None = None

    @classmethod
    def from_url(
        cls: type[_Store],
        url: str,
        *,
        prefix: str = "cron.",
        slot_ttl_ms: int = 300_000,
        lease_ms: int = DEFAULT_LEASE_MS,
        timeout: float = 5.0,
    ) -> _Store:
        """The store at ``url`` (as ``anarchon_backend`` gives it)."""
        options: dict[str, Any] = {
            "prefix": prefix,
            "slot_ttl_ms": slot_ttl_ms,
            "lease_ms": lease_ms,
            "timeout": timeout,
        }
        return cls(cls.location_of(url), **options)

    @classmethod
    def location_of(cls, url: str) -> str:
        """What the store's constructor takes for ``url``: the URL itself, unless said otherwise."""
        return url

    def report_reach(self) -> Finding:
        """The store's version, and how far this host's clock is off the store's, which decides
        (a warning past :data:`CLOCK_WARNING_MS`)."""
        self.open()
        skew = clock.now_ms() - self.store_now_ms()
        shown = f"{self.describe()}: {self.store_version()}; this host's clock {skew:+d} ms off the store's"
        if abs(skew) > CLOCK_WARNING_MS:
            return Finding("store", f"{shown}: runs are decided on the store's clock, check time sync", warn=True)
        return Finding("store", shown)

    def report_claims(self, jobs: Sequence[Job]) -> Finding:
        """The lease and the backups per run; a warning for jobs whose backups can never act."""
        self.check_claims()
        counts = sorted({job.backup_runners for job in jobs}) or [0]
        backups = str(counts[0]) if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"
        shown = (
            f"runs can be decided (the store takes writes); a winner holds its run for {self.lease_ms} ms, "
            f"{backups} backup(s) per run"
        )
        policies = {policy: sorted(job.name for job in jobs if job.catch_up == policy) for policy in ("latest", "all")}
        caught = "; ".join(f"catch-up {policy}: {', '.join(names)}" for policy, names in policies.items() if names)
        shown += f"; {caught}" if caught else "; no job catches up missed runs"
        guarded = {
            policy: sorted(job.name for job in jobs if job.overlap == policy)
            for policy in ("skip", "buffer_one", "buffer_all")
        }
        kept = "; ".join(f"overlap {policy}: {', '.join(names)}" for policy, names in guarded.items() if names)
        shown += f"; {kept}" if kept else "; every job may overlap itself (overlap allow)"
        blind = sorted(job.name for job in jobs if backups_never_act(job, self.lease_ms))
        if blind:
            return Finding(
                "claims",
                f"{shown}; but the backups of {', '.join(blind)} can never act: their max_late_ms is not longer "
                "than anarchon_lease_ms",
                warn=True,
            )
        return Finding("claims", shown)

    def check_job(self, job: Job, lead_ms: int = 0) -> None:
        """The safety rule of a store: a job with backups needs the run's record (which its
        backups and the workers check) kept past its lateness and the winner's lease."""
        super().check_job(job, lead_ms)
        if job.backup_runners and job.jitter_ms + job.max_late_ms + self.lease_ms >= self.slot_ttl_ms:
            raise ConfigError(
                f"job {job.name!r}: jitter_ms + max_late_ms + anarchon_lease_ms ({job.jitter_ms} + {job.max_late_ms} + "
                f"{self.lease_ms} ms) must be shorter than slot_ttl_ms ({self.slot_ttl_ms} ms): the record of a run, "
                "which its backups and the workers check, is kept slot_ttl_ms. Lower them or raise anarchon_slot_ttl_ms"
            )

    def job_warnings(self, jobs: Sequence[Job], now_ms: int) -> list[str]:
        """Jobs whose backups could never act: their runs' deadline comes before the winner's
        lease runs out."""
        return [
            f"job {job.name!r}: max_late_ms ({job.max_late_ms}) is not longer than the winner's lease "
            f"(anarchon_lease_ms {self.lease_ms}): its backups can never take a run over, and a winner that "
            "dies before sending loses the run. Raise max_late_ms or lower anarchon_lease_ms"
            for job in jobs
            if backups_never_act(job, self.lease_ms)
        ]

    def place(self) -> str | None:
        """An identity kept in the store itself (made once, by whoever comes first), with the
        prefix: two URLs of one store (a host name and its address, a relative path resolved in
        two directories) compare as they really are."""
        if self._place is None:
            try:
                kind = type(self).__name__.removesuffix("Backend")
                with self._outages.asking("say which store it is"):
                    self._place = f"{kind} store {self._store_id()}, prefix {self.prefix!r}"
            except (*self.answer_lost_errors, *self.failure_errors) as exc:
                logger.debug("anarchon: %s cannot say which store it is (%s)", self.describe(), exc)
        return self._place

    @abc.abstractmethod
    def _store_id(self) -> str:
        """The store's identity, made at its first use; may raise the store's errors."""

    # -- what removed jobs leave ---------------------------------------------------------------

    def _after_claims(self) -> None:
        """Housekeeping after each claim call (pruning old records); never raises."""
        return None

    # -- outages ----------------------------------------------------------------------------------

    def _failed(self, what: str, exc: BaseException) -> None:
        """Note an outage of the store (see :mod:`.outages`)."""
        self._outages.failed(what, exc, claims=True)

    def _recovered(self) -> None:
        self._outages.recovered()

    def in_outage(self) -> bool:
        return self._outages.since is not None

    def unanswered_s(self) -> float:
        return self._outages.unanswered_s()

    def missed(self, job: str, slots: Sequence[int]) -> None:
        self._outages.missed.add(job, slots)
