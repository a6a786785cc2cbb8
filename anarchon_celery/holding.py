"""The leases of a beat on a backend with leases (Redis, PostgreSQL, SQLite): those it holds on
the runs it won, from the win until the run's task is sent and the store told so, or handed
back; and the runs it is a backup of, tried once their winner's lease runs out.

A run's lease is settled once its send is over: marked sent (its backups then stand down), or
handed back when the send failed (its backups take it over at once rather than when the lease
runs out). A store that cannot be told is told again, every :data:`MARK_AGAIN_S`, while the
run's backups could still act. On a stop, the leases of runs won and not sent are handed back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from . import clock
from .backends import Claim, LeaseStore, TakeoverKind
from .jobs import BACKUP_MARGIN_MS, Job
from .runqueue import BackupTry, Item, RunQueue
from .sending import Outgoing, SendOutcome

__all__ = ["AWAY_RETRY_MS", "BACKUP_STAGGER_MS", "MARK_AGAIN_S", "LeaseBook"]

logger = logging.getLogger(__name__)

#: Seconds between the tries to tell the store of runs sent that it could not be told of.
MARK_AGAIN_S = 1.0
#: Milliseconds between the tries of a run's backups, by rank: the first tries when the winner's
#: lease runs out, the second this much later, and so on, so that they do not all ask at once.
BACKUP_STAGGER_MS = 500
#: Milliseconds between the claims of a run that is away (its gate's RabbitMQ node down or cut
#: off, or its store unreachable), made again until the run's deadline; and between the tries
#: of a backup whose store could not be reached.
AWAY_RETRY_MS = 1_000


def _nothing(count: int) -> None:
    return None


class LeaseBook:
    """The leases ``instance`` holds in ``store``, and those it still has to tell it about."""

    def __init__(self, store: LeaseStore, instance: str) -> None:
        self.store = store
        self.instance = instance
        #: Runs held, won and not yet sent and marked sent: (job, slot): token.
        self._held: dict[tuple[str, int], int] = {}
        #: Runs sent whose store could not be told so: (job, slot, token): until when to tell it
        #: again (epoch ms), so that a store back within the lease keeps their backups quiet.
        self._unmarked: dict[tuple[str, int, int], int] = {}
        self._mark_again_at = 0.0
        #: Told how many leases were handed back, each time some are (the metrics).
        self.on_handed_back: Callable[[int], None] = _nothing

    # -- as a backup --------------------------------------------------------------------------

    def arm_lost(self, queue: RunQueue[Item], jobs: Mapping[str, Job], now: int) -> None:
        """Queue the backup tries of the runs whose claims this instance just lost and was armed
        for (:meth:`~.LeaseStore.armed`): once the winner's lease has run out."""
        for armed in self.store.armed():
            claim = armed.claim
            deadline = claim.deadline_ms if claim.deadline_ms is not None else now
            _arm(queue, claim, armed.rank, armed.lease_left_ms, deadline - jobs[claim.job].max_late_ms)

    def take_over(
        self, due: list[BackupTry], jobs: Mapping[str, Job], queue: RunQueue[Item]
    ) -> list[tuple[Claim, int]]:
        """Try the runs this instance is a backup of, due now: returns those taken over, each
        with its new fencing token; a run whose lease still runs (or whose store is away) is
        tried again later, while its deadline allows."""
        claims = [Claim(item.job, item.slot, deadline_ms=item.planned_ms + jobs[item.job].max_late_ms) for item in due]
        logger.debug("anarchon: trying %d run(s) as a backup", len(claims))
        won = []
        for item, claim, answer in zip(due, claims, self.store.take_over(claims, self.instance)):
            if answer.kind is TakeoverKind.WON:
                logger.info(
                    "anarchon: job %r slot %d: not sent by its winner within its lease; taken over (token %d)",
                    claim.job,
                    claim.slot,
                    answer.value,
                )
                won.append((claim, answer.value))
            elif answer.kind is TakeoverKind.HELD or answer.kind is TakeoverKind.UNDECIDED:
                wait = answer.value if answer.kind is TakeoverKind.HELD else AWAY_RETRY_MS
                _arm(queue, claim, item.rank, wait, item.planned_ms)
            elif answer.kind is TakeoverKind.LATE and item.rank == 1:
                logger.warning(
                    "anarchon: job %r slot %d: its winner did not send it, and its deadline passed (by %d ms) "
                    "before a backup could take it over",
                    claim.job,
                    claim.slot,
                    answer.value,
                )
            else:
                logger.debug(
                    "anarchon: job %r slot %d: backup not needed (%s)", claim.job, claim.slot, answer.kind.value
                )
        return won

    def hear_hand_backs(self, queue: RunQueue[Item]) -> None:
        """Runs this instance is a backup of whose winner handed its lease back (it is stopping,
        or its send failed): tried at once (later by rank), not when the lease would have ended."""
        handed = set(self.store.handed_back())
        if handed:
            for item in queue.hurry(handed, clock.now_ms(), BACKUP_STAGGER_MS):
                logger.info("anarchon: job %r slot %d: its lease was handed back; taking it over", item.job, item.slot)

    # -- as the winner --------------------------------------------------------------------------

    def hold(self, runs: Iterable[Outgoing]) -> None:
        """Note runs won (each with its fencing token) whose send is about to start."""
        for run in runs:
            if run.token:
                self._held[run.job.name, run.slot] = run.token

    def settle(self, outcomes: Sequence[SendOutcome]) -> None:
        """The sends of runs held are over: mark those sent as sent, and hand back those not."""
        for outcome in outcomes:
            self._held.pop((outcome.run.job.name, outcome.run.slot), None)
        sent_runs = [o.run for o in outcomes if o.error is None and o.run.token]
        sent = [(run.job.name, run.slot, run.token) for run in sent_runs]
        failed = [(o.run.job.name, o.run.slot, o.run.token) for o in outcomes if o.error is not None and o.run.token]
        superseded = []
        marks = self.store.mark_sent(sent, self.instance) if sent else []
        for run, key, marked in zip(sent_runs, sent, marks):
            if marked is None:
                self._unmarked[key] = run.deadline_ms + self.store.lease_ms
            elif not marked:
                superseded.append(key)
        _warn_superseded(superseded)
        if failed and self.store.hand_back(failed, self.instance):
            self.on_handed_back(len(failed))
            logger.info("anarchon: %d run(s) whose send failed handed back to their backups", len(failed))

    def mark_again(self) -> None:
        """Tell the store again, at most every :data:`MARK_AGAIN_S`, of the runs sent that it could
        not be told of, until it answers or their backups can no longer act."""
        if not self._unmarked or time.monotonic() < self._mark_again_at:
            return
        self._mark_again_at = time.monotonic() + MARK_AGAIN_S
        now = clock.now_ms()
        for run, until in list(self._unmarked.items()):
            if until < now:
                del self._unmarked[run]
        runs = list(self._unmarked)
        superseded = []
        for run, marked in zip(runs, self.store.mark_sent(runs, self.instance) if runs else []):
            if marked is not None:
                del self._unmarked[run]
            if marked is False:
                superseded.append(run)
        _warn_superseded(superseded)

    def wake_within_s(self) -> float | None:
        """How soon the beat must wake up to tell the store again; None when nothing waits."""
        return MARK_AGAIN_S if self._unmarked else None

    def hand_back_held(self) -> None:
        """Give back the leases of the runs won and not sent (a stop), so that their backups take
        them over at once (a task written but not confirmed may then be sent twice: the workers
        run one)."""
        held, self._held = self._held, {}
        if held:
            given = self.store.hand_back([(job, slot, token) for (job, slot), token in held.items()], self.instance)
            self.on_handed_back(given)
            logger.info("anarchon: %d lease(s) of runs not sent handed back to their backups", given)


def _arm(queue: RunQueue[Item], claim: Claim, rank: int, wait_ms: int, planned_ms: int) -> None:
    """Come back as the run's backup number ``rank`` once ``wait_ms`` more of its lease has run
    out (later by rank), if that is before the run's deadline."""
    due = clock.now_ms() + wait_ms + (rank - 1) * BACKUP_STAGGER_MS + BACKUP_MARGIN_MS
    if claim.deadline_ms is not None and due > claim.deadline_ms:
        logger.debug("anarchon: job %r slot %d: its lease outlasts its deadline; no backup", claim.job, claim.slot)
        return
    queue.push(BackupTry(due, claim.job, claim.slot, planned_ms, rank))


def _warn_superseded(runs: list[tuple[str, int, int]], named: int = 20) -> None:
    """One warning for the runs this instance sent after its lease on them ran out (it was
    paused, or slow): a backup took each over and sent it again; the workers' start check runs
    one message of each."""
    if not runs:
        return
    shown = ", ".join(f"job {job!r} slot {slot} (our token {token})" for job, slot, token in runs[:named])
    more = f" and {len(runs) - named} more" if len(runs) > named else ""
    logger.warning(
        "anarchon: %d run(s) sent after this instance's lease on them ran out, each taken over and sent "
        "again by a backup meanwhile: %s%s. The workers run one message of each; this instance was "
        "paused or slow for longer than anarchon_lease_ms",
        len(runs),
        shown,
        more,
    )
