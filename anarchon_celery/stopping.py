"""Stopping promptly: a stop signal takes effect within :data:`GRACE_S`, whatever the broker does.

The scheduler lets the claims and sends in progress finish when SIGTERM or SIGINT arrives, so
that a run won is not left unsent. But the broker may not answer at all (a network cut, a node
that hangs): its waits would then last until the runs' deadlines (``max_late_ms``), far past the
30 s Kubernetes or the 10 s ``docker stop`` gives before SIGKILL. So, once a stop is requested,
the work in progress gets :data:`GRACE_S` more; after that, :class:`Stopping` is raised inside it
(from a SIGALRM handler, which the main thread runs even while it is blocked on a socket) and
every wait that starts later raises it at once. A claim still undecided then is not won; a task
written but not yet confirmed may or may not have reached its queue.

Only the main thread's work inside :func:`waiting` is interrupted: the regions where the
scheduler talks to the broker, whose connections are thrown away afterwards.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["GRACE_S", "StopSignals", "Stopping", "expired", "request", "requested", "reset", "waiting"]

logger = logging.getLogger(__name__)

#: Seconds the work in progress gets once a stop is requested.
GRACE_S = 2.0
#: Seconds between two interruptions of broker work once the grace period is over.
REPEAT_S = 0.25


class Stopping(BaseException):
    """A stop was requested and its grace period is over: the broker work in progress is given up.

    A BaseException, as KeyboardInterrupt is: the ``except Exception`` of a retry loop must not
    take it for a broker error and try again."""


class _State:
    deadline: float | None = None  # time.monotonic() after which broker work is given up
    depth = 0  # waiting() regions entered by the main thread and not left
    previous_alarm: Any = None
    alarm_armed = False


_state = _State()


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def requested() -> bool:
    """Whether a stop was requested."""
    return _state.deadline is not None


def expired() -> bool:
    """Whether a stop was requested and its grace period is over."""
    return _state.deadline is not None and time.monotonic() >= _state.deadline


def request(grace: float = GRACE_S) -> None:
    """Ask for a stop: what is in progress gets ``grace`` seconds more. Called from a signal
    handler in the main thread. A second request ends the grace at once."""
    now = time.monotonic()
    if _state.deadline is not None:
        _state.deadline = now
        if _state.depth:
            raise Stopping("stop requested again")
        return
    _state.deadline = now + grace
    if _main_thread():
        with contextlib.suppress(ValueError, OSError):  # no SIGALRM here: waits still check the deadline
            _state.previous_alarm = signal.signal(signal.SIGALRM, _on_alarm)
            # Then every REPEAT_S: cleanup code that blocks on the broker again is cut short too.
            signal.setitimer(signal.ITIMER_REAL, max(grace, 0.001), REPEAT_S)
            _state.alarm_armed = True


def _on_alarm(signum: int, frame: Any) -> None:
    if _state.depth:
        raise Stopping(f"still busy {GRACE_S:g}s after the stop signal")


@contextlib.contextmanager
def waiting() -> Iterator[None]:
    """A region of the main thread that talks to the broker and may be given up: raises
    :class:`Stopping` on entry once the grace period is over, and inside once it runs out.
    Other threads are never interrupted."""
    if not _main_thread():
        yield
        return
    if expired():
        raise Stopping("stop requested")
    _state.depth += 1
    try:
        yield
    finally:
        _state.depth -= 1


def reset() -> None:
    """Forget the stop request and its alarm (a scheduler closing for good, or a test)."""
    if _state.alarm_armed and _main_thread():
        with contextlib.suppress(ValueError, OSError):
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, _state.previous_alarm or signal.SIG_DFL)
    _state.alarm_armed = False
    _state.previous_alarm = None
    _state.deadline = None


class StopSignals:
    """SIGTERM and SIGINT deferred while the scheduler is :attr:`busy` claiming or sending, so
    that a run won is not left unsent: the signal's own handler (beat's, which closes the
    connections and exits) is called by :meth:`deliver` once the work is done, and the work gets
    :data:`GRACE_S` at most, whatever the broker does (a second signal: at once). With no work
    in progress, a signal is handled at once, as ever."""

    def __init__(self) -> None:
        #: Whether claims or sends are in progress (set by the scheduler around them).
        self.busy = False
        self._pending: tuple[Any, int, Any] | None = None
        self._installed: dict[int, tuple[Any, Any]] = {}

    @property
    def pending(self) -> bool:
        """Whether a stop signal arrived during the work and waits for :meth:`deliver`."""
        return self._pending is not None

    def install(self) -> None:
        """Wrap the handlers of SIGTERM and SIGINT (in the main thread only: elsewhere signals
        cannot be handled)."""
        if not _main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            original = signal.getsignal(signum)
            if not callable(original):
                continue

            def handler(signum: int, frame: Any, original: Any = original) -> None:
                if self.busy:
                    first = self._pending is None
                    self._pending = (original, signum, frame)
                    if first:
                        logger.info("anarchon: stop requested: finishing the runs in progress (%gs at most)", GRACE_S)
                    request()  # a second signal raises Stopping here, inside the broker wait
                else:
                    logger.info("anarchon: %s received with no run in progress: stopping", signal.Signals(signum).name)
                    request()  # closing the connections is bounded too
                    original(signum, frame)

            signal.signal(signum, handler)
            self._installed[signum] = (handler, original)

    def deliver(self) -> None:
        """Call the handler of the signal that arrived during the work, now that it is done."""
        if self._pending is None:
            return
        handler, signum, frame = self._pending
        self._pending = None
        if not expired():
            logger.info("anarchon: stopping, the runs in progress are done")
        handler(signum, frame)

    def restore(self) -> None:
        """Put the handlers wrapped back (those not replaced since)."""
        for signum, (ours, original) in self._installed.items():
            if signal.getsignal(signum) is ours:
                signal.signal(signum, original)
        self._installed.clear()
