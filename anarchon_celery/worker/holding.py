"""The worker's side of overlap protection (see :mod:`anarchon_celery.backends.busy`): a run of a
protected job holds its job from its start check until its end, which the worker tells the
store; while it runs (or waits to be retried), one heartbeat thread per worker process renews the
holds of all its runs in one call every third of ``anarchon_overlap_lease_ms``.

The heartbeat runs in the worker's main process, which knows every request it has
(``celery.worker.state.requests``): under prefork a task that holds the GIL in C code for longer
than the lease stalls only its pool process, not the heartbeat. Under the ``solo`` and
``threads`` pools it stalls the heartbeat too: a renewal that finds the hold gone (it ran out,
and another run of the job may have started) is logged as a warning, once per run.

A run's end is told by the process that sees it: the pool process after the task (its
``task_postrun``, unless the task will be retried), the main process for a task revoked or
whose pool process died. A worker killed whole tells nothing: its runs' holds run out, and
whoever finds one out records the run ``abandoned``.
"""

from __future__ import annotations

import logging
import os
import threading
from types import SimpleNamespace
from typing import Any

from celery.signals import worker_ready, worker_shutdown

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
    headers = getattr(request, "request_dict", None)
    run = run_headers_of(request if headers is None else SimpleNamespace(headers=headers))
    if run is None or not run["overlap"] or run["overlap"] == "allow" or run["job"] is None or run["slot"] is None:
        return None
    return str(run["job"]), int(run["slot"])


def end(app: Any, request: Any, worker: str) -> None:
    """Tell the store that the run of ``request`` ended (``worker`` "" when told by a process that
    did not start it); never raises (the hold runs out by itself)."""
    run = protected(request)
    if run is None and getattr(request, start_check.HOLDS, False):  # a message sent before its job was protected
        found_run = run_headers_of(request)
        run = (str(found_run["job"]), int(found_run["slot"])) if found_run is not None else None
    found = start_check.store_of(app) if run is not None else None
    if run is None or found is None:
        return
    try:
        found[0].end_busy(run[0], run[1], worker)
    except Exception as exc:  # noqa: BLE001 - its hold runs out by itself
        logger.warning(
            "anarchon: job %r slot %d: its end not told to the store (%r); the job is free once its hold "
            "runs out (anarchon_overlap_lease_ms)",
            run[0],
            run[1],
            exc,
        )


class Heartbeat:
    """One thread that renews the holds of the runs a worker process has."""

    def __init__(self, app: Any, worker: str) -> None:
        from ..backends import backend_for
        from ..settings import Settings

        settings = Settings.from_app(app)
        self.lease_ms = settings.overlap_lease_ms
        self.worker = worker
        self.backend = backend_for(app, settings, timeout=min(5.0, self.lease_ms / 3000))
        self._stop = threading.Event()
        self._lost: set[tuple[str, int]] = set()
        self.renewals = 0
        self._thread = threading.Thread(target=self._run, name="anarchon-heartbeat", daemon=True)

    def start(self) -> None:
        store = self.backend.lease_store
        try:
            fast = store is not None and store.hold_worker(self.worker)
        except Exception as exc:  # noqa: BLE001 - its holds are freed by their lease then
            logger.warning("anarchon: %s cannot tell when this worker is gone (%r)", self.backend.describe(), exc)
            fast = False
        logger.info(
            "anarchon: holds of running tasks renewed every %.1fs as %s; %s",
            self.lease_ms / 3000,
            self.worker,
            "freed at once if this worker dies" if fast else "freed by their lease if this worker dies",
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        if not self._thread.is_alive():
            store = self.backend.lease_store
            if store is not None:
                store.release_worker()
            self.backend.close()

    def _runs(self) -> list[tuple[str, int]]:
        """The protected runs this worker has started: running, or waiting to be retried (a retry
        is a message of its own, held until its ETA); not those it only prefetched."""
        from celery.worker import state

        for _ in range(3):
            try:
                active, known = list(state.active_requests), list(state.requests.values())
                break
            except RuntimeError:  # (changed while copied, by the consumer's thread)
                continue
        else:
            return []
        retrying = [r for r in known if (getattr(r, "request_dict", None) or {}).get("retries")]
        return sorted({run for request in active + retrying if (run := protected(request)) is not None})

    def beat(self) -> None:
        """Renew the holds of this process's runs now, once."""
        store = self.backend.lease_store
        runs = self._runs()
        if store is None or not runs:
            return
        renewed = store.renew_busy(runs, self.worker, self.lease_ms)
        self.renewals += 1
        for run, answer in zip(runs, renewed):
            if answer == LATE or (answer == LOST and run not in self._lost):
                if answer == LOST:
                    self._lost.add(run)
                logger.warning(
                    "anarchon: job %r slot %d: its hold on the job %s when renewed: this worker did not renew "
                    "it within anarchon_overlap_lease_ms (%d ms; a task holding the GIL in C code stalls the "
                    "heartbeat of the solo and threads pools)%s",
                    run[0],
                    run[1],
                    "had run out" if answer == LATE else "was gone",
                    self.lease_ms,
                    ": renewed, nobody took the job meanwhile"
                    if answer == LATE
                    else "; the job went on, and another run of it may be running beside this one",
                )
        self._lost &= set(runs)

    def _run(self) -> None:
        while not self._stop.wait(self.lease_ms / 3000):
            try:
                self.beat()
            except Exception as exc:  # noqa: BLE001 - tried again at the next beat
                logger.warning("anarchon: holds of running tasks not renewed (%r); tried again", exc)


@worker_ready.connect(weak=False)
def _on_worker_ready(sender: Any = None, **_: Any) -> None:
    """Start this worker's heartbeat, on a backend with leases (in its main process)."""
    app = getattr(sender, "app", None)
    if app is None or os.getpid() in _heartbeats or start_check.store_of(app) is None:
        return
    try:
        heartbeat = Heartbeat(app, str(getattr(sender, "hostname", None) or f"pid {os.getpid()}"))
    except Exception:  # noqa: BLE001 - a configuration the beat would refuse
        logger.warning("anarchon: no heartbeat for the holds of running tasks", exc_info=True)
        return
    _heartbeats[os.getpid()] = heartbeat
    heartbeat.start()


@worker_shutdown.connect(weak=False)
def _on_worker_shutdown(**_: Any) -> None:
    heartbeat = _heartbeats.pop(os.getpid(), None)
    if heartbeat is not None:
        heartbeat.stop()
