"""Overlap protection on a store: whether a job is busy with a run, and what becomes of a run of a
busy job. Pure, so that each store only reads a job's state and writes it back in its own atomic
step, on its own clock (Redis's scripts do the same in Lua).

A job whose policy is not ``allow`` has one :class:`JobBusy` in the store, beside its cursor. It
is busy from the win of a run until a worker reports the run's end:

* ``queued``: won, then sent, not started yet. Until the winner marks it sent it lasts the
  winner's lease (a winner that dies frees the job as its backups would take the run over); once
  sent, ``queued_ms`` (the message's ``expires``, or ``anarchon_overlap_queued_ms``).
* ``running``: a worker started it, and holds the job for ``anarchon_overlap_lease_ms``, renewed
  by the worker's heartbeat while the task runs or waits to be retried. A worker that dies stops
  renewing: the job is free once the lease runs out, and the run is reported abandoned, with the
  worker's name.

A run won while the job is busy is not sent: under ``skip`` it is skipped; under ``buffer_one``
it is kept pending if no run is pending yet (skipped otherwise); under ``buffer_all`` it is kept
pending up to :data:`BUFFER_ALL_CAP` runs (skipped past it, reason ``overlap_buffer_full``). A
pending run is sent, oldest first, by the next instance that finds the job free
(:func:`next_pending`). The worker's start check is the authority (:func:`start`): whoever sent a
run, it never starts beside another run of its job.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = [
    "ALLOW",
    "BUFFER_ALL",
    "BUFFER_ALL_CAP",
    "BUFFER_ONE",
    "POLICIES",
    "SKIP",
    "Freed",
    "Gone",
    "JobBusy",
    "admit",
    "end",
    "held_by_lease",
    "retrying",
    "run_state",
    "next_pending",
    "renew",
    "sent",
    "start",
]

ALLOW, SKIP, BUFFER_ONE, BUFFER_ALL = "allow", "skip", "buffer_one", "buffer_all"
#: The overlap policies (Temporal's names).
POLICIES = (ALLOW, SKIP, BUFFER_ONE, BUFFER_ALL)
#: The most runs of one job kept pending under ``buffer_all``.
BUFFER_ALL_CAP = 1000
QUEUED, RUNNING = "queued", "running"

#: What a worker's renewal found (:func:`renew`).
RENEWED, LATE, LOST = "renewed", "late", "lost"
#: What becomes of a run (:func:`admit`, :func:`start`).
SEND, RUN, SKIPPED, PENDING, DROPPED, WAIT = "send", "run", "skipped", "pending", "dropped", "wait"


@dataclass(slots=True)
class JobBusy:
    """A job's overlap state, as the store keeps it (times on the store's clock, epoch ms)."""

    policy: str = ALLOW
    #: The run that holds the job (None: free), its run id once a worker started it.
    slot: int | None = None
    run: str = ""
    state: str = ""  # queued or running
    until_ms: int = 0
    worker: str = ""
    #: How long a run sent counts as busy before a worker starts it.
    queued_ms: int = 0
    #: Runs won while the job was busy, to be sent when it is free, oldest first.
    pending: list[int] = field(default_factory=list)

    def encode(self) -> str:
        return json.dumps(
            {
                "p": self.policy,
                "s": self.slot,
                "r": self.run,
                "st": self.state,
                "u": self.until_ms,
                "w": self.worker,
                "q": self.queued_ms,
                "pd": self.pending,
            },
            separators=(",", ":"),
        )

    @classmethod
    def decode(cls, text: str | bytes | None) -> JobBusy | None:
        if not text:
            return None
        d = json.loads(text)
        pending = d.get("pd") or []
        return cls(
            policy=d.get("p") or ALLOW,
            slot=d.get("s"),
            run=d.get("r") or "",
            state=d.get("st") or "",
            until_ms=int(d.get("u") or 0),
            worker=d.get("w") or "",
            queued_ms=int(d.get("q") or 0),
            pending=[int(slot) for slot in pending],
        )

    def _take(self, slot: int, state: str, until_ms: int, run: str = "", worker: str = "") -> None:
        self.slot, self.state, self.until_ms, self.run, self.worker = slot, state, until_ms, run, worker
        if slot in self.pending:
            self.pending.remove(slot)

    def _free(self) -> None:
        self.slot, self.state, self.until_ms, self.run, self.worker = None, "", 0, "", ""


class Freed(NamedTuple):
    """A run whose hold on its job ran out: ``abandoned`` when a worker had started it (and
    stopped renewing its lease), else a run sent that no worker started in time."""

    slot: int
    run: str
    worker: str
    abandoned: bool


#: Whether a worker is known to be gone (its process ended), by its name: a store that can tell
#: (SQLite: a file lock the worker holds) frees its holds at once, without waiting for its lease.
Gone = Callable[[str], bool]


def _never(worker: str) -> bool:
    return False


def _expire(busy: JobBusy, now_ms: int, gone: Gone = _never) -> Freed | None:
    if busy.slot is None:
        return None
    if busy.until_ms > now_ms and not (busy.state == RUNNING and busy.worker and gone(busy.worker)):
        return None
    freed = Freed(busy.slot, busy.run, busy.worker, busy.state == RUNNING)
    busy._free()
    return freed


def _cap(policy: str) -> int:
    return 1 if policy == BUFFER_ONE else BUFFER_ALL_CAP if policy == BUFFER_ALL else 0


def _keep_pending(busy: JobBusy, slot: int) -> str:
    if slot in busy.pending:
        return PENDING
    if len(busy.pending) >= _cap(busy.policy):
        return DROPPED if busy.policy == BUFFER_ALL else SKIPPED
    busy.pending.append(slot)
    busy.pending.sort()
    return PENDING


def admit(
    busy: JobBusy, slot: int, policy: str, now_ms: int, hold_ms: int, queued_ms: int, gone: Gone = _never
) -> tuple[str, Freed | None]:
    """A run just won (in the claim step) of a job under ``policy``: :data:`SEND` (the job now
    holds it, for the winner's lease ``hold_ms``), :data:`SKIPPED`, :data:`PENDING` or
    :data:`DROPPED` (past the cap of ``buffer_all``); and the run whose hold ran out, if any."""
    busy.policy, busy.queued_ms = policy, queued_ms
    freed = _expire(busy, now_ms, gone)
    if policy == ALLOW or busy.slot == slot:
        return SEND, freed
    if policy == SKIP:
        busy.pending.clear()  # (left by an earlier buffer_* policy)
    if busy.slot is None and not busy.pending:
        busy._take(slot, QUEUED, now_ms + hold_ms)
        return SEND, freed
    if policy == SKIP:
        return SKIPPED, freed
    return _keep_pending(busy, slot), freed


def held_by_lease(busy: JobBusy | None, slot: int, lease_end_ms: int) -> None:
    """A run taken over by a backup (a new lease until ``lease_end_ms``): it holds its job as long."""
    if busy is not None and busy.slot == slot and busy.state == QUEUED:
        busy.until_ms = max(busy.until_ms, lease_end_ms)


def sent(busy: JobBusy | None, slot: int, now_ms: int) -> None:
    """A run's task was sent: it holds its job until a worker starts it, for ``queued_ms`` (and a
    pending run sent is pending no more)."""
    if busy is not None and busy.slot == slot and busy.state == QUEUED:
        busy.until_ms = max(busy.until_ms, now_ms + busy.queued_ms)
        if slot in busy.pending:
            busy.pending.remove(slot)


def start(
    busy: JobBusy | None,
    slot: int,
    run: str,
    worker: str,
    now_ms: int,
    lease_ms: int,
    *,
    has_record: bool,
    gone: Gone = _never,
) -> tuple[str, Freed | None]:
    """May a worker start the run at ``slot`` (the worker's start check)? :data:`RUN` (the job
    is held by ``worker`` for ``lease_ms``); :data:`WAIT` while another worker holds this very
    run (a message delivered again while its first worker may still run it: ask again until that
    worker's lease runs out or is renewed); :data:`SKIPPED` or :data:`PENDING` (kept, to be sent
    again: only a run with a record, one the scheduler can send) while another run holds the job.
    With the run whose hold ran out, if any."""
    if busy is None or busy.policy == ALLOW:
        return RUN, None
    freed = _expire(busy, now_ms, gone)
    if freed is not None and freed.slot == slot:
        freed = None  # (its own hold: the run goes on here)
    if busy.slot == slot and busy.state == RUNNING and busy.worker != worker:
        return WAIT, freed
    if busy.slot is None or busy.slot == slot:
        busy._take(slot, RUNNING, now_ms + lease_ms, run, worker)
        return RUN, freed
    if busy.policy == SKIP or not has_record:
        return SKIPPED, freed
    verdict = _keep_pending(busy, slot)
    return (SKIPPED if verdict == DROPPED else verdict), freed


def renew(busy: JobBusy | None, slot: int, holder: str, now_ms: int, lease_ms: int) -> str | None:
    """A worker's heartbeat for a run one of its processes runs (``holder``, see :func:`end`):
    :data:`RENEWED`; :data:`LATE` when its hold had run out before this renewal but nobody took
    the job meanwhile (renewed all the same: the worker stalled, its protection lapsed for a
    while); :data:`LOST` when the job is held by another run, or by this run elsewhere (a message
    of it delivered again); None when the job is not protected, free (the run ended), or held by
    the run as queued (not started: its queued hold lasts as it is)."""
    if busy is None or busy.policy == ALLOW or busy.slot is None or (busy.slot == slot and busy.state == QUEUED):
        return None
    if busy.slot != slot or busy.worker != holder:
        return LOST
    late = busy.until_ms <= now_ms
    busy.until_ms = now_ms + lease_ms
    return LATE if late else RENEWED


def _holds(busy: JobBusy, holder: str) -> bool:
    """Whether ``holder`` (``node#main.pool``, the pool process running the run) is the run's
    holder; ``node#*`` stands for any process of that worker node (its main process telling of a
    pool process that died, or of a task it terminated)."""
    if holder.endswith("#*"):
        return busy.worker.startswith(holder[:-1])
    return busy.worker == holder


def end(busy: JobBusy | None, slot: int, holder: str) -> bool:
    """The run at ``slot`` ended (succeeded, failed, revoked, its process lost): the job is free.
    A run held as running is ended only by its holder (``node#*`` for any process of its node);
    a run queued, by anyone (``holder`` "": revoked, or expired, before it ran)."""
    if busy is None or busy.slot != slot:
        return False
    if busy.state == RUNNING and not (holder and _holds(busy, holder)):
        return False  # another process runs it (a message of it delivered again), or it is not known here
    busy._free()
    return True


def retrying(busy: JobBusy | None, slot: int, holder: str, now_ms: int) -> bool:
    """The run at ``slot`` will be tried again (``self.retry()``): its retry is a message of its
    own, which may wait in the queue and run on any worker, so the run holds its job as a queued
    run does (``queued_ms``) until a worker starts the retry (:func:`start`)."""
    if busy is None or busy.slot != slot or (busy.state == RUNNING and not _holds(busy, holder)):
        return False
    busy.state, busy.worker, busy.until_ms = QUEUED, "", now_ms + max(busy.queued_ms, 1_000)
    return True


def next_pending(
    busy: JobBusy | None, now_ms: int, hold_ms: int, gone: Gone = _never
) -> tuple[int | None, Freed | None]:
    """The oldest pending run of a free job, which now holds the job (for the lease ``hold_ms``
    of the instance that sends it); None while the job is busy or nothing is pending. The run
    stays pending until it is sent (:func:`sent`): taken by an instance that died before sending
    it, it is taken again once that hold runs out."""
    if busy is None:
        return None, None
    freed = _expire(busy, now_ms, gone)
    if busy.slot is not None or not busy.pending:
        return None, freed
    slot = busy.pending[0]
    busy.slot, busy.state, busy.until_ms, busy.run, busy.worker = slot, QUEUED, now_ms + hold_ms, "", ""
    return slot, freed


def run_state(verdict: str | None) -> str:
    """The state a run won is recorded in: ``claimed`` to be sent; ``skipped`` or ``pending``."""
    if not verdict:
        return "claimed"
    return PENDING if verdict == PENDING else SKIPPED


def admit_wins(
    claims: Sequence[tuple[str, int, str, int]],
    won: Sequence[int],
    states: dict[str, JobBusy],
    now_ms: int,
    hold_ms: int,
    gone: Gone = _never,
) -> tuple[dict[int, str], list[tuple[str, Freed]]]:
    """:func:`admit` for the claims won (``won``: indexes into ``claims``, each ``(job, slot,
    policy, queued_ms)``), in job and slot order. ``states`` (job: its state) gains a state for
    each protected job and is changed in place. Returns the verdict of each win that is not
    sent, by index, and the runs freed."""
    verdicts: dict[int, str] = {}
    freed: list[tuple[str, Freed]] = []
    for i in sorted(won, key=lambda i: (claims[i][0], claims[i][1])):
        job, slot, policy, queued_ms = claims[i]
        busy = states.get(job)
        if policy in ("", ALLOW):
            if busy is not None and busy.policy != ALLOW:
                busy.policy = ALLOW  # no longer protected: the workers stop checking
            continue
        if busy is None:
            busy = states[job] = JobBusy(policy=policy)
        verdict, ended = admit(busy, slot, policy, now_ms, hold_ms, queued_ms, gone)
        if ended is not None:
            freed.append((job, ended))
        if verdict != SEND:
            verdicts[i] = verdict
    return verdicts, freed
