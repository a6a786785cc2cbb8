"""The worker's side of leases: a task started once per run, whoever sent it.

On a backend with leases (SQLite, Redis, PostgreSQL) a run's task message carries the run's
fencing token (``anarchon_token``): 1 from its winner, one more from each backup that took the
run over after the winner's lease ran out. A broker publish and a store write cannot be one
step, so a winner that was only slow may send after a backup did: two messages, one task id.
The worker settles it: before a task starts, the store is asked, in one atomic step, whether the
message's token is the run's current one and the run has not started yet, and marks it started.
A task refused is not run (Celery's ``Ignore``: no result, no retry, no history event).

What still runs:

* a task whose run the store no longer knows (its record is kept ``slot_ttl_ms``) or that the
  store could not be asked about (after one more try, with a warning): at least once rather
  than never. The second try counts a start already made with the message's token as its own,
  since the first may have been made and its answer lost. The check has a connection of its own
  that waits ``anarchon_start_check_timeout_ms`` (500 ms) for an answer, far less than a claim
  does; and once the store could not be asked, the process's tasks run without asking it for
  :data:`ASK_AGAIN_S`, then the next task asks again: a store that hangs costs a task a bounded
  wait, not every task two timeouts;
* a message the broker delivers again (``redelivered``: the worker that had it died before
  acknowledging it, with ``acks_late``), and a task's own retries: the run started, and is
  going on.

Celery calls a task's ``before_start`` after its ``task_prerun`` signal and before the task, and
treats ``Ignore`` raised there as "not run"; a ``task_prerun`` handler cannot stop a task. So the
check is made in our ``task_prerun`` handler (see :mod:`.history`) and acted on by a
``before_start`` installed on the task classes when the worker starts (``worker_init``, before the
pool's processes build their tracers, and again in each new pool process). Workers that do not
import anarchon_celery (Celery's ``imports`` setting) make no check: a takeover can then run a
task twice.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from celery.exceptions import Ignore
from celery.signals import worker_init, worker_process_init

from ..task_run import run_headers_of

if TYPE_CHECKING:
    from ..backends import Backend
    from ..backends.base import LeaseStore, Start

__all__ = ["FREED", "HOLDS", "OVERLAP", "REFUSED", "check", "holder_of", "install", "store_of", "worker_name"]

logger = logging.getLogger(__name__)

#: Request attribute: the task was refused by its start check.
REFUSED = "anarchon_refused"
#: Seconds a worker process's tasks run without asking a store that could not be asked.
ASK_AGAIN_S = 5.0
_lock = threading.Lock()
#: Per process and app: the backend the checks are made on (None: it holds no leases).
_backends: dict[tuple[int, int], Backend | None] = {}
#: Per process and app whose store could not be asked: until when (time.monotonic()) it is not.
_away_until: dict[tuple[int, int], float] = {}
#: Per process and app: how long a worker holds a job protected from overlap (its heartbeat's lease).
_lease_ms: dict[tuple[int, int], int] = {}
#: Request attributes: why a task was not started, its job being busy (``skipped``, ``pending``,
#: ``wait``); and a run of the job whose hold ran out, found by the check: ``(job, Freed)``.
OVERLAP = "anarchon_overlap_verdict"
FREED = "anarchon_freed"
#: Request attribute: the run holds its job (protected from overlap) since its start check.
HOLDS = "anarchon_holds"
WAIT = "wait"


def _backend(app: Any) -> Backend | None:
    """The backend of ``app``'s runs, if it holds leases; None otherwise, or when the app's
    configuration cannot be read (said once per process: its tasks then run unchecked)."""
    key = (os.getpid(), id(app))
    if key not in _backends:
        with _lock:
            if key not in _backends:
                from ..backends import backend_for  # imports Celery's app machinery
                from ..settings import Settings

                try:
                    # The backend only, not the jobs: a worker may import only some of their tasks.
                    settings = Settings.from_app(app)
                    backend = backend_for(app, settings, timeout=settings.start_check_timeout_ms / 1000)
                except Exception:  # noqa: BLE001 - a configuration the beat would refuse: run, as without us
                    logger.warning(
                        "anarchon: the tasks of app %r are not checked against their runs' leases",
                        getattr(app, "main", app),
                        exc_info=True,
                    )
                    backend = None
                _backends[key] = backend if backend is not None and backend.lease_store is not None else None
                _lease_ms[key] = settings.overlap_lease_ms if backend is not None else 0
    return _backends[key]


def store_of(app: Any) -> tuple[LeaseStore, int] | None:
    """The store this process checks ``app``'s runs on, with the workers' hold on a busy job
    (``anarchon_overlap_lease_ms``); None on a backend without leases."""
    backend = _backend(app)
    store = backend.lease_store if backend is not None else None
    return None if store is None else (store, _lease_ms.get((os.getpid(), id(app)), 0))


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    _backends.clear()
    _away_until.clear()
    _lease_ms.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def check(task: Any) -> bool:
    """Whether the task now starting may run (see the module's text); a refusal is noted on its
    request, for its ``before_start`` to act on (and why, when its job is busy, for its history).
    Never raises."""
    request = task.request
    run = run_headers_of(request)
    if run is None:
        return True  # not a run's
    token, job, slot = int(run["token"] or 0), run["job"], run["slot"]
    if job is None or slot is None:
        return True  # not a run's (headers of its own)
    if (getattr(request, "retries", None) or 0) > 0:
        token = 0  # the task's own retry: its run started (only its job's hold is taken again)
    redelivered = bool((getattr(request, "delivery_info", None) or {}).get("redelivered"))
    backend = _backend(task.app)
    store = backend.lease_store if backend is not None else None
    if backend is None or store is None:
        return True  # (a message without a token, on such a backend: run_now's, backfill's)
    key = (os.getpid(), id(task.app))
    away_until = _away_until.get(key)
    if away_until is not None and time.monotonic() < away_until:
        logger.debug(
            "anarchon: job %r slot %s: %s is away; task %s runs unchecked", job, slot, backend.describe(), request.id
        )
        return True
    lease_ms = _lease_ms.get(key, 0)
    answer = _ask(store, str(job), int(slot), token, redelivered, str(run["run"]), holder_of(request), lease_ms)
    if isinstance(answer, BaseException):
        _away_until[key] = time.monotonic() + ASK_AGAIN_S
        logger.log(
            logging.DEBUG if away_until is not None else logging.WARNING,
            "anarchon: job %r slot %s: could not ask %s whether task %s may start (%r); it runs, and so "
            "do this process's tasks without asking it until it answers (asked again every %.0fs)%s",
            job,
            slot,
            backend.describe(),
            request.id,
            answer,
            ASK_AGAIN_S,
            ": their jobs' overlap protection does not hold meanwhile" if run["overlap"] else "",
        )
        return True
    if away_until is not None:
        del _away_until[key]
        logger.warning("anarchon: %s answers again: tasks are checked against their runs again", backend.describe())
    return _act(request, answer, str(job), int(slot), token)


def _act(request: Any, answer: Start, job: str, slot: int, token: int) -> bool:
    """Note the store's answer on the request (a refusal, and why); whether the task runs."""
    if answer.freed is not None:
        setattr(request, FREED, (job, answer.freed))
    if answer.holds:
        setattr(request, HOLDS, True)
    if answer.overlap:
        setattr(request, OVERLAP, answer.overlap)
        logger.info(
            "anarchon: job %r slot %s: task %s not run: %s",
            job,
            slot,
            request.id,
            "another worker holds this very run (its message was delivered again while it runs)"
            if answer.overlap == WAIT
            else "the job's last run is still busy (overlap): "
            + ("kept pending, sent again once it ends" if answer.overlap == "pending" else "skipped"),
        )
    elif answer.allowed is None:
        logger.debug("anarchon: job %r slot %s: run not known any more; task %s runs", job, slot, request.id)
        return True
    elif answer.allowed:
        return True
    else:
        logger.info(
            "anarchon: job %r slot %s: task %s (token %s) not run: the run was taken over or has started",
            job,
            slot,
            request.id,
            token,
        )
    setattr(request, REFUSED, True)
    return False


def _ask(
    store: LeaseStore, job: str, slot: int, token: int, redelivered: bool, run: str, worker: str, lease_ms: int
) -> Start | BaseException:
    """The store's answer, or the error it failed with twice. While another worker holds this
    very run (:data:`WAIT`), asked again until that worker's hold runs out (it died: the run
    starts here) or is renewed (it is alive, and runs it: not here)."""
    waited_until: float | None = None
    while True:
        error: BaseException = RuntimeError("not asked")
        for again in (False, True):
            try:
                # Asked again after a failure, the first ask may have marked the run started: the
                # start of this very message then, to be run (as a delivery made again is).
                answer = store.start_run(
                    job, slot, token, redelivered or again, run=run, worker=worker, lease_ms=lease_ms
                )
                break
            except Exception as exc:  # noqa: BLE001 - the store's errors: tried once more
                error = exc
        else:
            return error
        if answer.overlap != WAIT:
            return answer
        ends = time.monotonic() + answer.left_ms / 1000
        if waited_until is None:
            waited_until = ends
        elif ends > waited_until + 0.5:  # renewed: its worker is alive, and runs it
            return answer
        time.sleep(min(1.0, answer.left_ms / 1000 + 0.05))


def worker_name(request: Any) -> str:
    """Which worker runs a task, as history names it: the worker's node name (``celery@host``),
    else this process."""
    return str(getattr(request, "hostname", None) or f"pid {os.getpid()}")


#: The worker's main process (set when the worker starts, before its pool processes are forked).
MAIN_PID: int | None = None


def holder_of(request: Any, pool_pid: int | None = None) -> str:
    """The process that runs a task, as a job's hold names it: ``node#main.pool`` (the worker's
    node name, its main process, the pool process running the task: this one by default)."""
    main = MAIN_PID or os.getpid()
    return f"{worker_name(request)}#{main}.{pool_pid or os.getpid()}"


def _gated(original: Any) -> Any:
    def before_start(self: Any, task_id: str, args: Any, kwargs: Any) -> Any:
        if getattr(self.request, REFUSED, False):
            raise Ignore()
        return original(self, task_id, args, kwargs)

    before_start.__anarchon_gate__ = True  # type: ignore[attr-defined]
    return before_start


def install(app: Any) -> int:
    """Give every task class of ``app`` (but Celery's own) the ``before_start`` that acts on a
    refusal; returns how many were given one now."""
    installed = 0
    for name, task in list(app.tasks.items()):
        if name.startswith("celery."):
            continue
        cls = type(task)
        if getattr(cls.before_start, "__anarchon_gate__", False):
            continue
        cls.before_start = _gated(cls.before_start)
        task.__trace__ = None  # built again, with it, when next needed (Celery's trace_task)
        installed += 1
    return installed


@worker_init.connect(weak=False)
def _on_worker_init(sender: Any = None, **_: Any) -> None:
    global MAIN_PID
    MAIN_PID = os.getpid()
    app = getattr(sender, "app", None)
    if app is not None:
        install(app)


@worker_process_init.connect(weak=False)
def _on_worker_process_init(**_: Any) -> None:
    """A pool process started afresh (spawn) has none of its parent's classes: install again, and
    build the tracers of the tasks given a gate now (the pool built them already)."""
    from celery import current_app
    from celery.app.trace import build_tracer

    app = current_app
    tasks = [task for name, task in app.tasks.items() if not name.startswith("celery.")]
    before = {id(task) for task in tasks if getattr(type(task).before_start, "__anarchon_gate__", False)}
    if install(app):
        for task in tasks:
            if id(task) not in before:
                task.__trace__ = build_tracer(task.name, task, app.loader, app=app)
