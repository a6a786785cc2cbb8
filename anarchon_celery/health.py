"""Whether a beat is alive and ready, for probes: the age of its scheduler loop's last sign of
progress against when it was due, and whether its backend answered the loop's last calls.

A thread that answers a probe by pinging the broker would say "healthy" while the loop is wedged
(celery PR #10422's pitfall). Here the loop marks its own progress (:class:`Heartbeat`), and the
answer is read from those marks and from the backend's outage state, which only the loop's calls
change: the probe's thread never asks the broker or the store anything.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["UNANSWERED_S", "Health", "Heartbeat"]

#: Seconds a call of the scheduler loop may wait for its backend's answer before the beat is no
#: longer ready. A store answers a batch of 500 claims in well under a second (0.1 to 0.3 s on a
#: 2-core machine); a call unanswered this long finds the store frozen, gone or cut off, long
#: before the call itself gives up (the store's ``timeout``, 5 s on Redis, and once more on a new
#: connection), and the runs due meanwhile wait.
UNANSWERED_S = 2.0


@dataclass(frozen=True)
class Health:
    """A probe's answer: ``live`` (the loop moves), ``ready`` (alive, and claiming: set up, its
    backend answering, no stop asked for), and one line saying why."""

    live: bool
    ready: bool
    reason: str


class Heartbeat:
    """The scheduler loop's marks, read by another thread.

    The loop calls :meth:`turning` as a turn starts, :meth:`progressed` after each batch of claims
    within it, and :meth:`sleeping` as it goes to sleep. It is alive while its last mark is
    younger than ``stall_s``, counted from the end of the sleep it announced when it sleeps: a long
    turn that claims batch after batch is alive; a call that never returns is not.
    """

    def __init__(self, stall_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.stall_s = stall_s
        self._clock = clock
        self._lock = threading.Lock()
        self._mark = clock()
        self._wake_at: float | None = None  # set while asleep: when the loop said it would wake
        self._turns = 0
        self._set_up = False

    def set_up(self) -> None:
        """The schedule is set up: the loop's first turn comes next."""
        with self._lock:
            self._set_up = True
            self._mark, self._wake_at = self._clock(), None

    def turning(self) -> None:
        with self._lock:
            self._mark, self._wake_at = self._clock(), None

    def progressed(self) -> None:
        with self._lock:
            self._mark = self._clock()

    def sleeping(self, seconds: float) -> None:
        with self._lock:
            now = self._clock()
            self._turns += 1
            self._mark, self._wake_at = now, now + max(0.0, seconds)

    def check(self, in_outage: bool, backend: str, stopping: bool = False, unanswered_s: float = 0.0) -> Health:
        """The beat's health now; ``in_outage`` is whether the backend failed the loop's last
        calls, ``backend`` what to call it in the reason (never with a password), ``stopping``
        whether a stop was asked for (no longer ready: the loop finishes the runs in progress),
        ``unanswered_s`` how long the backend has not answered a call (see :data:`UNANSWERED_S`)."""
        with self._lock:
            now = self._clock()
            due = self._wake_at if self._wake_at is not None else self._mark
            late = now - due
            set_up, turns, mark = self._set_up, self._turns, self._mark
            asleep = self._wake_at is not None
        if late > self.stall_s:
            where = "in its set-up" if not set_up else "past its wake-up" if asleep else "in a turn"
            return Health(
                False,
                False,
                f"not alive: the scheduler loop has not moved for {late:.1f} s {where} "
                f"(anarchon_health_stall_ms allows {self.stall_s:g} s)",
            )
        if not set_up:
            return Health(True, False, "alive, not ready: setting up the schedule")
        if stopping:
            return Health(True, False, "alive, not ready: stopping")
        if in_outage:
            return Health(True, False, f"alive, not ready: {backend} does not answer; runs are not claimed")
        if unanswered_s > UNANSWERED_S:
            return Health(
                True, False, f"alive, not ready: {backend} has not answered for {unanswered_s:.1f} s; runs wait for it"
            )
        if not turns:
            return Health(True, False, "alive, not ready: the scheduler loop's first turn is in progress")
        return Health(True, True, f"ready: the scheduler loop moved {now - mark:.1f} s ago; {backend} answers")
