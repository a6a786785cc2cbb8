"""An in-process backend, for testing schedules without a broker.

Every Scheduler sharing one MemoryBackend object races for slots as beat instances sharing a
RabbitMQ would. It is not shared between processes.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import clock
from ..history import EVENTS_PER_RUN, decode_event
from .base import Backend, Claim, Outcome, check_prefix, check_slot_ttl
from .births import born
from .definitions import JobDef, check_change, removed
from .pauses import Pause
from .peers import Peers

__all__ = ["MemoryBackend"]


class MemoryBackend(Backend):
    """Claims held in a dict, forgotten ``slot_ttl_ms`` after they were taken."""

    title = "the memory backend"

    def __init__(self, prefix: str = "cron.", slot_ttl_ms: int = 300_000) -> None:
        self.prefix = check_prefix(prefix)
        self.slot_ttl_ms = check_slot_ttl(slot_ttl_ms)
        self._lock = threading.Lock()
        self._taken: dict[tuple[str, int], tuple[str, float]] = {}
        self._history: dict[str, deque[dict[str, Any]]] = {}
        self._peers: list[Peers] = []
        self._pauses: dict[str, Pause] = {}
        self._defs: dict[str, JobDef] = {}
        self._changes: list[str] = []  # the runtime jobs changed, in order
        self._births: dict[str, int] = {}  # see introduce

    def open(self) -> None:
        pass

    def share_definitions(self, instance: str, definitions: Mapping[str, Mapping[str, str]]) -> None:
        peers = Peers(instance, definitions)
        with self._lock:
            others, self._peers = list(self._peers), [*self._peers, peers]
        for other in others:
            peers.heard(other.announcement(hello=False))
            other.heard(peers.announcement(hello=False))

    def introduce(self, since: Mapping[str, int]) -> dict[str, int]:
        with self._lock:
            for job, at in since.items():
                self._births[job] = born(self._births.get(job), None, at)
            return {job: self._births[job] for job in since}

    def claim(
        self, claims: Sequence[Claim], instance: str, *, on_won: Callable[[Claim], None] | None = None
    ) -> list[Outcome]:
        now = time.monotonic()
        now_ms = clock.now_ms()
        outcomes = []
        with self._lock:
            self._forget(now)
            for claim in claims:
                key = (claim.job, claim.slot)
                kept = self._defs.get(claim.job)
                if claim.deadline_ms is not None and now_ms > claim.deadline_ms:
                    outcomes.append(Outcome.UNDECIDED)
                elif claim.version and (kept is None or kept.version != claim.version):
                    outcomes.append(Outcome.STALE)
                elif key in self._taken:
                    outcomes.append(Outcome.LOST)
                else:
                    self._taken[key] = (instance, now + self.slot_ttl_ms / 1000)
                    pause = self._pauses.get(claim.job)
                    outcomes.append(Outcome.PAUSED if pause and pause.in_effect(now_ms) else Outcome.WON)
        if on_won is not None:
            for claim, outcome in zip(claims, outcomes):
                if outcome is Outcome.WON:
                    on_won(claim)
        return outcomes

    def pause(self, job: str, pause: Pause) -> None:
        with self._lock:
            self._pauses[job] = pause

    def resume(self, job: str) -> Pause | None:
        with self._lock:
            pause = self._pauses.pop(job, None)
        return pause if pause is not None and pause.in_effect(clock.now_ms()) else None

    def pauses(self) -> dict[str, Pause]:
        now = clock.now_ms()
        with self._lock:
            return {job: pause for job, pause in sorted(self._pauses.items()) if pause.in_effect(now)}

    def put_job(self, name: str, entry: Mapping[str, Any], *, base: int | None, by: str) -> JobDef:
        with self._lock:
            version = check_change(name, self._defs.get(name), base)
            kept = self._defs[name] = JobDef(name, version, dict(entry), by, clock.now_ms())
            self._changes.append(name)
        return kept

    def remove_job(self, name: str, *, base: int | None) -> JobDef:
        with self._lock:
            gone = removed(name, self._defs.get(name), base)
            del self._defs[name]
            self._pauses.pop(name, None)
            self._changes.append(name)
        return gone

    def runtime_jobs(self, names: Sequence[str] | None = None) -> dict[str, JobDef]:
        with self._lock:
            return {n: d for n, d in sorted(self._defs.items()) if names is None or n in names}

    def job_changes(self, since: Any) -> tuple[set[str] | None, Any]:
        with self._lock:
            end = len(self._changes)
            return (set() if since is None else set(self._changes[since:end])), end

    def holder(self, job: str, slot: int) -> str | None:
        """The instance holding a slot, or None: for tests."""
        with self._lock:
            self._forget(time.monotonic())
            taken = self._taken.get((job, slot))
            return taken[0] if taken else None

    def _forget(self, now: float) -> None:
        for key in [k for k, (_, expires) in self._taken.items() if expires <= now]:
            del self._taken[key]

    def record(self, job: str, event: bytes, history_size: int) -> bool:
        decoded = decode_event(event)
        if decoded is None:
            return False
        with self._lock:
            events = self._history.setdefault(job, deque())
            events.append(decoded)
            while len(events) > history_size * (EVENTS_PER_RUN + 1):
                events.popleft()
        return True

    def read_history(self, jobs: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        with self._lock:
            return {job: list(self._history.get(job, ())) for job in jobs}

    def describe(self) -> str:
        return f"memory (prefix {self.prefix!r}, slot_ttl_ms {self.slot_ttl_ms})"

    def place(self) -> str:
        return f"the memory of process {socket.gethostname()}:{os.getpid()}, prefix {self.prefix!r}"

    def close(self) -> None:
        pass
