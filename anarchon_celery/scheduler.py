"""The beat Scheduler: wait for each slot, claim it, and send the task if this instance won.

Use it with ``celery -A proj beat -S anarchon_celery.Scheduler`` (or the ``beat_scheduler``
setting), as many times as you like: every instance computes the same slots and races for each
run in the backend; only the winner sends the task. No local state file is kept.

Each wake-up (:meth:`Scheduler.tick`) is a few named steps, each a call on a part that owns its
state: the run queue (:mod:`.runqueue`: what is due, and when), the backend (claims, history),
the leases held on a backend with leases (:mod:`.holding`), the task connection and its sender
(:class:`~.sending.TaskLink`) and the stop signals deferred while runs are in flight
(:class:`~.stopping.StopSignals`).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any

from celery import beat

from . import clock, stopping
from .backends import Backend, Claim, Outcome
from .backends.base import CATCH_UP
from .control import Deployment, check_prefix_unshared, configure
from .errors import AnarchonError, BrokerUnavailable
from .holding import LeaseBook
from .jobs import Job, definition, task_id_for
from .live_jobs import LiveJobs
from .metrics import beat_metrics
from .pausing import PausedRuns
from .planning import Plan, births_at_start
from .probes import BeatProbes
from .runqueue import BackupTry, Item
from .sending import Outgoing, SendOutcome, TaskLink, TaskSender, history_events, instance_id
from .store_runs import StoreRuns

__all__ = ["Scheduler", "instance_id"]

logger = logging.getLogger(__name__)

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
    #: A configuration error at start (a job, a setting, a refused login) is logged as one line
    #: and exits with status 1. False: it is raised as it is (embedding the scheduler, tests).
    exit_on_error = True

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        self.jobs: dict[str, Job] = {}
        self.backend: Backend | None = None
        self.deployment: Deployment | None = None
        self.instance = instance_id()
        #: What this instance claims, and when (made by :meth:`setup_schedule`).
        self.plan: Plan | None = None
        self._random = random.Random()
        #: The leases this instance holds, on a backend with leases only.
        self.leases: LeaseBook | None = None
        self.signals = stopping.StopSignals()
        self.tasks = TaskLink(app, instance=self.instance, make_sender=self.make_sender)
        self._place_asked_at = -PLACE_AGAIN_S
        #: Catch-up and overlap protection, on a backend with leases only.
        self.store_runs: StoreRuns | None = None
        #: The runs decided while their job was paused, recorded (made again by :meth:`setup_schedule`).
        self.paused_runs = PausedRuns({}, self.instance, "")
        #: The runtime jobs, followed (made by :meth:`setup_schedule`).
        self.live: LiveJobs | None = None
        #: The loop's heartbeat, read by the health probes (served when anarchon_metrics_port is set).
        self.probes = BeatProbes()
        #: The Prometheus metrics of this process (counting nothing without prometheus-client).
        self.metrics = beat_metrics()
        super().__init__(app, *args, **kwargs)

    @property
    def _plan(self) -> Plan:
        assert self.plan is not None, "setup_schedule() makes the plan"
        return self.plan

    @property
    def connection(self) -> Any:
        """The connection tasks are sent on (see :class:`~.sending.TaskLink`)."""
        return self.tasks.connection

    @property
    def sender(self) -> TaskSender:
        return self.tasks.sender

    def make_sender(self, connection: Any) -> TaskSender:
        """The sender of the runs' tasks over ``connection``."""
        return TaskSender(self.app, connection, instance=self.instance)

    # -- set-up -------------------------------------------------------------------------------

    def setup_schedule(self) -> None:
        deployment, reachable = self._configure()
        self.deployment = deployment
        backend = self.backend = deployment.backend
        self.probes.start(deployment.settings, backend)
        self.jobs = deployment.jobs
        self.live = LiveJobs(self.app, deployment.settings, backend, deployment.jobs)
        if reachable:
            self.jobs.update(self.live.start())
        self.plan = Plan(self.jobs, backend, deployment.settings.lead_ms, self._random)
        self.plan.on_too_late = self.metrics.too_late
        self.metrics.attach(lambda: (dict(self.jobs), self.probes.health()))
        self.paused_runs = PausedRuns(self.jobs, self.instance, backend.prefix)
        start = clock.now_ms()
        self._plan.start(start, births_at_start(backend, self.jobs, self.live.made_at, start, reachable))
        # Instances that define a job differently run the union of both schedules: say so.
        backend.share_definitions(self.instance, {job.name: definition(job) for job in self.jobs.values()})
        store = backend.lease_store
        if store is not None:
            self.leases = LeaseBook(store, self.instance)
            self.leases.on_handed_back = self.metrics.handed_back
            self.store_runs = StoreRuns(self.jobs, self.instance, backend)
        self.signals.install()
        for warning in backend.job_warnings(list(self.jobs.values()), start):
            logger.warning("anarchon: %s", warning)
        self.probes.set_up(reachable)
        if reachable:
            self._set_up_with(backend)
        else:
            logger.warning(
                "anarchon: started as %s with %d job(s), not ready: waiting for %s",
                self.instance,
                len(self.jobs),
                backend.describe(),
            )

    def _set_up_with(self, backend: Backend) -> None:
        """The set-up that needs the backend to answer: at the start, or when it first answers
        (a beat started while it was away)."""
        for job in self.jobs.values():
            if job.history_size:
                backend.ensure_history(job.name, job.history_size)  # before any worker writes to it
        if backend.lease_store is not None:
            backend.lease_store.handed_back()  # listening from now on
        self.tasks.connect_ahead()
        logger.info("anarchon: ready as %s with %d job(s) on %s", self.instance, len(self.jobs), backend.describe())

    def _set_up_late(self, backend: Backend) -> None:
        """A beat started while its backend was away, which answers now: the checks of the start
        (the user's permissions, a prefix shared with an earlier release's runs), then the rest of
        the set-up. A check that only a change of configuration fixes stops the beat, as at start."""
        try:
            backend.check_claims()
            if self.deployment is not None:
                check_prefix_unshared(self.deployment)
            self._set_up_with(backend)
        except BrokerUnavailable as exc:
            logger.warning("anarchon: %s; the set-up is tried again", exc)
            self.probes.answered = False
        except AnarchonError as exc:
            if not self.exit_on_error:
                raise
            logger.critical("anarchon: %s. beat is stopped", exc)
            raise SystemExit(1) from exc

    def _configure(self) -> tuple[Deployment, bool]:
        """The jobs, settings and backend, the backend opened; and whether it answered. A
        configuration error exits with one line (see :attr:`exit_on_error`)."""
        try:
            deployment = configure(self.app)
            try:
                deployment.backend.open()
                deployment.backend.check_claims()  # the user's permissions, now rather than at each run
                check_prefix_unshared(deployment)
            except BrokerUnavailable as exc:
                # Not a reason to exit (and be restarted in a loop): claims keep trying to connect.
                logger.error("anarchon: %s; runs are not claimed until it answers", exc)
                return deployment, False
        except AnarchonError as exc:
            # A job, a setting or the broker's answer (refused login, no vhost, too old) that only a
            # change of configuration fixes: one clear line and a failed exit, not a traceback
            # (Celery logs any other exception's twice, one line at a time).
            if not self.exit_on_error:
                raise
            logger.critical("anarchon: %s. beat is not started", exc)
            raise SystemExit(1) from exc
        return deployment, True

    @property
    def info(self) -> str:
        try:
            deployment = configure(self.app)
        except AnarchonError as exc:
            return f"    . anarchon -> configuration error: {exc}"
        return f"    . anarchon -> {deployment.backend.describe()}\n    . anarchon jobs -> {len(deployment.jobs)}"

    # -- the loop -----------------------------------------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Run what is due; return the seconds to sleep until the next thing to do."""
        backend = self.backend
        if backend is None:
            return float(self.max_interval)
        self.probes.heartbeat.turning()
        self._stop_if_closed()
        self._tend(backend)
        self._run_due()
        self.metrics.outage(backend.in_outage())
        self._run_pending()
        self._follow_jobs(backend)  # (after the runs due: a look never holds them up)
        self._stop_if_closed()
        self.signals.deliver()  # a stop signal that came during the runs: now that they are done
        self._prepare(backend)
        self.tasks.connect_ahead()  # lost during the sends: not at the next runs' expense
        sleep_s = self._sleep_s(backend)
        self.probes.heartbeat.sleeping(sleep_s)
        return sleep_s

    def _tend(self, backend: Backend) -> None:
        """Before the runs: the backend's upkeep, the leases handed back to this instance as a
        backup, the store told again of runs sent, the task connection kept up."""
        backend.maintain()
        if self.probes.reach():
            self._set_up_late(backend)
        if self.leases is not None:
            if self._plan.queue.has_backups():  # (what is told meanwhile waits to be read)
                self.leases.hear_hand_backs(self._plan.queue)
            self.leases.mark_again()
        self.tasks.keep_alive()
        if not self.tasks.failing:
            self.tasks.connect_ahead()  # lost while asleep (while the task broker is away: after the claims only)

    def _stop_if_closed(self) -> None:
        """A stop signal's handler closed the scheduler and raised SystemExit inside a broker
        wait, where the socket it closed can raise an error that replaces it (py-amqp's
        ``having_timeout``): the beat must stop all the same, never reconnect."""
        if getattr(self, "_closed", False):
            raise SystemExit()

    def _follow_jobs(self, backend: Backend) -> None:
        """Act on the runtime jobs changed since the last look: that job only, from its change on.
        Not once a stop is asked for (its grace is for the runs in progress)."""
        if self.live is None or self.signals.pending or stopping.requested():
            return
        changed, starts = self.live.poll()
        if not changed:
            return
        for name, job in changed.items():
            if job is None:
                self.jobs.pop(name, None)
            else:
                self.jobs[name] = job
                if job.history_size:
                    backend.ensure_history(name, job.history_size)
        self._plan.replan(changed, starts, clock.now_ms())
        if self.store_runs is not None:
            self.store_runs.jobs_changed()

    def _run_due(self) -> None:
        """Claim every run due now, send those won, and record them. A stop signal waits for
        the batch in progress only (and for :data:`~.stopping.GRACE_S` at most)."""
        done: list[SendOutcome] = []
        self.signals.busy = True
        try:
            with stopping.waiting():
                try:
                    while self._is_due():
                        self._run_wave(done)
                finally:
                    if not stopping.expired():
                        self._record(done)  # after every claim and send due now: history never delays a run
        except stopping.Stopping:
            self._abandon()
        finally:
            self.signals.busy = False

    def _run_wave(self, done: list[SendOutcome]) -> None:
        """Claim the runs due, batch after batch, adding each won run's send to ``done``; then
        queue the next run of each job taken. Working the next runs out takes a fraction of a
        millisecond per cron job, more on a busy machine: it waits until the runs due now are
        sent, and those of them already due are run next, in the same wake-up."""
        taken: list[tuple[Item, int]] = []  # the items taken off the queue, with when
        try:
            while self._is_due():
                now = clock.now_ms()
                due = self._plan.queue.take(now, self.batch_size)
                taken += ((item, now) for item in due)
                sent = self._run(due, now)
                self.metrics.sends(sent)  # (counted as they end, not with the history: a kill loses less)
                done += sent
                self.probes.heartbeat.progressed()
        finally:
            self._plan.queue_next(taken)

    def _is_due(self) -> bool:
        return self._plan.queue.is_due(clock.now_ms()) and not self.signals.pending

    def _sleep_s(self, backend: Backend) -> float:
        """Until the next thing to do: a run or a declare due, the backend's or the task
        connection's heartbeat, a hand-back to listen for, a store to tell again."""
        now = clock.now_ms()
        # A backup listens for its runs' leases handed back, to take them over at once.
        handbacks = HANDBACK_POLL_S if self._plan.queue.has_backups() else None
        limits = [
            float(self.max_interval),
            backend.max_idle_s(),
            self.tasks.wake_within_s(),
            self._plan.queue.wait_s(now),
            self._plan.prepares.wait_s(now),
            handbacks,
            self.leases.wake_within_s() if self.leases is not None else None,
            self.store_runs.wait_s() if self.store_runs is not None else None,
            self.live.wait_s() if self.live is not None else None,
        ]
        return min(limit for limit in limits if limit is not None)

    # -- runs ---------------------------------------------------------------------------------

    def _prepare(self, backend: Backend) -> None:
        """Declare ahead the gates of runs due within ``lead_ms``, so that at their slot only the
        claim remains. A run whose claim is already due is left to the claim."""
        now = clock.now_ms()
        ready = self._plan.prepares_due(now, self.prepare_batch)
        if ready:
            backend.prepare(ready)

    def _run(self, due: list[Item], now: int) -> list[SendOutcome]:
        """Claim the due runs (taken off the queue at ``now``) and send the tasks of those won;
        returns each run won, with how its send ended. The jobs' next runs are queued by the caller."""
        backups = [item for item in due if isinstance(item, BackupTry)]
        done = self._take_over(backups, now) if backups else []
        claims = [self._plan.claim_of(item, now) for item in due if not isinstance(item, BackupTry)]
        ready = [claim for claim in claims if claim is not None]
        return done + (self._claim(ready, now) if ready else [])

    def _claim(self, claims: list[Claim], now: int) -> list[SendOutcome]:
        """Claim runs; send the tasks of those won, each written as soon as its claim is won."""
        assert self.backend is not None
        logger.debug("anarchon: claiming %d run(s)", len(claims))
        backend = self.backend
        won: dict[tuple[str, int], Outgoing] = {}
        token = 1 if self.leases is not None else 0  # a first win's; a takeover's is the next
        self._tell_place(backend)

        def on_won(claim: Claim) -> None:
            # Written at once, while the other claims are still being answered (a catch-up claim
            # once the gap it stands for is known).
            if claim.kind != CATCH_UP and (claim.job, claim.slot) not in won:
                run = won[claim.job, claim.slot] = self._outgoing(claim, now, token)
                if self.leases is not None:
                    self.leases.hold([run])
                self.sender.write(run)  # never raises: what it could not write, _send() sends

        started = time.monotonic()
        try:
            outcomes = backend.claim(claims, self.instance, on_won=on_won)
        except BaseException:
            if won:  # the tasks written are still confirmed, and logged
                self._send_held(list(won.values()))
            raise
        self.metrics.timed(time.monotonic() - started)
        self.metrics.claimed(claims, outcomes)
        if self.leases is not None:
            self.leases.arm_lost(self._plan.queue, self.jobs, now)
        self.paused_runs.note(claims, outcomes)
        runs = list(won.values())  # the ones written first, in the order written
        for claim, outcome in zip(claims, outcomes):
            if outcome is Outcome.AWAY or outcome is Outcome.EARLY:
                self._plan.claim_again(claim, outcome)
            elif outcome is not Outcome.WON:
                logger.debug("anarchon: job %r slot %d: %s", claim.job, claim.slot, outcome.value)
            elif (claim.job, claim.slot) not in won and claim.kind != CATCH_UP:  # not reported as they came
                runs.append(self._outgoing(claim, now, token))
        if self.store_runs is not None:
            runs += self.store_runs.after_claims(claims, outcomes, self._outgoing)
        return self._send_held(runs) if runs else []

    def _run_pending(self) -> None:
        """Send the runs kept pending (``buffer_one``, ``buffer_all``) whose job is free again."""
        if self.store_runs is not None and not self.signals.pending:
            runs = self.store_runs.pending(self._outgoing)
            if runs:
                sent = self._send_held(runs)
                self.metrics.sends(sent)
                self._record(sent)

    def _take_over(self, due: list[BackupTry], now: int) -> list[SendOutcome]:
        """The tries of runs this instance is a backup for (their winners' leases ran out): a
        run still not sent is taken over and its task sent, with the run's next fencing token."""
        assert self.leases is not None  # (backups are armed by a lease store only)
        won = self.leases.take_over(due, self.jobs, self._plan.queue)
        runs = [self._outgoing(claim, now, token) for claim, token in won]
        return self._send_held(runs) if runs else []

    def _outgoing(self, claim: Claim, now: int, token: int = 0, coalesced: int = 0, trigger: str = "") -> Outgoing:
        """The task of a run won; of a run of catch-up when it stands for ``coalesced`` missed runs."""
        task_id = task_id_for(self.backend.prefix if self.backend else "", claim.job, claim.slot)
        trigger = trigger or ("catch_up" if coalesced else "schedule")
        deadline = claim.deadline_ms or now
        return Outgoing(self.jobs[claim.job], claim.slot, task_id, task_id, trigger, deadline, token, coalesced)

    # -- sending ------------------------------------------------------------------------------

    def _send_held(self, runs: list[Outgoing]) -> list[SendOutcome]:
        """Send runs won and settle their leases: marked sent, or handed back (their backups take
        them over) when the send failed."""
        if self.leases is None:
            return self._send(runs)
        self.leases.hold(runs)
        done = self._send(runs)
        self.leases.settle(done)
        return done

    def _send(self, runs: list[Outgoing]) -> list[SendOutcome]:
        """Send the won runs' tasks, all at once; returns each run with when and how it ended."""
        return self.tasks.send(runs)

    def _record(self, done: list[SendOutcome]) -> None:
        """Write the ``sent`` event of each run sent to its job's history, and the ``unsent``
        event, with the error, of each run won whose task could not be sent."""
        assert self.backend is not None
        events = history_events(done, self.instance)
        events += self.paused_runs.events()
        if self.store_runs is not None:
            events += self.store_runs.events()
        self.metrics.events(events)
        if events:
            self.backend.record_many(events)

    def _tell_place(self, backend: Backend) -> None:
        """Have the task messages name where their runs are decided (:meth:`Backend.place`),
        asked of the backend until it can tell (a store away: at most once a minute)."""
        sender = self.sender
        if sender.place is None and time.monotonic() >= self._place_asked_at + PLACE_AGAIN_S:
            self._place_asked_at = time.monotonic()
            sender.place = backend.place()

    # -- stopping -----------------------------------------------------------------------------

    def _abandon(self) -> None:
        """A stop's grace period ran out in the middle of claims or sends: hand the leases of the
        runs not sent back, and drop every connection at once (a broker that does not answer
        would not answer a goodbye either)."""
        logger.warning(
            "anarchon: stopping now, %gs after the stop signal: runs whose claim was not answered yet are "
            "not won by this instance, and a task written but not yet confirmed may not have been sent",
            stopping.GRACE_S,
        )
        if self.leases is not None:
            self.leases.hand_back_held()
        self._drop_connections()

    def _drop_connections(self) -> None:
        if self.backend is not None:
            self.backend.abandon()
        self.tasks.drop()

    def close(self) -> None:
        """Close the connections; after a stop signal, within its grace period (then they are
        dropped without a goodbye). Once: ``celery beat`` may close its scheduler more than once."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        try:
            with stopping.waiting():
                try:
                    if self.leases is not None:
                        self.leases.hand_back_held()
                    super().close()
                    self.tasks.close()
                finally:
                    if self.backend is not None:
                        self.backend.close()
        except stopping.Stopping:
            self._drop_connections()
        finally:
            if threading.current_thread() is threading.main_thread():  # (a beat in a thread leaves them be)
                self.signals.restore()
                stopping.reset()
        self.probes.stop()
        logger.info("anarchon: %s stopped", self.instance)
