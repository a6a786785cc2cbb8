"""Worker-side history: ``running``, then ``succeeded``, ``failed``, ``revoked`` or ``abandoned``
(its pool process died), for every task the scheduler sent (tasks without the ``anarchon_run``
header are ignored).

Connected when ``anarchon_celery`` is imported in the worker, which ``@anarchon_celery.cron``
does; for apps that only use ``beat_schedule``, add ``"anarchon_celery"`` to Celery's ``imports``
setting. Recording never fails a task, nor makes it wait for the broker:

* A task's signal only puts its event in its process's buffer. One background thread per process
  (per app; a prefork child starts its own) writes the buffer in batches, each confirmed by the
  broker (:meth:`~anarchon_celery.Backend.record_many`), each job's in the order they came, after
  letting them gather for :data:`LINGER_S`. That thread alone uses the deployment's backend, which
  is not thread-safe.
* An event that could not be written stays at the head of the buffer and is written again, with a
  growing pause (up to :data:`RETRY_MAX_S`), for as long as it takes: an outage delays history, it
  does not lose it. A job whose events keep failing (its stream refused) pauses alone, and the
  other jobs' events go on. After a partial failure some events may be written twice, which the
  fold counts once.
* The buffer holds :data:`BUFFER_EVENTS` events per process. When it is full (a long outage), the
  oldest events are dropped, with a warning giving how many (an older event is the one a run can
  best do without: its later ones still give its status).
* At a clean stop (``worker_shutdown``, ``worker_process_shutdown`` in a prefork child, and at exit
  for anything else) the buffer is flushed for up to :data:`FLUSH_TIMEOUT_S` seconds; what is left
  after that (the backend unavailable) is logged as an error with its count. A process killed with
  SIGKILL loses what its buffer held.
* A task run eagerly (``task_always_eager``) waits for its events to be written, as the run it
  belongs to is in the caller's hands.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections import Counter, deque
from typing import Any, NamedTuple

from billiard.exceptions import TimeLimitExceeded, WorkerLostError
from celery.signals import (
    task_failure,
    task_postrun,
    task_prerun,
    task_revoked,
    worker_process_shutdown,
    worker_shutdown,
)

from .. import clock
from ..history import encode_event
from ..task_run import run_headers_of
from . import holding, splits, start_check
from .metrics import worker_metrics
from .start_check import holder_of, worker_name

__all__ = ["BUFFER_EVENTS", "FLUSH_TIMEOUT_S", "LINGER_S", "RETRY_MAX_S", "flush"]

logger = logging.getLogger(__name__)

#: Events a process keeps waiting to be written; beyond that the oldest are dropped.
BUFFER_EVENTS = 10_000
#: Events written together (one confirm wait).
BATCH_EVENTS = 500
#: Seconds the thread lets events gather before writing them: a batch costs the worker far less
#: CPU per event than events written one by one, and history can wait that long.
LINGER_S = 0.05
#: Seconds a clean stop waits for the buffer to be written.
FLUSH_TIMEOUT_S = 10.0
#: The longest pause between two tries of events that could not be written.
RETRY_MAX_S = 30.0
#: The first pause, doubled at each failure in a row.
RETRY_MIN_S = 0.5
#: Seconds between two warnings about dropped events.
DROP_WARNING_S = 10.0

_lock = threading.Lock()
#: Per process (a prefork child must not share its parent's connection) and per app.
_writers: dict[tuple[int, int], _Writer] = {}


class _Event(NamedTuple):
    seq: int  # the order events were put in, across jobs
    job: str
    body: bytes
    history_size: int


class _Writer:
    """One process's history events for one app: the buffer, and the thread that writes it.

    The buffer is a queue per job, so that a job that cannot be written holds up none of the
    others; everything but the backend is guarded by ``_cond``, and the backend is used by the
    thread only.
    """

    def __init__(self, app: Any) -> None:
        from ..backends import backend_for
        from ..control import Deployment, configure  # control imports sending, which imports Celery's app machinery
        from ..errors import ConfigError
        from ..settings import Settings

        try:
            self.deployment = configure(app)  # no I/O: the backend connects on its first write
        except ConfigError as exc:
            # A worker may lack some jobs' tasks: history needs the backend and the settings only.
            settings = Settings.from_app(app)
            self.deployment = Deployment(settings, backend_for(app, settings), {})
            logger.warning(
                "anarchon: the jobs of app %r cannot all be read in this worker (%s); their history is "
                "kept with anarchon_history_size (%d) each",
                getattr(app, "main", app),
                exc,
                settings.history_size,
            )
        self.pid = os.getpid()
        self._cond = threading.Condition(threading.Lock())
        self._queues: dict[str, deque[_Event]] = {}
        self._waiting = 0  # events in the queues
        self._writing = 0  # events taken by the thread, not yet settled
        self._seq = 0
        self._retry_at: dict[str, float] = {}  # job -> monotonic time of its next try
        self._pause: dict[str, float] = {}  # job -> the pause after its next failure
        self._probe = False  # after a batch of several jobs failed whole: one job per batch
        self._flushers = 0
        self._closed = False
        self.written = 0
        self.dropped = 0
        self._dropped_unreported = 0
        self._drop_warned_at = -DROP_WARNING_S
        self._thread = threading.Thread(target=self._run, name=f"anarchon-history-{self.pid}", daemon=True)
        self._thread.start()

    # -- the tasks' side ------------------------------------------------------------------------

    def history_size(self, job: str, told: Any = None) -> int:
        """The job's history size: a job of the code's, else the one its message tells (a
        runtime job's), else the default."""
        spec = self.deployment.jobs.get(job)
        if spec is not None:
            return spec.history_size
        if isinstance(told, int) and not isinstance(told, bool) and told >= 0:
            return told
        return self.deployment.settings.history_size

    def put(self, job: str, body: bytes, history_size: int) -> None:
        with self._cond:
            if self._closed:
                logger.error("anarchon: job %r: history event put after shutdown, not recorded", job)
                return
            if self._waiting >= BUFFER_EVENTS:
                self._drop_oldest()
            self._seq += 1
            queue = self._queues.setdefault(job, deque())
            queue.append(_Event(self._seq, job, body, history_size))
            self._waiting += 1
            worker_metrics().buffered(1)
            if len(queue) == 1 or self._waiting == BATCH_EVENTS:  # else the thread knows already
                self._cond.notify_all()

    def _drop_oldest(self) -> None:
        oldest = min(self._queues, key=lambda job: self._queues[job][0].seq)
        queue = self._queues[oldest]
        queue.popleft()
        if not queue:
            del self._queues[oldest]
        self._waiting -= 1
        self.dropped += 1
        worker_metrics().buffered(-1)
        worker_metrics().dropped_one()
        self._dropped_unreported += 1
        now = time.monotonic()
        if now - self._drop_warned_at >= DROP_WARNING_S:
            logger.warning(
                "anarchon: history buffer full (%d events waiting; %s slow or unavailable): "
                "%d oldest event(s) dropped since the last warning, %d in all by this process",
                self._waiting,
                self.deployment.backend.describe(),
                self._dropped_unreported,
                self.dropped,
            )
            self._drop_warned_at, self._dropped_unreported = now, 0

    def flush(self, timeout: float) -> int:
        """Wait until every event put so far is written, for at most ``timeout`` seconds; return
        how many are still waiting."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._flushers += 1
            self._cond.notify_all()  # paused jobs are tried again sooner while someone waits
            try:
                while self._waiting or self._writing:
                    left = deadline - time.monotonic()
                    if left <= 0 or not self._thread.is_alive():
                        break
                    self._cond.wait(left)
                return self._waiting + self._writing
            finally:
                self._flushers -= 1

    def close(self, timeout: float) -> None:
        """Flush, then stop the thread and release the backend."""
        with self._cond:
            before, pending = self.written, self._waiting + self._writing
        if pending:
            logger.info("anarchon: %d history event(s) to write before stopping (within %.0fs)", pending, timeout)
        left = self.flush(timeout)
        with self._cond:
            self._closed = True
            jobs = sorted(self._queues)
            self._cond.notify_all()
        with self._cond:
            at_stop = self.written - before
        if at_stop:
            logger.info("anarchon: %d history event(s) written at shutdown", at_stop)
        if left:
            logger.error(
                "anarchon: %d history event(s) of job(s) %s not written at shutdown within %.0fs "
                "(%s slow or unavailable): lost",
                left,
                ", ".join(map(repr, jobs)) or "(being written)",
                timeout,
                self.deployment.backend.describe(),
            )
        self._thread.join(1.0)
        if not self._thread.is_alive():  # else it is stuck on the broker: leave its backend alone
            self.deployment.release()
        if self.dropped:
            logger.warning("anarchon: %d history event(s) were dropped by this process (buffer full)", self.dropped)

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            if not batch:  # idle: keep the connection alive
                try:
                    self.deployment.backend.maintain()
                except Exception:  # noqa: BLE001 - the next write reconnects
                    logger.debug("anarchon: history connection upkeep failed", exc_info=True)
                continue
            try:
                left = self._write(batch)
            except Exception:  # noqa: BLE001 - a bug must not stop history for good
                logger.exception("anarchon: writing %d history event(s) failed; trying again", len(batch))
                left = batch
                for job, count in Counter(e.job for e in batch).items():
                    self._failed(job, count)
            with self._cond:
                for event in reversed(left):  # at the head of their queues again, in their order
                    self._queues.setdefault(event.job, deque()).appendleft(event)
                self._waiting += len(left)
                self.written += len(batch) - len(left)
                self._writing = 0
                self._cond.notify_all()
            worker_metrics().buffered(len(left) - len(batch))  # (the events written)

    def _next_batch(self) -> list[_Event] | None:
        """The next events to write, taken from the queues; [] after an idle wait; None once
        closed (with nobody waiting for a flush)."""
        idle = self.deployment.backend.max_idle_s() or 30.0
        lingered = False
        with self._cond:
            while True:
                if self._closed and (not self._waiting or not self._flushers):
                    return None
                now = time.monotonic()
                for job in [job for job, at in self._retry_at.items() if at <= now]:
                    del self._retry_at[job]
                ready = sorted((q[0].seq, job) for job, q in self._queues.items() if job not in self._retry_at)
                if self._probe:
                    ready = ready[:1]
                if ready and not (self._flushers or self._closed or lingered or self._waiting >= BATCH_EVENTS):
                    lingered = True  # let more events gather first
                    self._cond.wait(LINGER_S)
                    continue
                batch = self._take([job for _, job in ready])
                if batch:
                    self._waiting -= len(batch)
                    self._writing = len(batch)
                    return batch
                waits = [at - now for at in self._retry_at.values()]
                if self._flushers:
                    waits = [min(w, 1.0) for w in waits]
                if not self._cond.wait(max(0.01, min([idle, *waits]))) and not self._waiting:
                    return []

    def _take(self, jobs: list[str]) -> list[_Event]:
        """Up to :data:`BATCH_EVENTS` events off the queues of ``jobs``, in that order (the
        caller holds the lock)."""
        batch: list[_Event] = []
        for job in jobs:
            queue = self._queues[job]
            while queue and len(batch) < BATCH_EVENTS:
                batch.append(queue.popleft())
            if not queue:
                del self._queues[job]
            if len(batch) >= BATCH_EVENTS:
                break
        return batch

    def _write(self, batch: list[_Event]) -> list[_Event]:
        """Write ``batch``; return the events that must be tried again, in their order."""
        backend = self.deployment.backend
        by_job: dict[str, list[_Event]] = {}
        for event in batch:
            by_job.setdefault(event.job, []).append(event)
        written = backend.record_many([(e.job, e.body, e.history_size) for e in batch])
        if written == len(batch):
            self._succeeded(list(by_job))
            return []
        if len(by_job) == 1 or not written:
            # Nothing written: the backend is away, or refuses that one job's history. Several jobs:
            # which is it? The next batches hold one job each until one of them is written.
            self._probe = self._probe or len(by_job) > 1
            for job, events in by_job.items():
                self._failed(job, len(events))
            return batch
        # Some written: find which jobs fail, one job at a time (an event written twice is folded once).
        left: list[_Event] = []
        for job, events in by_job.items():
            if backend.record_many([(e.job, e.body, e.history_size) for e in events]) == len(events):
                self._succeeded([job])
            else:
                self._failed(job, len(events))
                left += events
        return left

    def _succeeded(self, jobs: list[str]) -> None:
        self._probe = False
        for job in jobs:
            if self._pause.pop(job, None) is not None:
                logger.warning("anarchon: job %r: history events are written again", job)

    def _failed(self, job: str, count: int) -> None:
        if job not in self._pause:
            logger.warning(
                "anarchon: job %r: %d history event(s) not written yet; they are kept and tried again", job, count
            )
        pause = self._pause.get(job, RETRY_MIN_S)
        self._pause[job] = min(RETRY_MAX_S, pause * 2)
        self._retry_at[job] = time.monotonic() + pause


def _writer(app: Any) -> _Writer:
    key = (os.getpid(), id(app))
    writer = _writers.get(key)
    if writer is None:
        with _lock:
            writer = _writers.get(key)
            if writer is None:
                writer = _writers[key] = _Writer(app)
    return writer


def _after_fork_in_child() -> None:
    """A forked child starts with none of its parent's writers (their threads did not follow)."""
    global _lock
    _lock = threading.Lock()
    _writers.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def flush(timeout: float = FLUSH_TIMEOUT_S) -> int:
    """Wait until this process's history events are written, for at most ``timeout`` seconds;
    return how many are still waiting."""
    deadline = time.monotonic() + timeout
    return sum(w.flush(max(0.0, deadline - time.monotonic())) for w in _own_writers())


def _own_writers() -> list[_Writer]:
    pid = os.getpid()
    with _lock:
        return [w for (p, _), w in _writers.items() if p == pid]


def _close_all(**_: Any) -> None:
    deadline = time.monotonic() + FLUSH_TIMEOUT_S
    pid = os.getpid()
    for writer in _own_writers():
        writer.close(max(0.0, deadline - time.monotonic()))
    with _lock:
        for key in [k for k in _writers if k[0] == pid]:
            del _writers[key]


def _record(task: Any, request: Any, event: str, **fields: Any) -> None:
    try:
        run = run_headers_of(request)
        if run is None or not run["job"]:
            return
        writer = _writer(task.app)
        history_size = writer.history_size(run["job"], run["history_size"])
        if not history_size:
            return  # the job keeps no history
        if event == "running" and run["instance"]:
            fields["instance"] = run["instance"]  # whose message started the run
        body = encode_event(
            event,
            run=run["run"],
            job=run["job"],
            at_ms=clock.now_ms(),
            worker=worker_name(request),
            **fields,
        )
        writer.put(run["job"], body, history_size)
        if getattr(request, "is_eager", False):
            writer.flush(FLUSH_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - history must never fail the task
        logger.warning("anarchon: %s event of task %s not recorded", event, getattr(task, "name", task), exc_info=True)


@task_prerun.connect
def _on_prerun(sender: Any = None, task: Any = None, **_: Any) -> None:
    if task is not None:
        run = run_headers_of(task.request)
        if run is not None:
            splits.notice(run["job"], run["place"], run["instance"])
    # A task refused by its run's lease (a second message of the run) is not run: no history.
    if task is None:
        return
    started = start_check.check(task)
    request = task.request
    freed = getattr(request, start_check.FREED, None)
    if freed is not None:  # a run of the job whose worker stopped renewing its hold: abandoned
        _record_freed(task, freed)
    verdict = getattr(request, start_check.OVERLAP, None)
    _count_start(request, started, verdict)
    if started:
        _record(task, request, "running")
    elif verdict == "skipped":  # its job busy with another run
        _record(task, request, "skipped", reason="overlap", **_slot_of(request))
    elif verdict == "pending":
        _record(task, request, "pending", **_slot_of(request))


#: The reason a refused start is counted under, by the overlap verdict (None: fencing).
_REFUSALS = {None: "fencing", "skipped": "overlap", "pending": "pending", start_check.WAIT: "duplicate"}


def _count_start(request: Any, started: bool, verdict: str | None) -> None:
    run = run_headers_of(request)
    if run is None or not run["job"]:
        return
    if started:
        worker_metrics().run_started(run["job"])
    else:
        worker_metrics().start_refused(run["job"], _REFUSALS.get(verdict, "overlap"))


def _count_end(request: Any, status: str) -> None:
    run = run_headers_of(request) if request is not None else None
    if run is not None and run["job"]:
        worker_metrics().run_finished(run["job"], status)


def _slot_of(request: Any) -> dict[str, Any]:
    run = run_headers_of(request)
    return {"slot": int(run["slot"])} if run is not None and run["slot"] is not None else {}


def _record_freed(task: Any, freed: Any) -> None:
    from ..overlapping import freed_events

    try:
        writer = _writer(task.app)
        for job, body, size in freed_events(writer.deployment.jobs, [freed], "worker", worker_name(task.request)):
            writer.put(job, body, writer.history_size(job) if job in writer.deployment.jobs else size)
    except Exception:  # noqa: BLE001 - history must never fail the task
        logger.warning("anarchon: abandoned event of job %r not recorded", freed[0], exc_info=True)


@task_postrun.connect
def _on_postrun(sender: Any = None, task: Any = None, retval: Any = None, state: str | None = None, **_: Any) -> None:
    if task is None:
        return
    request = task.request
    if not getattr(request, start_check.REFUSED, False):  # its job (protected from overlap) is free
        holding.end(task.app, request, holder_of(request), retrying=state == "RETRY")
    if state == "SUCCESS":
        _count_end(request, "succeeded")
        _record(task, task.request, "succeeded")
    elif state == "FAILURE":
        _count_end(request, "failed")
        _record(task, task.request, "failed", error_type=type(retval).__name__, error=str(retval))


@task_failure.connect
def _on_failure(sender: Any = None, exception: BaseException | None = None, **_: Any) -> None:
    """For the failures the worker's main process reports, where the pool process that ran the
    task could not: it died (``WorkerLostError``: the run is abandoned) or was killed at the task's
    hard time limit (``TimeLimitExceeded``: it failed). Celery fires this only when the message is
    not put back in the queue (celery/worker/request.py, ``Request.on_failure``), and puts the
    task's request on its stack for the receivers. A failure in the pool process itself is its
    ``task_postrun``'s to record."""
    if sender is None or not isinstance(exception, (WorkerLostError, TimeLimitExceeded)):
        return
    event = "abandoned" if isinstance(exception, WorkerLostError) else "failed"
    request = getattr(sender, "request", None)
    _count_end(request, event)
    _record(sender, request, event, error_type=type(exception).__name__, error=str(exception))
    holding.end(sender.app, request, f"{worker_name(request)}#*")  # its job (protected from overlap) is free


@task_revoked.connect
def _on_revoked(
    sender: Any = None,
    request: Any = None,
    terminated: bool = False,
    signum: Any = None,
    expired: bool = False,
    **_: Any,
) -> None:
    """In the worker's main process, for a task discarded before it ran or terminated."""
    if sender is None or request is None:
        return
    reason = "expired" if expired else "terminated" if terminated else "revoked"
    error = f"signal {signum}" if terminated and signum is not None else None
    _count_end(request, "revoked")
    _record(sender, request, "revoked", reason=reason, error=error)
    # Its job (protected from overlap) is free: held by the process terminated, or queued.
    holding.end(sender.app, request, f"{worker_name(request)}#*" if terminated else "")


worker_shutdown.connect(_close_all, weak=False)
worker_process_shutdown.connect(_close_all, weak=False)
atexit.register(_close_all)
