"""The beat Scheduler: wait for each slot, claim it, and send the task if this instance won.

Use it with ``celery -A proj beat -S anarchon_celery.Scheduler`` (or the ``beat_scheduler``
setting), as many times as you like: every instance computes the same slots and races for each
run in the backend; only the winner sends the task. No local state file is kept.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
import signal
import threading
import time
from functools import cached_property
from typing import Any, NamedTuple

from celery import beat

from . import clock, stopping
from .backends import Backend, Claim, Outcome, RabbitMQBackend
from .backends.rabbitmq import reset_connection
from .connections import keep_alive, negotiated_heartbeat
from .control import check_prefix_unshared, configure
from .errors import AnarchonError, BrokerUnavailable
from .history import encode_event
from .jobs import BACKUP_MARGIN_MS, Job, backups_never_act, definition, live_gates, task_id_for
from .schedule import Schedule
from .sending import Outgoing, TaskSender, instance_id, task_connection

__all__ = ["Scheduler", "instance_id"]

logger = logging.getLogger(__name__)


class _Done(NamedTuple):
    """A won run once its send is over: sent (``error`` None) or not, at ``at_ms``."""

    run: Outgoing
    at_ms: int
    error: BaseException | None


class _Due(NamedTuple):
    due_ms: int  # slot + this instance's jitter; for a claim made again, when it is made
    slot: int
    job: str
    planned_ms: int = 0  # a claim made again (its gate was away), or a backup's try: when it was first due
    backup: int = 0  # a backup's try at taking the run over: its rank (1 first)


#: Milliseconds between the claims of a run that is away (its gate's RabbitMQ node down or cut
#: off, or its store unreachable), made again until the run's deadline.
AWAY_RETRY_MS = 1_000
#: Milliseconds between the tries of a run's backups, by rank: the first tries when the winner's
#: lease runs out, the second this much later, and so on, so that they do not all ask at once.
BACKUP_STAGGER_MS = 500
#: Seconds between the tries to tell the store of runs sent that it could not be told of.
MARK_AGAIN_S = 1.0
#: While this instance is a backup of runs, it listens for their leases being handed back at
#: least this often (seconds).
HANDBACK_POLL_S = 0.5
#: Seconds between two questions to a backend that could not say where it decides runs.
PLACE_AGAIN_S = 60.0


class Scheduler(beat.Scheduler):
    """A ``celery.beat.Scheduler`` that claims every run in a shared backend before sending it.

    It sleeps until the next run's ``slot + jitter`` (no polling), skips a run found later than
    the job's ``max_late_ms`` (no catch-up), and sends a won run's task with a deterministic task
    id and the headers ``anarchon_job``, ``anarchon_slot``, ``anarchon_run`` and ``anarchon_trigger``.
    """

    #: Claims of runs due together are sent in batches of at most this many.
    batch_size = 500
    #: Gates declared ahead (``anarchon_lead_ms``) at most this many per wake-up, so that claims
    #: coming due meanwhile are not held up.
    prepare_batch = 200
    #: Above this many broker files for the jobs' live queues (one per gate, see
    #: :func:`~anarchon_celery.jobs.live_gates`, two per history stream), a warning at start-up
    #: names RabbitMQ's open-file limit.
    files_warning = 500
    #: Seconds without connecting for sending tasks ahead of the runs after an attempt failed.
    connect_backoff_s = 5.0
    #: A configuration error at start (a job, a setting, a refused login) is logged as one line
    #: and exits with status 1. False: it is raised as it is (embedding the scheduler, tests).
    exit_on_error = True

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        self.jobs: dict[str, Job] = {}
        self.backend: Backend | None = None
        self.instance = instance_id()
        self._queue: list[_Due] = []
        self._prepares: list[_Due] = []  # due_ms: when to declare the run's gate ahead
        self.lead_ms = 0
        #: Gates are declared ``lead_ms - prepare_phase_ms`` before their run (never earlier than
        #: ``lead_ms``): a phase of this instance that puts the declares of runs on whole seconds
        #: between a quarter and three quarters into a second, away from the claims.
        self.prepare_phase_ms = 0
        self._random = random.Random()
        #: 0 while connecting for the tasks works; after a failed attempt, the time.monotonic()
        #: before which _connect_sender does not try again.
        self._connect_after = 0.0
        self._place_asked_at = -PLACE_AGAIN_S
        self._busy = False
        self._stop_requested: tuple[Any, int, Any] | None = None
        self._signal_handlers: dict[int, tuple[Any, Any]] = {}
        #: Runs this instance holds the lease of, not yet sent and marked sent: (job, slot): token.
        self._held: dict[tuple[str, int], int] = {}
        #: Runs sent whose store could not be told so: (job, slot, token): until when to tell it
        #: again (epoch ms), so that a store back within the lease keeps their backups quiet.
        self._unmarked: dict[tuple[str, int, int], int] = {}
        self._mark_again_at = 0.0
        super().__init__(app, *args, **kwargs)

    # -- set-up -------------------------------------------------------------------------------

    def setup_schedule(self) -> None:
        try:
            deployment = configure(self.app)
            backend = deployment.backend
            try:
                backend.open()
                backend.check_claims()  # the user's permissions, now rather than at each run
                check_prefix_unshared(deployment)
                reachable = True
            except BrokerUnavailable as exc:
                # Not a reason to exit (and be restarted in a loop): claims keep trying to connect.
                logger.error("anarchon: %s; runs are not claimed until it answers", exc)
                reachable = False
        except AnarchonError as exc:
            # A job, a setting or the broker's answer (refused login, no vhost, too old) that only a
            # change of configuration fixes: one clear line and a failed exit, not a traceback
            # (Celery logs any other exception's twice, one line at a time).
            if not self.exit_on_error:
                raise
            logger.critical("anarchon: %s. beat is not started", exc)
            raise SystemExit(1) from exc
        self.backend = backend
        self.jobs = deployment.jobs
        self.lead_ms = deployment.settings.lead_ms
        if self.lead_ms >= 1000:  # declared at slot - lead_ms + phase: (phase - lead_ms) mod 1000 into a second
            self.prepare_phase_ms = (self.lead_ms + self._random.randint(250, 750)) % 1000
        else:  # too short a lead to reach the middle of a second: as far from the slot as it allows
            self.prepare_phase_ms = self._random.randint(self.lead_ms // 4, self.lead_ms * 3 // 4)
        start = clock.now_ms()
        self._queue = []
        self._prepares = []
        for job in self.jobs.values():
            if reachable and job.history_size:
                backend.ensure_history(job.name, job.history_size)  # before any worker writes to it
            # From the runs still within their lateness: a run due while no instance was up (a
            # deploy that stopped them all) is claimed like any late run, decided once as ever.
            self._push(job, job.next_slot(start - job.max_late_ms - 1))
        # Instances that define a job differently run the union of both schedules: say so.
        backend.share_definitions(self.instance, {job.name: definition(job) for job in self.jobs.values()})
        if reachable and backend.leases:
            backend.handed_back()  # listening from now on
        if reachable:
            self._connect_sender()
        self._defer_stop_signals()
        self._check_footprint(backend, start)
        self._check_leases(backend)
        if reachable:
            logger.info("anarchon: ready as %s with %d job(s) on %s", self.instance, len(self.jobs), backend.describe())
        else:
            logger.warning(
                "anarchon: started as %s with %d job(s), not ready: waiting for %s",
                self.instance,
                len(self.jobs),
                backend.describe(),
            )

    def _check_footprint(self, backend: Backend, now_ms: int) -> None:
        """Warn when the jobs keep more queues alive on RabbitMQ than it may hold files for."""
        if not isinstance(backend, RabbitMQBackend):
            return
        gates = live_gates(self.jobs.values(), backend.slot_ttl_ms, now_ms)
        streams = sum(1 for job in self.jobs.values() if job.history_size)
        if gates + 2 * streams > self.files_warning:
            logger.warning(
                "anarchon: these jobs keep up to about %d gate queues (slot_ttl_ms %d) and %d history "
                "streams alive at once. RabbitMQ holds about one file per gate while it recovers them "
                "after a restart, and two per stream; RabbitMQ 3.10 hangs when they outnumber its "
                "open-file limit (1,024 in some packages). Raise that limit well above %d "
                "(LimitNOFILE), lower anarchon_slot_ttl_ms, or set history_size 0 where history is "
                "not needed",
                gates,
                backend.slot_ttl_ms,
                streams,
                gates + 2 * streams,
            )

    def _check_leases(self, backend: Backend) -> None:
        """Warn about jobs whose backups could never act: their runs' deadline comes before the
        winner's lease runs out."""
        if not backend.leases:
            return
        for job in self.jobs.values():
            if backups_never_act(job, backend.lease_ms):
                logger.warning(
                    "anarchon: job %r: max_late_ms (%d) is not longer than the winner's lease (anarchon_lease_ms "
                    "%d): its backups can never take a run over, and a winner that dies before sending loses "
                    "the run. Raise max_late_ms or lower anarchon_lease_ms",
                    job.name,
                    job.max_late_ms,
                    backend.lease_ms,
                )

    def _defer_stop_signals(self) -> None:
        """SIGTERM or SIGINT during a claim or a send waits for them to finish (beat's own handler
        then closes the connections and exits), so that a run won is not left unsent; but for
        :data:`~anarchon_celery.stopping.GRACE_S` at most, whatever the broker does (a second
        signal: at once). See :mod:`anarchon_celery.stopping`."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            original = signal.getsignal(signum)
            if not callable(original):
                continue

            def handler(signum: int, frame: Any, original: Any = original) -> None:
                if self._busy:
                    first = self._stop_requested is None
                    self._stop_requested = (original, signum, frame)
                    if first:
                        logger.info(
                            "anarchon: stop requested: finishing the runs in progress (%gs at most)", stopping.GRACE_S
                        )
                    stopping.request()  # a second signal raises Stopping here, inside the broker wait
                else:
                    logger.info("anarchon: %s received with no run in progress: stopping", signal.Signals(signum).name)
                    stopping.request()  # closing the connections is bounded too
                    original(signum, frame)

            signal.signal(signum, handler)
            self._signal_handlers[signum] = (handler, original)

    def _restore_signals(self) -> None:
        for signum, (ours, original) in self._signal_handlers.items():
            if signal.getsignal(signum) is ours:
                signal.signal(signum, original)
        self._signal_handlers.clear()

    @property
    def info(self) -> str:
        try:
            deployment = configure(self.app)
        except AnarchonError as exc:
            return f"    . anarchon -> configuration error: {exc}"
        return f"    . anarchon -> {deployment.backend.describe()}\n    . anarchon jobs -> {len(deployment.jobs)}"

    # -- the loop -----------------------------------------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Run what is due; return the seconds to sleep until the next due run."""
        backend = self.backend
        if backend is None:
            return float(self.max_interval)
        backend.maintain()
        if backend.leases and self._is_backup():  # (what is told meanwhile waits to be read)
            self._hear_hand_backs(backend)
        if self._unmarked:
            self._mark_again(backend)
        self._keep_alive()
        if not self._connect_after:
            self._connect_sender()  # lost while asleep (while the task broker is away: after the claims only)
        done: list[_Done] = []
        # Every run due now, in batches; a stop signal waits for the batch in progress only (and
        # for stopping.GRACE_S at most). The jobs' next runs are queued once the runs due are
        # claimed and sent (working them out takes a fraction of a millisecond per cron job, more
        # on a busy machine): those already due are run next, in the same wake-up.
        self._busy = True
        try:
            with stopping.waiting():
                try:
                    while self._is_due():
                        taken: list[tuple[_Due, int]] = []  # the runs taken off the queue, with when
                        try:
                            while self._is_due():
                                now = clock.now_ms()
                                due: list[_Due] = []
                                while self._queue and self._queue[0].due_ms <= now and len(due) < self.batch_size:
                                    due.append(heapq.heappop(self._queue))
                                taken += ((item, now) for item in due)
                                done += self._run(due, now)
                        finally:
                            self._queue_next(taken)
                finally:
                    if not stopping.expired():
                        self._record(done)  # after every claim and send due now: history never delays a run
        except stopping.Stopping:
            self._abandon()
        finally:
            self._busy = False
        if self._stop_requested is not None:
            handler, signum, frame = self._stop_requested
            self._stop_requested = None
            if not stopping.expired():
                logger.info("anarchon: stopping, the runs in progress are done")
            handler(signum, frame)
        self._prepare(backend)
        self._connect_sender()  # lost during the sends: not at the next runs' expense
        limits = [float(self.max_interval)]
        idle = backend.max_idle_s()
        if idle is not None:
            limits.append(idle)
        connection = self.__dict__.get("connection")
        heartbeat = negotiated_heartbeat(connection) if connection is not None and connection.connected else 0
        if heartbeat:
            limits.append(max(1.0, heartbeat / 3))  # the task connection's heartbeats
        now = clock.now_ms()
        for queue in (self._queue, self._prepares):
            if queue:
                limits.append(max(0.0, (queue[0].due_ms - now) / 1000))
        if backend.leases and self._is_backup():
            limits.append(HANDBACK_POLL_S)  # a lease handed back is taken over without waiting for its end
        if self._unmarked:
            limits.append(MARK_AGAIN_S)
        return min(limits)

    def _mark_again(self, backend: Backend) -> None:
        """Tell the store again, at most every :data:`MARK_AGAIN_S`, of the runs sent that it could
        not be told of, until it answers or their backups can no longer act."""
        if time.monotonic() < self._mark_again_at:
            return
        self._mark_again_at = time.monotonic() + MARK_AGAIN_S
        now = clock.now_ms()
        for run, until in list(self._unmarked.items()):
            if until < now:
                del self._unmarked[run]
        runs = list(self._unmarked)
        superseded = []
        for run, marked in zip(runs, backend.mark_sent(runs, self.instance) if runs else []):
            if marked is not None:
                del self._unmarked[run]
            if marked is False:
                superseded.append(run)
        _warn_superseded(superseded)

    def _is_backup(self) -> bool:
        """Whether this instance is armed as the backup of a run."""
        return any(item.backup for item in self._queue)

    def _hear_hand_backs(self, backend: Backend) -> None:
        """Runs this instance is a backup of whose winner handed its lease back (it is stopping,
        or its send failed): tried at once (later by rank), not when the lease would have ended."""
        handed = set(backend.handed_back())
        if not handed:
            return
        now = clock.now_ms()
        queue = []
        for item in self._queue:
            if item.backup and (item.job, item.slot) in handed:
                logger.info("anarchon: job %r slot %d: its lease was handed back; taking it over", item.job, item.slot)
                item = item._replace(due_ms=now + (item.backup - 1) * BACKUP_STAGGER_MS)
            queue.append(item)
        heapq.heapify(queue)
        self._queue = queue

    def _push(self, job: Job, slot: int) -> None:
        jitter = self._random.randint(0, job.jitter_ms) if job.jitter_ms else 0
        heapq.heappush(self._queue, _Due(slot + jitter, slot, job.name))
        if self.lead_ms:
            heapq.heappush(self._prepares, _Due(slot + jitter - self._prepare_lead_ms, slot, job.name))

    @property
    def _prepare_lead_ms(self) -> int:
        """How long before its claim a run's gate is declared."""
        return self.lead_ms - self.prepare_phase_ms

    def _prepare(self, backend: Backend) -> None:
        """Declare ahead the gates of runs due within ``lead_ms``, so that at their slot only the
        claim remains. A run whose claim is already due is left to the claim."""
        now = clock.now_ms()
        ready: list[Claim] = []
        while self._prepares and self._prepares[0].due_ms <= now and len(ready) < self.prepare_batch:
            item = heapq.heappop(self._prepares)
            if item.due_ms + self._prepare_lead_ms > now:  # its claim is not due yet
                ready.append(Claim(item.job, item.slot))
        if ready:
            backend.prepare(ready)

    def _is_due(self) -> bool:
        return bool(self._queue) and self._queue[0].due_ms <= clock.now_ms() and self._stop_requested is None

    def _queue_next(self, taken: list[tuple[_Due, int]]) -> None:
        """Queue the next run of each job taken off the queue (at the time given with it)."""
        known: dict[tuple[Schedule, int], int] = {}  # worked out once per schedule and slot
        for item, now in taken:
            if item.planned_ms:
                continue  # a claim made again: the job's next run was queued the first time
            self._schedule_after(self.jobs[item.job], item.slot, now, known)

    def _run(self, due: list[_Due], now: int) -> list[_Done]:
        """Claim the due runs (taken off the queue at ``now``) and send the tasks of those won;
        returns each run won, with how its send ended. The jobs' next runs are queued by the caller."""
        backups = [item for item in due if item.backup]
        done = self._take_over(backups, now) if backups else []
        claims: list[Claim] = []
        for item in due:
            if item.backup:
                continue
            job = self.jobs[item.job]
            # Lateness counts from this instance's planned claim (slot + its jitter), so the
            # last claim of a slot is at most jitter_ms + max_late_ms after it: the safety rule.
            planned = item.planned_ms or item.due_ms
            late = now - planned
            if late > job.max_late_ms:
                logger.log(
                    self._skip_level(job.name, item.slot, item.slot + 1),
                    "anarchon: job %r slot %d: found %d ms late (max_late_ms %d); skipped, runs are not caught up",
                    job.name,
                    item.slot,
                    late,
                    job.max_late_ms,
                )
                continue
            claims.append(Claim(job.name, item.slot, deadline_ms=planned + job.max_late_ms, backups=job.backup_runners))
        return done + (self._claim(claims, now) if claims else [])

    def _take_over(self, due: list[_Due], now: int) -> list[_Done]:
        """The tries of runs this instance is a backup for (their winners' leases ran out): a
        run still not sent is taken over and its task sent, with the run's next fencing token."""
        assert self.backend is not None
        backend = self.backend
        claims = []
        for item in due:
            job = self.jobs[item.job]
            claims.append(Claim(job.name, item.slot, deadline_ms=item.planned_ms + job.max_late_ms))
        logger.debug("anarchon: trying %d run(s) as a backup", len(claims))
        answers = backend.take_over(claims, self.instance)
        runs = []
        for item, claim, answer in zip(due, claims, answers):
            if answer.kind == "won":
                logger.info(
                    "anarchon: job %r slot %d: not sent by its winner within its lease; taken over (token %d)",
                    claim.job,
                    claim.slot,
                    answer.value,
                )
                runs.append(self._outgoing(claim, now, answer.value))
            elif answer.kind in ("held", "undecided"):
                wait = answer.value if answer.kind == "held" else AWAY_RETRY_MS
                self._arm(claim, item.backup, wait, item.planned_ms)
            elif answer.kind == "late" and item.backup == 1:
                logger.warning(
                    "anarchon: job %r slot %d: its winner did not send it, and its deadline passed (by %d ms) "
                    "before a backup could take it over",
                    claim.job,
                    claim.slot,
                    answer.value,
                )
            else:
                logger.debug("anarchon: job %r slot %d: backup not needed (%s)", claim.job, claim.slot, answer.kind)
        return self._send_held(runs) if runs else []

    def _arm(self, claim: Claim, rank: int, wait_ms: int, planned_ms: int) -> None:
        """Come back as the run's backup number ``rank`` once ``wait_ms`` more of its lease has
        run out (later by rank), if that is before the run's deadline."""
        due = clock.now_ms() + wait_ms + (rank - 1) * BACKUP_STAGGER_MS + BACKUP_MARGIN_MS
        if claim.deadline_ms is not None and due > claim.deadline_ms:
            logger.debug("anarchon: job %r slot %d: its lease outlasts its deadline; no backup", claim.job, claim.slot)
            return
        heapq.heappush(self._queue, _Due(due, claim.slot, claim.job, planned_ms, rank))

    def _outgoing(self, claim: Claim, now: int, token: int = 0) -> Outgoing:
        task_id = task_id_for(self.backend.prefix if self.backend else "", claim.job, claim.slot)
        return Outgoing(self.jobs[claim.job], claim.slot, task_id, task_id, "schedule", claim.deadline_ms or now, token)

    def _hold(self, run: Outgoing) -> None:
        if run.token:
            self._held[run.job.name, run.slot] = run.token

    def _send_held(self, runs: list[Outgoing]) -> list[_Done]:
        """Send runs held on a lease and settle their leases: marked sent, or handed back (their
        backups take them over) when the send failed."""
        for run in runs:
            self._hold(run)
        done = self._send(runs)
        backend = self.backend
        for run in runs:
            self._held.pop((run.job.name, run.slot), None)
        if backend is None or not backend.leases:
            return done
        sent_runs = [d.run for d in done if d.error is None and d.run.token]
        sent = [(run.job.name, run.slot, run.token) for run in sent_runs]
        failed = [(d.run.job.name, d.run.slot, d.run.token) for d in done if d.error is not None and d.run.token]
        superseded = []
        for run, (job, slot, token), marked in zip(sent_runs, sent, backend.mark_sent(sent, self.instance)):
            if marked is None:
                self._unmarked[job, slot, token] = run.deadline_ms + backend.lease_ms
            elif not marked:
                superseded.append((job, slot, token))
        _warn_superseded(superseded)
        if failed and backend.hand_back(failed, self.instance):
            logger.info("anarchon: %d run(s) whose send failed handed back to their backups", len(failed))
        return done

    def _claim(self, claims: list[Claim], now: int) -> list[_Done]:
        assert self.backend is not None
        logger.debug("anarchon: claiming %d run(s)", len(claims))
        backend = self.backend
        won: dict[tuple[str, int], Outgoing] = {}
        token = 1 if backend.leases else 0  # a first win's; a takeover's is the next
        self._tell_place(backend)

        def outgoing(claim: Claim) -> Outgoing:
            return self._outgoing(claim, now, token)

        def on_won(claim: Claim) -> None:
            # Written at once, while the other claims are still being answered.
            if (claim.job, claim.slot) in won:
                return
            run = won[claim.job, claim.slot] = outgoing(claim)
            self._hold(run)
            self.sender.write(run)  # never raises: what it could not write, _send() sends

        try:
            outcomes = backend.claim(claims, self.instance, on_won=on_won)
        except BaseException:
            if won:  # the tasks written are still confirmed, and logged
                self._send_held(list(won.values()))
            raise
        for armed in backend.armed():
            claim = armed.claim
            deadline = claim.deadline_ms if claim.deadline_ms is not None else now
            self._arm(claim, armed.rank, armed.lease_left_ms, deadline - self.jobs[claim.job].max_late_ms)
        runs = list(won.values())  # the ones written first, in the order written
        for claim, outcome in zip(claims, outcomes):
            if outcome is Outcome.AWAY or outcome is Outcome.EARLY:
                self._claim_again(claim, outcome)
            elif outcome is not Outcome.WON:
                logger.debug("anarchon: job %r slot %d: %s", claim.job, claim.slot, outcome.value)
            elif (claim.job, claim.slot) not in won:  # a backend that does not report wins as they come
                runs.append(outgoing(claim))
        return self._send_held(runs) if runs else []

    def _claim_again(self, claim: Claim, outcome: Outcome = Outcome.AWAY) -> None:
        """Queue the claim of a run again, a moment later, if its deadline allows: it is away (its
        gate's node is down, or the store cannot be reached: once they are back, they still say
        whether anyone won the run), or the store's clock says it is not due yet (this instance's
        clock is ahead)."""
        job = self.jobs[claim.job]
        deadline = claim.deadline_ms if claim.deadline_ms is not None else clock.now_ms()
        planned = deadline - job.max_late_ms
        again = clock.now_ms() + AWAY_RETRY_MS
        away = outcome is Outcome.AWAY
        backend = self.backend
        away_now, away_still = backend.away_text if backend is not None else Backend.away_text
        why = away_now if away else "the store's clock says it is not due yet"
        if again > deadline:
            level = logging.WARNING
            if away and backend is not None and backend.in_outage():
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
        heapq.heappush(self._queue, _Due(again, claim.slot, claim.job, planned))

    def _skip_level(self, job: str, first: int, end: int, schedule: Schedule | None = None) -> int:
        """The log level of runs of ``job`` skipped as too late (the slots in ``[first, end)`` of
        ``schedule``, or the one at ``first``): debug during an outage, which the backend reports
        with the runs missed (these named in) when it ends."""
        backend = self.backend
        if backend is None or not backend.in_outage():
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
        if following + job.max_late_ms < now:
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
        self._push(job, following)

    # -- sending ------------------------------------------------------------------------------

    def _send(self, runs: list[Outgoing]) -> list[_Done]:
        """Send the won runs' tasks, all at once; returns each run with when and how it ended."""
        errors = self.sender.send(runs)
        at_ms = clock.now_ms()
        written_at = self.sender.written_at
        for run, error in zip(runs, errors):
            job = run.job
            if error is not None:  # a failed send must not stop the other jobs
                logger.error(
                    "anarchon: job %r slot %d: won, but sending task %s (%s) failed: %r%s",
                    job.name,
                    run.slot,
                    job.task,
                    run.task_id,
                    error,
                    _hint_for(error),
                    exc_info=error,
                )
                continue
            logger.info("anarchon: job %r slot %d: won, sent %s[%s]", job.name, run.slot, job.task, run.task_id)
        # A run's sent time is when its message was written, not when the batch's confirms were in.
        return [_Done(run, written_at.pop(run.task_id, at_ms), error) for run, error in zip(runs, errors)]

    def _record(self, done: list[_Done]) -> None:
        """Write the ``sent`` event of each run sent to its job's history, and the ``unsent``
        event, with the error, of each run won whose task could not be sent."""
        assert self.backend is not None
        events = []
        for run, at_ms, error in done:
            if not run.job.history_size:
                continue  # the job keeps no history
            failure = {} if error is None else {"error_type": type(error).__name__, "error": str(error)}
            event = encode_event(
                "sent" if error is None else "unsent",
                run=run.run_id,
                job=run.job.name,
                at_ms=at_ms,
                slot=run.slot,
                task_id=run.task_id,
                task=run.job.task,
                instance=self.instance,
                trigger="schedule",
                **failure,
            )
            events.append((run.job.name, event, run.job.history_size))
        if events:
            self.backend.record_many(events)

    @cached_property
    def connection(self) -> Any:
        """The connection tasks are sent on: the app's broker, with publisher confirms on AMQP (so
        that a message the broker refused is an error logged with its job and slot, not a task
        silently lost; other brokers have none, see :mod:`.sending`), heartbeats where the
        transport has them (``broker_heartbeat``) and timeouts (so that a dead broker is noticed)."""
        heartbeat = self.app.conf.get("broker_heartbeat")
        return task_connection(self.app, heartbeat=float(heartbeat) if heartbeat else 0.0)

    @cached_property
    def sender(self) -> TaskSender:
        return TaskSender(self.app, self.connection, instance=self.instance)

    def _tell_place(self, backend: Backend) -> None:
        """Have the task messages name where their runs are decided (:meth:`Backend.place`),
        asked of the backend until it can tell (a store away: at most once a minute)."""
        sender = self.sender
        if sender.place is None and time.monotonic() >= self._place_asked_at + PLACE_AGAIN_S:
            self._place_asked_at = time.monotonic()
            sender.place = backend.place()

    def _connect_sender(self) -> None:
        """Have the task connection and its channel open before the runs come due (at start, and
        after the connection was lost), or the first runs won would be written only after all
        the claims are answered: connecting takes tens of milliseconds, much more on a busy
        machine. One attempt, then none for ``connect_backoff_s`` seconds; sends connect anyway."""
        if time.monotonic() < self._connect_after:
            return
        try:
            self.sender.open()
        except Exception as exc:  # noqa: BLE001 - the next send connects, with its retries
            logger.log(
                logging.DEBUG if self._connect_after else logging.INFO,  # logged once per outage
                "anarchon: could not connect for sending tasks ahead of the runs (%r); trying again every %g s",
                exc,
                self.connect_backoff_s,
            )
            self._connect_after = time.monotonic() + self.connect_backoff_s
        else:
            self._connect_after = 0.0

    def _keep_alive(self) -> None:
        connection = self.__dict__.get("connection")
        if connection is None:
            return
        try:
            keep_alive(connection)
        except Exception as exc:  # noqa: BLE001 - the next send reconnects
            logger.info("anarchon: the task connection dropped while idle (%r); it will be replaced", exc)
            connection.collect()
            self.sender.close()

    def _abandon(self) -> None:
        """A stop's grace period ran out in the middle of claims or sends: hand the leases of the
        runs not sent back, and drop every connection at once (a broker that does not answer
        would not answer a goodbye either)."""
        logger.warning(
            "anarchon: stopping now, %gs after the stop signal: runs whose claim was not answered yet are "
            "not won by this instance, and a task written but not yet confirmed may not have been sent",
            stopping.GRACE_S,
        )
        self._hand_back_held()
        self._drop_connections()

    def _hand_back_held(self) -> None:
        """Give back the leases of the runs won and not sent, so that their backups take them over
        at once (a task written but not confirmed may then be sent twice: the workers run one)."""
        held, self._held = self._held, {}
        if held and self.backend is not None:
            given = self.backend.hand_back([(job, slot, token) for (job, slot), token in held.items()], self.instance)
            logger.info("anarchon: %d lease(s) of runs not sent handed back to their backups", given)

    def _drop_connections(self, connection: Any = None) -> None:
        if self.backend is not None:
            self.backend.abandon()
        connection = self.__dict__.get("connection", connection)
        if connection is not None:
            reset_connection(connection)
        if "sender" in self.__dict__:
            self.sender.close()

    def close(self) -> None:
        """Close the connections; after a stop signal, within its grace period (then they are
        dropped without a goodbye)."""
        connection = self.__dict__.get("connection")  # super().close() forgets it before releasing it
        try:
            with stopping.waiting():
                try:
                    self._hand_back_held()
                    super().close()
                finally:
                    if self.backend is not None:
                        self.backend.close()
        except stopping.Stopping:
            self._drop_connections(connection)
        finally:
            if threading.current_thread() is threading.main_thread():
                self._restore_signals()
                stopping.reset()
        logger.info("anarchon: %s stopped", self.instance)


def _hint_for(error: BaseException) -> str:
    """What to change, when a send failed for a reason the configuration decides."""
    if "home node" in str(error):  # RabbitMQ: a classic queue whose node is down or unreachable
        return (
            ". The task queue is a classic queue that lives on a cluster node now lost: declare the task "
            "queues quorum queues (task_default_queue_type = 'quorum'), see 'The task side of a cluster' "
            "in the README"
        )
    return ""


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
