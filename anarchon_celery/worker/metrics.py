"""Prometheus metrics of a worker: the runs' tasks it started, refused (fencing, overlap) and
finished, by job; when each job last succeeded; the history events waiting in its buffer.

Served on ``/metrics`` at ``anarchon_worker_metrics_port`` by the worker's main process, one
exporter per worker. Under the prefork pool the tasks run in the pool's processes, whose counts
the main process cannot see: prometheus-client's multiprocess mode carries them, each process
writing its values to a file of its own in ``PROMETHEUS_MULTIPROC_DIR``, which the exporter adds
up (a pool process that ended, after ``worker_max_tasks_per_child``, still counts). That
directory must be set, to a directory of that worker's alone, before the worker starts; the
worker empties it of earlier runs' files when it starts. The solo and thread pools need nothing.
Only ``anarchon_worker_*`` metrics are served there (a beat run with ``-B`` serves its own on
``anarchon_metrics_port``). Labels are job names and fixed sets of reasons and statuses.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from celery.signals import worker_init, worker_process_shutdown, worker_ready, worker_shutdown

from .. import metrics as beat_side

__all__ = ["MULTIPROC_ENV", "WorkerMetrics", "registry", "serve", "worker_metrics"]

logger = logging.getLogger(__name__)

#: prometheus-client's own variable: the directory of the processes' files, multiprocess mode.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: The statuses of a run finished in a worker, as history has them.
STATUSES = ("succeeded", "failed", "abandoned", "revoked")
#: Why a worker did not run a run's task: ``fencing`` (taken over, or started already by another
#: message of the run), ``overlap`` (its job busy: skipped), ``pending`` (busy: kept to be sent
#: again), ``duplicate`` (another worker runs this very run: its message delivered again).
REFUSALS = ("fencing", "overlap", "pending", "duplicate")


class WorkerMetrics:
    """One process's worker-side counters (see :func:`worker_metrics`). Counting never fails a
    task: an error is logged once and the metrics stop."""

    def __init__(self) -> None:
        p = beat_side.prometheus_client
        self.on = p is not None
        self._warned = False
        if p is None:
            return
        #: Only used when a single process runs the tasks; in multiprocess mode the files are read.
        self.registry = r = p.CollectorRegistry()
        self.started = p.Counter(
            "anarchon_worker_runs_started", "Runs' tasks this worker started, by job.", ["anarchon_job"], registry=r
        )
        self.refused = p.Counter(
            "anarchon_worker_starts_refused",
            "Runs' tasks this worker did not run, by job and reason: fencing (taken over, or started "
            "already), overlap (its job busy: skipped), pending (busy: sent again later), duplicate.",
            ["anarchon_job", "reason"],
            registry=r,
        )
        self.finished = p.Counter(
            "anarchon_worker_runs_finished",
            "Runs' tasks finished in this worker, by job and status: succeeded, failed, abandoned, revoked.",
            ["anarchon_job", "status"],
            registry=r,
        )
        self.last_success = p.Gauge(
            "anarchon_worker_last_success_timestamp_seconds",
            "When a run of each job last succeeded in this worker.",
            ["anarchon_job"],
            registry=r,
            multiprocess_mode="max",
        )
        self.buffer = p.Gauge(
            "anarchon_worker_history_buffer_events",
            "History events waiting to be written, in all of this worker's processes.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.dropped = p.Counter(
            "anarchon_worker_history_dropped",
            "History events dropped, the buffer full (a long outage of the backend).",
            registry=r,
        )
        r.register(_Started())

    def _guard(self, count: Any) -> None:
        if not self.on:
            return
        try:
            count()
        except Exception:  # noqa: BLE001 - a metric must never fail a task
            if not self._warned:
                logger.warning("anarchon: worker metrics not counted from now on in this process", exc_info=True)
            self._warned, self.on = True, False

    def run_started(self, job: str) -> None:
        self._guard(lambda: self.started.labels(job).inc())

    def start_refused(self, job: str, reason: str) -> None:
        self._guard(lambda: self.refused.labels(job, reason).inc())

    def run_finished(self, job: str, status: str) -> None:
        def count() -> None:
            self.finished.labels(job, status).inc()
            if status == "succeeded":
                self.last_success.labels(job).set(time.time())

        self._guard(count)

    def buffered(self, change: int) -> None:
        """Events put in (positive) or gone from (negative) this process's history buffer."""
        if change:
            self._guard(lambda: self.buffer.inc(change))

    def dropped_one(self) -> None:
        self._guard(lambda: self.dropped.inc())


_MADE: WorkerMetrics | None = None
_MADE_LOCK = threading.Lock()


def worker_metrics() -> WorkerMetrics:
    """This process's :class:`WorkerMetrics`, made at first use (a pool process inherits its
    parent's, whose values prometheus-client moves to the child's own file)."""
    global _MADE
    if _MADE is None:
        with _MADE_LOCK:
            if _MADE is None:
                try:
                    _MADE = WorkerMetrics()
                except Exception as exc:  # noqa: BLE001 - PROMETHEUS_MULTIPROC_DIR unusable, say
                    logger.error(
                        "anarchon: worker metrics not counted: %s (is %s a writable directory?)", exc, MULTIPROC_ENV
                    )
                    made = WorkerMetrics.__new__(WorkerMetrics)
                    made.on, made._warned = False, True
                    _MADE = made
    return _MADE


# -- the exporter, in the worker's main process ------------------------------------------------


def _pid_of(path: str) -> int | None:
    stem = os.path.basename(path).rsplit(".", 1)[0]
    tail = stem.rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clear_earlier_runs(folder: str) -> int:
    """Remove every process's files but this one's, at the worker's start, before its pool is
    made: they are an earlier run's (the folder is the worker's alone; a container started again
    reuses its process ids, so a file's process being alive proves nothing). Returns how many."""
    removed = 0
    for path in glob.glob(os.path.join(folder, "*.db")):
        if _pid_of(path) != os.getpid():
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
                removed += 1
    return removed


class _WorkerFiles:
    """The ``anarchon_worker_*`` metrics of every process of this worker, from their files. A
    pool process killed (not stopped) leaves its buffer gauge's file behind: dropped here."""

    def __init__(self, folder: str) -> None:
        from prometheus_client import multiprocess

        self.folder = folder
        self.inner = multiprocess.MultiProcessCollector(None, path=folder)
        self._multiprocess = multiprocess

    def collect(self) -> Iterator[Any]:
        for path in glob.glob(os.path.join(self.folder, "gauge_live*.db")):
            pid = _pid_of(path)
            if pid is not None and not _alive(pid):
                with contextlib.suppress(FileNotFoundError):  # (two scrapes at once)
                    self._multiprocess.mark_process_dead(pid, self.folder)
        for family in self.inner.collect():
            if family.name.startswith("anarchon_worker_"):
                yield family


#: When this process started (imported this module): a worker's start, in its main process.
STARTED_AT = time.time()


class _Started:
    """When the worker started (what an alert on a job that has not succeeded since the
    workers started reads)."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        yield GaugeMetricFamily(
            "anarchon_worker_started_timestamp_seconds", "When this worker started.", value=STARTED_AT
        )


class _Exporter:
    def __init__(self) -> None:
        self.server: Any = None
        self.port: int | None = None

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


EXPORTER = _Exporter()


def registry() -> Any:
    """The worker's metrics as a prometheus-client registry, to mount in a server of your own
    (``prometheus_client.make_wsgi_app(registry())``): every process's, from their files, when
    ``PROMETHEUS_MULTIPROC_DIR`` is set; else this process's. None without prometheus-client."""
    p = beat_side.prometheus_client
    if p is None:
        return None
    folder = os.environ.get(MULTIPROC_ENV)
    if not folder:
        return worker_metrics().registry  # (with the start time: see WorkerMetrics)
    made = p.CollectorRegistry()
    made.register(_WorkerFiles(folder))
    made.register(_Started())
    return made


def serve(app: Any, pool: str) -> int | None:
    """Serve the worker's metrics if ``anarchon_worker_metrics_port`` is set; the port, or None
    (off, or not possible: said in the log). ``pool`` is the pool's module (prefork, solo...)."""
    from ..errors import ConfigError
    from ..settings import Settings

    try:
        settings = Settings.from_app(app)
    except ConfigError as exc:
        logger.error("anarchon: worker metrics not served: %s", exc)
        return None
    if settings.worker_metrics_port is None or EXPORTER.server is not None:
        return None
    p = beat_side.prometheus_client
    if p is None:
        logger.error(
            "anarchon: anarchon_worker_metrics_port is set, but prometheus-client is not installed: "
            "install anarchon_celery[metrics]"
        )
        return None
    folder = os.environ.get(MULTIPROC_ENV)
    if folder:
        how = f"from every process's files in {folder}" + (f" ({_CLEARED} of earlier runs removed)" if _CLEARED else "")
    elif pool.endswith("prefork"):
        logger.error(
            "anarchon: worker metrics not served: under the prefork pool the tasks run in other processes, "
            "whose counts need prometheus-client's multiprocess mode. Set %s to an empty directory of this "
            "worker's own before starting it (see docs/operations.md#worker-metrics)",
            MULTIPROC_ENV,
        )
        return None
    else:
        how = "from this process"
    served = registry()
    try:
        server, _ = p.start_http_server(settings.worker_metrics_port, settings.metrics_address, registry=served)
    except OSError as exc:
        logger.error(
            "anarchon: worker metrics not served: %s:%s cannot be bound (%s); give each worker on this host "
            "its own anarchon_worker_metrics_port",
            settings.metrics_address,
            settings.worker_metrics_port,
            exc,
        )
        return None
    EXPORTER.server, EXPORTER.port = server, server.server_port
    logger.info(
        "anarchon: worker metrics served on http://%s:%d/metrics, %s", settings.metrics_address, EXPORTER.port, how
    )
    return EXPORTER.port


#: The files of earlier runs removed at this worker's start.
_CLEARED = 0


@worker_init.connect(weak=False)
def _on_worker_init(**_: Any) -> None:
    """In the worker's main process, before its pool (and a ``-B`` beat) is started: the
    multiprocess folder emptied of earlier runs' files."""
    global _CLEARED
    folder = os.environ.get(MULTIPROC_ENV)
    if folder and beat_side.prometheus_client is not None and os.path.isdir(folder):
        _CLEARED = clear_earlier_runs(folder)


@worker_ready.connect(weak=False)
def _on_worker_ready(sender: Any = None, **_: Any) -> None:
    """Served once the worker is set up (its logging too: what this says is seen)."""
    controller = getattr(sender, "controller", None)  # (the consumer's worker)
    app = getattr(sender, "app", None)
    if app is None:
        return
    pool = getattr(getattr(controller, "pool_cls", None), "__module__", "") or ""
    serve(app, pool)


@worker_process_shutdown.connect(weak=False)
def _on_process_shutdown(pid: int | None = None, **_: Any) -> None:
    folder = os.environ.get(MULTIPROC_ENV)
    if folder and beat_side.prometheus_client is not None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid or os.getpid(), folder)


@worker_shutdown.connect(weak=False)
def _on_worker_shutdown(**_: Any) -> None:
    EXPORTER.stop()
