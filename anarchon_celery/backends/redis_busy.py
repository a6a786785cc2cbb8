"""The worker's start check and overlap protection on Redis (see :mod:`.busy`), each one script of
:mod:`.redis_busy_scripts` on Redis's clock: a part of :class:`~.redis.RedisBackend`."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .base import Start
from .busy import Freed, JobBusy
from .redis_busy_scripts import END, NEXT_PENDING, RENEW, START

__all__ = ["RedisOverlap", "freed_of"]


def freed_of(answer: bytes | str) -> tuple[str, Freed] | None:
    """A run freed, from a script's ``freed:`` answer; None for any other answer."""
    text = answer.decode() if isinstance(answer, bytes) else answer
    if not text.startswith("freed:"):
        return None
    job, slot, run, worker, abandoned = json.loads(text[len("freed:") :])
    return str(job), Freed(int(slot), str(run), str(worker), bool(abandoned))


class RedisOverlap:
    """The scripts of the worker's start check, the workers' heartbeats, a run's end and the
    pending runs; mixed into the Redis backend, which gives ``client`` and ``prefix``."""

    client: Any
    prefix: str
    lease_ms: int
    slot_ttl_ms: int

    if TYPE_CHECKING:

        def store_now_ms(self) -> int: ...

    def busy_states(self, jobs: Sequence[str]) -> tuple[dict[str, JobBusy], int]:
        """The overlap states of ``jobs`` that have one (the keys ``<prefix>busy.<job>``), with
        Redis's clock; a read that frees nothing: what a page or a command shows."""
        names = sorted(set(jobs))
        texts = self.client.mget([f"{self.prefix}busy.{job}" for job in names]) if names else []
        states = {job: state for job, text in zip(names, texts) if (state := JobBusy.decode(text)) is not None}
        return states, self.store_now_ms()

    def _register_overlap(self) -> None:
        register = self.client.register_script
        self._start_script = register(START)
        self._renew_script = register(RENEW)
        self._end_script = register(END)
        self._pending_script = register(NEXT_PENDING)

    def _start(self, job: str, slot: int, token: int, redelivered: bool, run: str, worker: str, lease_ms: int) -> Start:
        allowed, overlap, left, freed, holds = self._start_script(
            args=[self.prefix, job, str(slot), str(token), "1" if redelivered else "0", run, worker, lease_ms]
        )
        verdict = {b"yes": True, b"no": False}.get(allowed)
        found = freed_of(freed) if freed else None
        return Start(verdict, overlap.decode(), int(left), found[1] if found else None, bool(holds))

    def _renew_busy(self, runs: Sequence[tuple[str, int, str]], lease_ms: int) -> list[str | None]:
        args: list[Any] = [self.prefix, lease_ms]
        for job, slot, holder in runs:
            args += [job, str(slot), holder]
        return [answer.decode() or None for answer in self._renew_script(args=args)]

    def _end_busy(self, job: str, slot: int, holder: str, retrying: bool) -> bool:
        return bool(self._end_script(args=[self.prefix, job, str(slot), holder, "1" if retrying else "0"]))

    def _next_pending(
        self, jobs: Sequence[str], instance: str, deadline_ms: Mapping[str, int]
    ) -> tuple[list[tuple[str, int, int]], list[tuple[str, Freed]]]:
        args: list[Any] = [self.prefix, instance, self.lease_ms, self.slot_ttl_ms]
        for job in jobs:
            args += [job, str(deadline_ms.get(job, -1))]
        taken: list[tuple[str, int, int]] = []
        freed: list[tuple[str, Freed]] = []
        for answer in self._pending_script(args=args):
            found = freed_of(answer)
            if found is not None:
                freed.append(found)
                continue
            _, job, slot, token = answer.decode().split(":")
            taken.append((job, int(slot), int(token)))
        return taken, freed
