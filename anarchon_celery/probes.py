"""The HTTP endpoint a beat serves its probes and metrics on (``anarchon_metrics_port``):
``/healthz`` for liveness and ``/readyz`` for readiness, each 200 or 503 with one line saying why,
and ``/metrics`` for Prometheus (see :mod:`.metrics`).

It runs in a daemon thread of the beat's process and only reads what the scheduler loop marked
(:mod:`.health`): it never calls the broker or the store itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from . import metrics, stopping
from .errors import AnarchonError
from .health import Health, Heartbeat

if TYPE_CHECKING:
    from .backends.base import Backend
    from .settings import Settings

__all__ = ["BeatProbes", "ProbeServer"]

logger = logging.getLogger(__name__)


class ProbeServer:
    """Serves ``health()`` on ``address:port`` (port 0: any free one, see :attr:`port`)."""

    def __init__(self, address: str, port: int, health: Callable[[], Health]) -> None:
        self.health = health
        self._server = ThreadingHTTPServer((address, port), _handler(self))  # OSError when taken
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="anarchon-probes", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> ProbeServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()


def _handler(server: ProbeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path = self.path.split("?", 1)[0].rstrip("/")
            if path == "/metrics":
                self._metrics()
                return
            if path not in ("/healthz", "/readyz"):
                self._answer(404, "not found: /healthz (alive), /readyz (ready) and /metrics are served here")
                return
            try:
                health = server.health()
            except Exception as exc:  # noqa: BLE001 - a probe must answer, never hang up
                logger.exception("anarchon: the health check failed")
                self._answer(503, f"not alive: the health check failed ({type(exc).__name__}: {exc})")
                return
            good = health.live if path == "/healthz" else health.ready
            self._answer(200 if good else 503, health.reason)

        def _metrics(self) -> None:
            made = metrics.exposition()
            if made is None:
                self._answer(404, "no metrics: install prometheus-client (pip install 'anarchon_celery[metrics]')")
                return
            self._answer(200, *made)

        def _answer(self, status: int, line: str | bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            body = line if isinstance(line, bytes) else (line + "\n").encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
            logger.debug("anarchon: probe %s", format % args)

    return Handler


class BeatProbes:
    """A beat's :class:`~.health.Heartbeat`, what makes it ready, and its probe server when
    ``anarchon_metrics_port`` is set. The scheduler marks the heartbeat; this reads it."""

    #: Seconds between two attempts to reach a backend that did not answer at the start.
    OPEN_AGAIN_S = 5.0

    def __init__(self) -> None:
        self.heartbeat = Heartbeat(60.0)
        self.server: ProbeServer | None = None
        self.backend: Backend | None = None
        #: Whether the backend answered since the start (not in an outage is not enough: a
        #: backend that never answered has had no outage noted yet).
        self.answered = False
        self._tried_at = -self.OPEN_AGAIN_S

    def start(self, settings: Settings, backend: Backend) -> None:
        """Serve the probes (when a port is set) from now on, through the set-up."""
        self.heartbeat.stall_s = settings.health_stall_ms / 1000
        self.backend = backend
        if settings.metrics_port is None or self.server is not None:
            return
        try:
            self.server = ProbeServer(settings.metrics_address, settings.metrics_port, self.health).start()
        except OSError as exc:
            logger.error(
                "anarchon: health probes not served: %s:%s cannot be bound (%s); is another beat on this host "
                "using anarchon_metrics_port %s? Give each its own port",
                settings.metrics_address,
                settings.metrics_port,
                exc,
                settings.metrics_port,
            )
            return
        logger.info(
            "anarchon: health probes served on http://%s:%d/healthz and /readyz, %s",
            settings.metrics_address,
            self.server.port,
            "metrics on /metrics" if metrics.AVAILABLE else "no metrics (install anarchon_celery[metrics] for them)",
        )

    def set_up(self, reachable: bool) -> None:
        self.answered = reachable
        self.heartbeat.set_up()

    def reach(self) -> bool:
        """While the backend has not answered since the start, ask it again now and then (a beat
        with no run due for hours would not know it came back); whether it answered just now.
        The wait is the backend's own connect timeout, at a time when no run can be claimed anyway."""
        if self.answered or self.backend is None:
            return False
        now = time.monotonic()
        if now - self._tried_at < self.OPEN_AGAIN_S:
            return False
        self._tried_at = now
        try:
            self.backend.open()
        except AnarchonError:
            return False
        self.answered = True
        return True

    def health(self) -> Health:
        backend = self.backend
        if backend is None:
            return self.heartbeat.check(False, "the backend", stopping.requested())
        return self.heartbeat.check(
            backend.in_outage() or not self.answered, backend.describe(), stopping.requested(), backend.unanswered_s()
        )

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
