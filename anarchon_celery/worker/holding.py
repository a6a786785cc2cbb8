"""The worker's side of overlap protection (see :mod:`anarchon_celery.backends.busy`): a run of a
protected job holds its job from its start check until its end, which the worker tells the
store; while it runs, one heartbeat thread per worker (in its main process) renews the holds of
all its runs in one call every third of ``anarchon_overlap_lease_ms``. A hold names the process
that runs the task (``node#main.pool``), so that a message of the run delivered again, even to
another process of the same worker, never starts beside it.

The heartbeat runs in the worker's main process, which knows every request its pool processes
run (``celery.worker.state.active_requests``): under prefork a task that holds the GIL in C code
for longer than the lease stalls only its pool process, not the heartbeat. Under the ``solo`` and
``threads`` pools it stalls the heartbeat too: a renewal that finds the hold run out, or gone, is
logged as a warning.

A run's end is told by the process that sees it: the pool process after the task (its
``task_postrun``; a task to be retried holds its job as a queued run does, until a worker starts
its retry), the main process for a task revoked, expired, or whose pool process died. A worker
killed whole tells nothing: its runs' holds run out (on SQLite they are freed at once: the main
process holds a file lock, taken before its pool processes are forked), and whoever finds one
out records the run ``abandoned``.
"""

from __future__ import annotations

import logging
import os
import threading
from types import SimpleNamespace
from typing import Any

from celery.signals import worker_init, worker_ready, worker_shutdown

from ..backends.busy import LATE, LOST
from ..task_run import run_headers_of
from . import start_check

__all__ = ["Heartbeat", "end"]

logger = logging.getLogger(__name__)

_heartbeats: dict[int, Heartbeat] = {}


def protected(request: Any) -> tuple[str, int] | None:
    """The run ``(job, slot)`` of a request (a task's, or the worker's own
    ``celery.worker.request.Request``, whose headers are its ``request_dict``) whose job is
    protected from overlap, else None."""
    run = _run_of(request)
    if run is None or not run["overlap"] or run["overlap"] == "allow":
        return None
    return str(run["job"]), int(run["slot"])


def _run_of(request: Any) -> dict[str, Any] | None:
    headers = getattr(request, "request_dict", None)
    run = run_headers_of(request if headers is None else SimpleNamespace(headers=headers))
    return None if run is None or run["job"] is None or run["slot"] is None else run


def end(app: Any, request: Any, holder: str, *, retrying: bool = False) -> None:
    """Tell the store that the run of ``request`` ended (or will be ``retrying``); ``holder`` its
    process, ``node#*`` for any process of the worker, "" when told by a process that did not
    start it. Only for a protected run, or one whose start check took its job's hold (a message
    sent before the job was protected). Never raises (the hold runs out by itself)."""
    run = protected(request)
    if run is None and getattr(request, start_check.HOLDS, False):
        found = _run_of(request)
        run = (str(found["job"]), int(found["slot"])) if found is not None else None
    stored = start_check.store_of(app) if run is not None else None
    if run is None or stored is None:
        return
    try:
        stored[0].end_busy(run[0], run[1], holder, retrying=retrying)
    except Exception as exc:  # noqa: BLE001 - its hold runs out by itself
        logger.warning(
            "anarchon: job %r slot %d: its end not told to the store (%r); the job is free once its hold "
            "runs out (anarchon_overlap_lease_ms)",
            run[0],
            run[1],
            exc,
        )


class Heartbeat:
    """One thread that renews the holds of the runs a worker's processes run."""

    def __init__(self, app: Any, node: str) -> None:
        from ..backends import backend_for
        from ..settings import Settings

        settings = Settings.from_app(app)
        self.lease_ms = settings.overlap_lease_ms
        self.node = node
        #: No connection is made before the thread's first beat (after the pool is forked).
        self.backend = backend_for(app, settings, timeout=min(5.0, self.lease_ms / 3000))
        self._stop = threading.Event()
        self._lost: set[tuple[str, int]] = set()
        self.renewals = 0
        self.fast = False
        self._thread = threading.Thread(target=self._run, name="anarchon-heartbeat", daemon=True)

    def hold(self) -> None:
        """Let the store tell at once when this worker is gone, where it can (SQLite): called in
        the main process before the pool processes are forked, which then share the lock."""
        store = self.backend.lease_store
        try:
            self.fast = store is not None and store.hold_worker(f"{self.node}#{os.getpid()}")
        except Exception as exc:  # noqa: BLE001 - its holds are freed by their lease then
            logger.warning("anarchon: %s cannot tell when this worker is gone (%r)", self.backend.describe(), exc)

    def start(self) -> None:
        logger.info(
            "anarchon: holds of running tasks renewed every %.1fs as %s; %s",
            self.lease_ms / 3000,
            self.node,
            "freed at once if this worker dies" if self.fast else "freed by their lease if this worker dies",
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2.0)
        if not self._thread.is_alive():
            store = self.backend.lease_store
            if store is not None:
                store.release_worker()
            self.backend.close()

    def _runs(self) -> list[tuple[str, int, str]]:
        """The runs this worker's processes run, with the process that runs each (its hold's
        holder); a store says which of them are protected."""
        from celery.worker import state

        for _ in range(3):
            try:
                active = list(state.active_requests)
                break
            except RuntimeError:  # (changed while copied, by the consumer's thread)
                continue
        else:
            return []
        main = os.getpid()
        runs = {
            (str(run["job"]), int(run["slot"]), f"{self.node}#{main}.{getattr(request, 'worker_pid', None) or main}")
            for request in active
            if (run := _run_of(request)) is not None
        }
        return sorted(runs)

    def beat(self) -> None:
        """Renew the holds of this worker's runs now, once."""
        store = self.backend.lease_store
        runs = self._runs()
        if store is None or not runs:
            return
        renewed = store.renew_busy(runs, self.lease_ms)
        self.renewals += 1
        for (job, slot, _), answer in zip(runs, renewed):
            if answer == LATE or (answer == LOST and (job, slot) not in self._lost):
                if answer == LOST:
                    self._lost.add((job, slot))
                logger.warning(
                    "anarchon: job %r slot %d: its hold on the job %s when renewed: this worker did not renew "
                    "it within anarchon_overlap_lease_ms (%d ms; a task holding the GIL in C code stalls the "
                    "heartbeat of the solo and threads pools)%s",
                    job,
                    slot,
                    "had run out" if answer == LATE else "was gone",
                    self.lease_ms,
                    ": renewed, nobody took the job meanwhile"
                    if answer == LATE
                    else "; the job went on, and another run of it may be running beside this one",
                )
        self._lost &= {(job, slot) for job, slot, _ in runs}

    def _run(self) -> None:
        while not self._stop.wait(self.lease_ms / 3000):
            try:
                self.beat()
            except Exception as exc:  # noqa: BLE001 - tried again at the next beat
                logger.warning("anarchon: holds of running tasks not renewed (%r); tried again", exc)


@worker_init.connect(weak=False)
def _on_worker_init(sender: Any = None, **_: Any) -> None:
    """Make this worker's heartbeat on a backend with leases, in its main process, before the
    pool processes are forked (they share its file lock on SQLite)."""
    app = getattr(sender, "app", None)
    if app is None or os.getpid() in _heartbeats or start_check.store_of(app) is None:
        return
    try:
        heartbeat = Heartbeat(app, str(getattr(sender, "hostname", None) or f"pid {os.getpid()}"))
    except Exception:  # noqa: BLE001 - a configuration the beat would refuse
        logger.warning("anarchon: no heartbeat for the holds of running tasks", exc_info=True)
        return
    heartbeat.hold()
    _heartbeats[os.getpid()] = heartbeat


@worker_ready.connect(weak=False)
def _on_worker_ready(**_: Any) -> None:
    heartbeat = _heartbeats.get(os.getpid())
    if heartbeat is not None:
        heartbeat.start()


@worker_shutdown.connect(weak=False)
def _on_worker_shutdown(**_: Any) -> None:
    heartbeat = _heartbeats.pop(os.getpid(), None)
    if heartbeat is not None:
        heartbeat.stop()
