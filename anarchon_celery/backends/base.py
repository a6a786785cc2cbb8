"""The Backend contract: who runs a slot.

A backend decides, for each (job, slot), which one of the instances racing for it runs it. It is
shared by every beat instance of a deployment; the scheduler calls it from one thread.
"""

from __future__ import annotations

import abc
import enum
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import docs
from ..errors import AnarchonError, ConfigError
from .busy import Freed
from .definitions import JobDef
from .outages import MissedRuns
from .pauses import Pause  # noqa: F401 - the contract's type (documented as anarchon_celery.Pause)

if TYPE_CHECKING:
    from ..jobs import Job

__all__ = [
    "CATCH_UP",
    "GAP",
    "Armed",
    "Backend",
    "Overlapped",
    "Start",
    "Claim",
    "Gap",
    "Finding",
    "JobState",
    "LeaseStore",
    "MissedRuns",
    "Outcome",
    "StreamHistory",
    "Takeover",
    "TakeoverKind",
    "check_prefix",
    "check_slot_ttl",
    "checked",
]

_PREFIX_RE = re.compile(r"[A-Za-z0-9_.:-]*\Z")


def check_prefix(prefix: object) -> str:
    """A valid name prefix, or ConfigError."""
    if not isinstance(prefix, str) or not _PREFIX_RE.match(prefix) or len(prefix) > 100:
        raise ConfigError(f"invalid prefix {prefix!r}: use up to 100 letters, digits, '_', '-', '.' or ':'")
    if prefix.startswith("amq."):
        raise ConfigError(f"invalid prefix {prefix!r}: RabbitMQ reserves names starting with 'amq.'")
    return prefix


def check_slot_ttl(slot_ttl_ms: object) -> int:
    """A valid slot_ttl_ms, or ConfigError."""
    if isinstance(slot_ttl_ms, bool) or not isinstance(slot_ttl_ms, int) or slot_ttl_ms <= 0:
        raise ConfigError(f"slot_ttl_ms must be a positive integer (milliseconds), not {slot_ttl_ms!r}")
    return slot_ttl_ms


class Outcome(enum.Enum):
    """The answer to one claim. Only ``WON`` lets the instance send the task."""

    #: This instance was first: it runs the slot.
    WON = "won"
    #: Another instance holds the slot.
    LOST = "lost"
    #: The answer could not be known (connection lost, timeout, gate vanished). Not won: the
    #: run is skipped by this instance rather than risk running it twice.
    UNDECIDED = "undecided"
    #: The gate cannot serve: a queue of that name that is not a gate (made with other
    #: arguments), or one the broker refuses (permissions). Never a win.
    BAD_GATE = "bad_gate"
    #: Where the run is decided cannot be reached just now (with RabbitMQ, the cluster node that
    #: holds its gate is down or cut off). Not won, and not decided either: the scheduler claims
    #: it again a moment later, while its deadline allows, since the run is still decided in
    #: that one place once it is back.
    AWAY = "away"
    #: The store's clock says the run is not due yet: this instance's clock is ahead. Not won,
    #: and not decided: the scheduler claims it again a moment later, while its deadline allows.
    EARLY = "early"
    #: This instance decided the run, and its job is paused (see :meth:`Backend.pause`): it is
    #: not sent, and the instance records it ``paused``. Like a win, it is given to one instance.
    PAUSED = "paused"
    #: The claim was made under another version of the job's definition than the one kept (the
    #: job changed, or was removed, and this instance has not acted on it yet): not won, and
    #: nobody wins it under that version.
    STALE = "stale"


@dataclass(frozen=True, slots=True)
class Claim:
    """One run to claim: a job's slot (epoch milliseconds).

    ``deadline_ms`` (epoch milliseconds) is the latest moment the claim may be made: a backend
    never claims after it, since the slot may have been forgotten by then.
    """

    job: str
    slot: int
    deadline_ms: int | None = None
    #: On a backend with leases: how many of the instances that lose this claim are armed as
    #: the run's backups (see :meth:`Backend.armed`).
    backups: int = 0
    #: On a backend with leases, for a job that catches up: its
    #: :func:`~anarchon_celery.jobs.catch_up_key`, which the store keeps beside the job's cursor.
    #: A win that moves the cursor reports the gap it leaves (:meth:`LeaseStore.gaps`) when the
    #: key is the one kept; a changed key is kept, and no gap before it is reported.
    key: str = ""
    #: ``""``: the claim of a run due. :data:`CATCH_UP`: of a run found past its lateness, won
    #: only when the job's cursor is below it with the same key (the gap is the winner's).
    #: :data:`GAP`: of a run inside a gap this instance won, made only by its winner: won unless
    #: the run was decided otherwise already.
    kind: str = ""
    #: On a backend with leases: the job's overlap policy (see :mod:`.busy`; ``""``: ``allow``),
    #: which the store applies when the claim is won, and how long a run sent counts as busy
    #: before a worker starts it (ms).
    overlap: str = ""
    queued_ms: int = 0
    #: The version of the job's definition the claim was made under: 0 for a job defined in code;
    #: a runtime job's (see :meth:`Backend.put_job`), which a backend that keeps the definitions
    #: beside the runs checks in the claim (another version kept: :attr:`Outcome.STALE`).
    version: int = 0


#: A :class:`Claim` of a run found too late, for a job that catches up.
CATCH_UP = "catch_up"
#: A :class:`Claim` of a run inside a gap this instance won (see :meth:`LeaseStore.gaps`).
GAP = "gap"


@dataclass(frozen=True, slots=True)
class Gap:
    """This instance won ``claim``, which moved its job's cursor up from ``after``: the runs of
    the job's schedule after ``after`` and before the claim's slot (up to it, for a
    :data:`CATCH_UP` claim) were decided by nobody, and are this instance's to catch up."""

    claim: Claim
    after: int


@dataclass(frozen=True, slots=True)
class Overlapped:
    """This instance won ``claim`` while its job was busy with another run, so it was not sent:
    ``verdict`` is ``skipped``, ``pending`` (sent once the job is free, see
    :meth:`LeaseStore.next_pending`) or ``dropped`` (past the cap of ``buffer_all``)."""

    claim: Claim
    verdict: str


class Start(NamedTuple):
    """The answer of a worker's start check (:meth:`LeaseStore.start_run`).

    ``allowed``: True to run, False not to, None when the run is not known (its record is gone)
    and its job not busy with another run. ``overlap``: why a run of a protected job does not
    start: ``skipped``, ``pending`` (kept, to be sent again once the job is free) or ``wait``
    (another worker holds this very run: ask again within ``left_ms``). ``freed``: a run whose
    hold on the job ran out meanwhile (``abandoned`` when a worker had started it)."""

    allowed: bool | None
    overlap: str = ""
    left_ms: int = 0
    freed: Freed | None = None
    #: The run now holds its job (protected from overlap): its end is to be told (:meth:`LeaseStore.end_busy`).
    holds: bool = False


@dataclass(frozen=True, slots=True)
class Armed:
    """This instance lost ``claim`` and is the run's backup number ``rank`` (1 first): it tries
    to take the run over once the winner's lease has run out, ``lease_left_ms`` after the
    answer (plus a stagger by rank), in case the winner died before sending its task."""

    claim: Claim
    rank: int
    lease_left_ms: int


class TakeoverKind(enum.Enum):
    """The answer to a backup's try at a run (see :meth:`Backend.take_over`)."""

    #: This instance now holds the run: it sends the task, with the run's next fencing token.
    WON = "won"
    #: The winner's lease still runs: try again when it ends.
    HELD = "held"
    #: Sent or started (or nothing to take over): no backup needed.
    DONE = "done"
    #: Past the run's deadline: it is not sent by anyone any more.
    LATE = "late"
    #: The store could not be reached: try again a moment later, while the deadline allows.
    UNDECIDED = "undecided"


@dataclass(frozen=True, slots=True)
class Takeover:
    """A backup's try at a run (see :meth:`Backend.take_over`): ``value`` is the run's fencing
    token when ``kind`` is ``WON``, the milliseconds the lease still runs when ``HELD``, and how
    far past the run's deadline when ``LATE``."""

    kind: TakeoverKind
    value: int = 0


@dataclass(frozen=True, slots=True)
class Finding:
    """One line of ``celery anarchon check``: a check that passed (``ok``), passed with a
    warning (``warn``), or failed, with what it found; ``node``: the cluster node it is about."""

    check: str
    detail: str
    ok: bool = True
    warn: bool = False
    node: str | None = None

    def as_dict(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"check": self.check, "ok": self.ok}
        if self.node is not None:
            shown["node"] = self.node
        if self.warn:
            shown["warn"] = True
        shown["detail"] = self.detail
        return shown


def checked(check: str, action: Callable[[], Finding]) -> Finding:
    """The finding of ``action``, or a failed ``check`` with the error it raised (one line)."""
    try:
        return action()
    except Exception as exc:  # noqa: BLE001 - every failure is reported, as one line
        detail = str(exc) if isinstance(exc, AnarchonError) else f"{type(exc).__name__}: {exc}"
        return Finding(check, detail, ok=False)


class LeaseStore(abc.ABC):
    """What a backend that holds leases does beside its claims (the Redis, PostgreSQL and SQLite
    stores): a run won holds a lease of ``lease_ms`` for its winner to send its task and mark it
    sent (:meth:`mark_sent`); losers may be armed as its backups (:meth:`armed`), which take the
    run over once the lease runs out (:meth:`take_over`); the task messages carry a fencing
    token that the worker checks before it starts the task (:meth:`start_run`)."""

    #: How long a winner's lease lasts, in milliseconds.
    lease_ms: int

    @abc.abstractmethod
    def armed(self) -> list[Armed]:
        """The runs whose claims this instance lost in the last :meth:`Backend.claim` call and for which
        it was armed as a backup (only claims with ``backups``); each is returned once."""

    @abc.abstractmethod
    def take_over(self, claims: Sequence[Claim], instance: str) -> list[Takeover]:
        """Backups' tries at runs (one :class:`Takeover` per claim, in order): a run still not
        sent whose lease has run out, before its deadline, is taken over by ``instance`` with the
        next fencing token. Never raises for store trouble (:attr:`TakeoverKind.UNDECIDED`)."""

    @abc.abstractmethod
    def mark_sent(self, runs: Sequence[tuple[str, int, int]], instance: str) -> list[bool | None]:
        """The tasks of ``(job, slot, token)`` were sent by ``instance``: their leases are done.
        False for a run another holder took over meanwhile; None when the store could not be
        reached, for the caller to tell it again (until then, a backup may take the run over once
        the lease runs out, and the worker's check runs one of the two messages)."""

    @abc.abstractmethod
    def start_run(
        self, job: str, slot: int, token: int, redelivered: bool, *, run: str = "", worker: str = "", lease_ms: int = 0
    ) -> Start:
        """May the task of a run, carrying ``token`` (0: a message without one, as ``run_now``
        sends), start on ``worker``? In one atomic step: the token must be the run's current one
        and the run not started yet (it is marked started); and when its job is protected from
        overlap (:mod:`.busy`), no other run may hold the job (the run ``run`` then holds it, for
        ``lease_ms``). Raises the store's errors."""

    @abc.abstractmethod
    def renew_busy(self, runs: Sequence[tuple[str, int, str]], lease_ms: int) -> list[str | None]:
        """A worker's heartbeat for the runs ``(job, slot, holder)`` its processes run (``holder``
        names the process: ``node#main.pool``): each one that holds its job gets ``lease_ms``
        more (``renewed``; ``late`` when its hold had run out, nobody having taken the job
        meanwhile); ``lost`` when the job is held by another run, or by this run elsewhere; None
        for a job not protected, free, or held by the run as queued. One atomic step per call.
        Raises the store's errors."""

    def hold_worker(self, worker: str) -> bool:
        """Called once by the process that renews ``worker``'s holds (its heartbeat), for its
        life: a store that can tell at once when that process is gone (SQLite: a file lock the
        kernel releases) frees its holds then, without waiting for their lease. True when it can.
        The default cannot."""
        return False

    def release_worker(self) -> None:
        """The end of :meth:`hold_worker` (a clean stop: its holds were ended one by one)."""
        return None

    @abc.abstractmethod
    def end_busy(self, job: str, slot: int, holder: str, *, retrying: bool = False) -> bool:
        """The run ``(job, slot)`` ended (succeeded, failed, revoked, its process lost): its job is
        free, if the run held it. A run held as running is ended only by its ``holder``
        (``node#*``: any process of that node); a queued one by anyone (``holder`` "": told by a
        process that did not start it). ``retrying``: the run will be tried again, and holds its
        job as a queued run does until a worker starts the retry. Raises the store's errors."""

    @abc.abstractmethod
    def next_pending(
        self, jobs: Sequence[str], instance: str, deadline_ms: Mapping[str, int]
    ) -> list[tuple[str, int, int]]:
        """For each of ``jobs`` (kept runs pending: ``buffer_one``, ``buffer_all``) that is free,
        its oldest pending run, now held by ``instance`` (a lease of :attr:`lease_ms`, until
        ``deadline_ms[job]`` at the latest), to be sent: ``(job, slot, token)``. Never raises
        for store trouble (none then)."""

    @abc.abstractmethod
    def overlapped(self) -> list[Overlapped]:
        """The claims this instance won in the last :meth:`Backend.claim` call that were not sent
        because their job was busy (claims with an ``overlap`` policy only); each returned once."""

    @abc.abstractmethod
    def freed(self) -> list[tuple[str, Freed]]:
        """The runs ``(job, freed)`` whose hold on their job ran out, found by this instance's
        claims and :meth:`next_pending` since the last call: an ``abandoned`` one's worker stopped
        renewing its lease (it died, or lost the store). Each is returned once."""

    @abc.abstractmethod
    def hand_back(self, runs: Sequence[tuple[str, int, int]], instance: str) -> int:
        """Give up the leases of runs ``(job, slot, token)`` that ``instance`` holds and will not
        send, and tell the other instances (:meth:`handed_back`), so that the runs' backups take
        them over without waiting for the leases to run out; returns how many were given back.
        Never raises for store trouble."""

    @abc.abstractmethod
    def gaps(self) -> list[Gap]:
        """The gaps left by the claims this instance won in the last :meth:`Backend.claim` call
        (claims with a ``key`` only); each is returned once."""

    @abc.abstractmethod
    def mark_backfilled(self, job: str, slots: Sequence[int], instance: str) -> list[bool]:
        """Mark runs of ``job`` backfilled by ``instance`` (see :mod:`anarchon_celery.backfilling`):
        True for each run marked now, to be sent; False for one marked already. The marks are
        kept until the job's state is deleted (:meth:`JobState.forget_job`). Raises
        BrokerUnavailable when the store cannot be reached."""

    @abc.abstractmethod
    def unmark_backfilled(self, job: str, slots: Sequence[int]) -> None:
        """Take back the marks of runs whose send failed, so that a backfill asked again sends
        them. Raises BrokerUnavailable when the store cannot be reached."""

    @abc.abstractmethod
    def backfilled(self, job: str, slots: Sequence[int]) -> set[int]:
        """Which of ``slots`` of ``job`` are marked backfilled. Raises BrokerUnavailable."""

    @abc.abstractmethod
    def handed_back(self) -> list[tuple[str, int]]:
        """The runs ``(job, slot)`` other instances handed back since the last call (the first
        call starts listening). Cheap: called at each wake-up. Never raises for store trouble."""


class JobState(abc.ABC):
    """A backend that keeps state per job it can list itself (the Redis, PostgreSQL and SQLite
    stores: each job's cursor, run records and history), which a job that is gone leaves behind
    (``celery anarchon prune``)."""

    @abc.abstractmethod
    def stored_jobs(self) -> list[str]:
        """The jobs that have a cursor, run records or history under the prefix, sorted. Raises
        BrokerUnavailable when the store cannot be read."""

    @abc.abstractmethod
    def forget_job(self, job: str) -> None:
        """Delete ``job``'s cursor, run records and history under the prefix: a removed job's
        state, which is otherwise kept for ever. Raises BrokerUnavailable when it cannot."""


class StreamHistory(abc.ABC):
    """A backend that keeps each job's history in a queue of the broker (RabbitMQ's streams),
    which it cannot list (AMQP has no listing): ``celery anarchon prune`` finds them by name."""

    @abc.abstractmethod
    def history_streams(self, jobs: Iterable[str]) -> dict[str, bool]:
        """Whether each job's history stream exists (opening the backend). Raises BrokerError
        when it cannot look."""

    @abc.abstractmethod
    def listed_streams(self, rabbitmqctl: str) -> list[str]:
        """The stream queues of the backend's vhost, as ``rabbitmqctl list_queues`` (a command
        line) shows them; it leaves out queues too busy to answer. Raises BrokerError, saying
        why, when the command fails."""

    @abc.abstractmethod
    def delete_history_stream(self, job: str) -> str:
        """Delete ``job``'s history stream (its history with it); returns the stream's name."""


class Backend(abc.ABC):
    """Decides who runs each slot. Implementations document what they guarantee."""

    #: Prefix of every name this backend creates.
    prefix: str
    #: How errors name this backend ("the RabbitMQ backend").
    title: str = "this backend"
    #: Whether the backend forgets a run ``slot_ttl_ms`` after it was taken, so that a very late
    #: claim could win it again: jobs are then held to the safety rule (``lead_ms + jitter_ms +
    #: max_late_ms < slot_ttl_ms``). A backend that decides each job's runs in slot order never
    #: wins a decided run again, and says False.
    forgets_runs: bool = True
    #: Why a run is ``AWAY``, and why it stayed so until its deadline, for the scheduler's log.
    away_text: tuple[str, str] = ("its gate is away", "its gate stayed away")
    #: How long the backend remembers that a slot was taken, in milliseconds. A job's
    #: ``jitter_ms + max_late_ms`` must stay below it, or a very late instance could run a slot
    #: again after the backend forgot it.
    slot_ttl_ms: int

    @abc.abstractmethod
    def open(self) -> None:
        """Connect and check that the backend can work.

        Raises :class:`~anarchon_celery.BrokerError` with a clear message when it cannot (broker
        unreachable, too old, missing a feature). Calling it again on an open backend is a no-op.
        """

    @abc.abstractmethod
    def claim(
        self, claims: Sequence[Claim], instance: str, *, on_won: Callable[[Claim], None] | None = None
    ) -> list[Outcome]:
        """Try to take each claim for ``instance``; one outcome per claim, in order.

        A claim whose ``deadline_ms`` has passed before it could be made is ``UNDECIDED``. A
        claim is ``AWAY`` only when making it again later can never make a second winner.

        Never raises for broker trouble: what could not be decided is ``UNDECIDED``, or ``AWAY``
        where making it again later is safe. Exactly one caller ever gets ``WON`` for a given
        (job, slot) while the backend remembers it (``slot_ttl_ms``). Claims due at the same
        moment should be passed together, so that a backend can take them in one round trip.

        ``on_won``, if given, may be called with each claim as soon as it is known to be won
        (its outcome is then ``WON``), before the others are answered, so that its task can be
        sent at once. It must not raise.
        """

    # -- leases ---------------------------------------------------------------------------------

    #: Whether a run won holds a lease that backups can take over (the backend is a
    #: :class:`LeaseStore`). False: claim only.
    leases: bool = False
    #: How long a winner's lease lasts, in milliseconds (0 without leases).
    lease_ms: int = 0

    @property
    def lease_store(self) -> LeaseStore | None:
        """This backend's leases, or None for a claim-only backend."""
        return self if isinstance(self, LeaseStore) else None

    @property
    def job_state(self) -> JobState | None:
        """This backend's state per job, if it can list it; else None."""
        return self if isinstance(self, JobState) else None

    @property
    def stream_history(self) -> StreamHistory | None:
        """This backend's history streams, if it keeps history in the broker's queues; else None."""
        return self if isinstance(self, StreamHistory) else None

    #: Whether runs are decided on several nodes of a cluster, any of which may be lost.
    on_several_nodes: bool = False

    def prepare(self, claims: Sequence[Claim]) -> None:
        """Get ready for claims to come shortly (within the scheduler's ``lead_ms``), so that
        :meth:`claim` has less to do when they are due. Best effort: never raises for broker
        trouble, and a claim works whether or not it was prepared."""
        return None

    def maintain(self) -> None:
        """Keep idle connections healthy (heartbeats). Called at every wake-up; cheap."""
        return None

    def share_definitions(self, instance: str, definitions: Mapping[str, Mapping[str, str]]) -> None:
        """Tell the other instances of the deployment how ``instance`` defines its jobs (job name
        to :func:`~anarchon_celery.jobs.definition`), and from then on log a warning, once per
        other instance and job, when one defines a job differently (they would run the union of
        both schedules). Best effort: never raises. The default does nothing."""
        return None

    def introduce(self, since: Mapping[str, int]) -> dict[str, int]:
        """Tell when this instance first knew each job (``since``: job to epoch milliseconds: its
        start, or the change that made a runtime job); returns when each came to be, by every
        instance's word (see :mod:`.births`): its runs before then are never claimed. Called at
        start, before any claim. Raises :class:`~anarchon_celery.BrokerError`. The default keeps
        nothing: every job starts with the instance."""
        return dict(since)

    def unanswered_s(self) -> float:
        """Seconds since the first call of the loop that the backend has not answered, 0 when it
        answered the last one: read by readiness, so that a store that stops answering (frozen,
        or its connection dead) makes the beat not ready within :data:`~anarchon_celery.health.
        UNANSWERED_S`, before the call gives up. The default: 0 (an outage is :meth:`in_outage`)."""
        return 0.0

    def in_outage(self) -> bool:
        """Whether the backend cannot reach its store right now. The backend logs one line when an
        outage starts, a reminder a minute while it lasts, and one line when it ends with the runs
        missed meanwhile; the scheduler then logs the runs it skips at debug level only and
        notes them with :meth:`missed`."""
        return False

    def missed(self, job: str, slots: Sequence[int]) -> None:
        """Note runs of ``job`` skipped by the scheduler during the current outage, their deadline
        passed (see :meth:`in_outage`): the line that says it ended counts and names them."""
        return None

    def max_idle_s(self) -> float | None:
        """The longest the scheduler may sleep between :meth:`maintain` calls, if bounded."""
        return None

    # -- pauses ---------------------------------------------------------------------------------

    @abc.abstractmethod
    def pause(self, job: str, pause: Pause) -> None:
        """Pause ``job`` for every instance of the deployment, durably (a pause kept already is
        replaced): from then on each run of it is decided as ever, by one instance, which gets
        :attr:`Outcome.PAUSED` instead of a win, until :meth:`resume` or the pause's
        ``until_ms``. Opens the backend. Raises :class:`~anarchon_celery.BrokerError` when the
        pause could not be kept (then nothing changed)."""

    @abc.abstractmethod
    def resume(self, job: str) -> Pause | None:
        """End ``job``'s pause: the pause ended, or None when the job was not paused. The runs
        due while it was paused are never sent (a store that catches runs up moves the job's
        cursor up to now). Opens the backend. Raises :class:`~anarchon_celery.BrokerError`."""

    @abc.abstractmethod
    def pauses(self) -> dict[str, Pause]:
        """The jobs paused now, with their pauses (those whose ``until_ms`` passed are not).
        Opens the backend. Raises :class:`~anarchon_celery.BrokerError` when it cannot tell."""

    # -- runtime jobs ---------------------------------------------------------------------------

    @abc.abstractmethod
    def put_job(self, name: str, entry: Mapping[str, Any], *, base: int | None, by: str) -> JobDef:
        """Keep the definition of the runtime job ``name`` (its ``beat_schedule`` entry, JSON values
        only), in one atomic step with the check that ``base`` is the version kept (None: the job
        is new): the definition kept, with its version. Checks nothing else: the caller validated
        the entry. Opens the backend. Raises :class:`~.definitions.JobConflict` when ``base`` is
        not the version kept, BrokerError when it could not be kept (then nothing changed)."""

    @abc.abstractmethod
    def remove_job(self, name: str, *, base: int | None) -> JobDef:
        """Forget the runtime job ``name`` (if its version is ``base``; None: whatever it is),
        with its pause: the definition removed. Its history and run state stay (``prune``).
        Opens the backend. Raises JobConflict, or BrokerError."""

    @abc.abstractmethod
    def runtime_jobs(self, names: Sequence[str] | None = None) -> dict[str, JobDef]:
        """The runtime jobs kept, by name: every one, or those of ``names`` that are kept (a
        beat reads only the jobs that changed). Opens the backend. Raises BrokerError."""

    def job_changes(self, since: Any) -> tuple[set[str] | None, Any]:
        """The runtime jobs changed (added, changed or removed) since ``since``, by name, and where
        to look from next time. ``since`` None starts: nothing changed, and where changes are
        now. None instead of the names: the backend cannot tell, read them all
        (:meth:`runtime_jobs`). Cheap: called about twice a second by each instance; never
        raises (None then). The default cannot tell."""
        return None, since

    # -- history --------------------------------------------------------------------------------

    @abc.abstractmethod
    def record(self, job: str, event: bytes, history_size: int) -> bool:
        """Append one encoded history event (see :mod:`anarchon_celery.history`) to the job's
        history, which keeps about ``history_size`` runs. Best effort: returns False, after
        logging why, when it could not be written; never raises for broker trouble."""

    def record_many(self, events: Sequence[tuple[str, bytes, int]]) -> int:
        """:meth:`record` for several ``(job, event, history_size)`` at once, which a backend may
        write in one round trip; returns how many were written. Best effort, as :meth:`record`."""
        return sum(self.record(job, event, size) for job, event, size in events)

    def ensure_history(self, job: str, history_size: int) -> bool:
        """Make the job's history ready ahead of its first event (at start); best effort."""
        return True

    @abc.abstractmethod
    def read_history(self, jobs: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        """Every retained event of each job, oldest first (a job without history has none).

        Raises :class:`~anarchon_celery.BrokerError` when the history cannot be read.
        """

    def check_claims(self) -> None:
        """Raise :class:`~anarchon_celery.BrokerError` when claims cannot be made here (the
        user's permissions), after :meth:`open`. The default checks nothing."""
        return None

    def check_history(self) -> None:
        """Raise :class:`~anarchon_celery.BrokerError` when history cannot be kept here."""
        return None

    # -- diagnostics (celery anarchon check) -----------------------------------------------------

    #: How ``celery anarchon check`` names the checks of where runs are decided and of history.
    check_names: tuple[str, str] = ("store", "history")

    def survey_nodes(self, *, rabbitmqctl: str | None = None) -> list[Finding]:
        """The nodes of a cluster, one finding each, and what they say together (a check named
        ``nodes`` that fails: the list is never safe). None for a backend of one place."""
        return []

    def report_reach(self) -> Finding:
        """Open the backend and say what and where it is; raises when it cannot be reached."""
        self.open()
        return Finding(self.check_names[0], f"{self.describe()}: reachable")

    def report_claims(self, jobs: Sequence[Job]) -> Finding:
        """Check that runs can be decided here (:meth:`check_claims`) and say how, for ``jobs``."""
        self.check_claims()
        return Finding("claims", "runs can be decided")

    def report_history(self) -> Finding:
        """Check that history can be kept here (:meth:`check_history`)."""
        self.check_history()
        return Finding(self.check_names[1], "history can be kept")

    def place(self) -> str | None:
        """Where this backend decides runs, as text that two instances compare: equal exactly when
        they decide in the same place (the same store and prefix, however each one's URL spells
        it). Carried in each task message, so that workers notice instances that decide one job's
        runs in two places (:mod:`anarchon_celery.worker.splits`). None until it can be told (after
        :meth:`open`); never raises."""
        return None

    def jobs_with_state(self, prefix: str, jobs: Sequence[str]) -> list[str]:
        """Which of ``jobs`` have state here under another ``prefix`` (a cursor, or a history
        stream on RabbitMQ), after :meth:`open`: whether a deployment kept its runs there. The
        default finds none. Raises :class:`~anarchon_celery.BrokerError` when it cannot look."""
        return []

    #: What the error of a job that breaks the safety rule says the backend forgets, and when.
    @property
    def forgets_text(self) -> str:
        return f"after it, {self.title} forgets"

    def check_job(self, job: Job, lead_ms: int = 0) -> None:
        """Raise :class:`~anarchon_celery.ConfigError`, naming the job and the fix, when this
        backend cannot run ``job`` safely. By default the seed's safety rule, on a backend that
        forgets runs (:attr:`forgets_runs`): a run must be remembered past the latest moment anyone
        may claim it, counted from its first declaration, ``lead_ms`` before the slot. No I/O."""
        if self.forgets_runs and lead_ms + job.jitter_ms + job.max_late_ms >= self.slot_ttl_ms:
            lead = "anarchon_lead_ms + " if lead_ms else ""
            lead_value = f"{lead_ms} + " if lead_ms else ""
            raise ConfigError(
                f"job {job.name!r}: {lead}jitter_ms + max_late_ms ({lead_value}{job.jitter_ms} + {job.max_late_ms} "
                f"ms) must be shorter than slot_ttl_ms ({self.slot_ttl_ms} ms): {self.forgets_text} the run was "
                "taken and a late instance could run it again. Lower them or raise anarchon_slot_ttl_ms "
                f"(see {docs.SAFETY_RULE})"
            )

    def job_warnings(self, jobs: Sequence[Job], now_ms: int) -> list[str]:
        """What to warn of at start about running ``jobs`` here (at ``now_ms``): a rule of this
        backend that the jobs strain without breaking it. No I/O; none by default."""
        return []

    @abc.abstractmethod
    def describe(self) -> str:
        """What and where this backend is, for logs and banners; never shows a password."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release what :meth:`open` took. Connections passed in by the caller stay open."""

    def abandon(self) -> None:
        """Drop every connection at once, without waiting for the broker: the process is stopping
        and its grace period ran out (a broker that does not answer would not answer a goodbye
        either). Work in progress is lost: a claim not answered yet is not won. Never raises."""
        self.close()
