"""History on Redis: a list per job (``<prefix>history.<job>``), trimmed by size, written by
the worker (and by beats for the runs they do not send). A part of :class:`~.redis.RedisBackend`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import BrokerUnavailable
from ..history import EVENTS_PER_RUN, decode_event
from .outages import Outages

__all__ = ["RedisHistory"]

logger = logging.getLogger(__name__)


class RedisHistory:
    """The history steps of the Redis backend, which gives ``client``, ``prefix``, its errors and
    its outages."""

    client: Any
    prefix: str
    _outages: Outages
    _refused: type[BaseException]
    _errors: tuple[type[BaseException], ...]
    describe: Callable[[], str]

    def record(self, job: str, event: bytes, history_size: int) -> bool:
        return self.record_many([(job, event, history_size)]) == 1

    def record_many(self, events: Sequence[tuple[str, bytes, int]]) -> int:
        kept = [(job, event, size) for job, event, size in events if decode_event(event) is not None]
        if not kept:
            return 0
        pipe = self.client.pipeline(transaction=False)
        for job, event, _ in kept:
            pipe.rpush(f"{self.prefix}history.{job}", event)
        for job, size in {job: size for job, _, size in kept}.items():
            pipe.ltrim(f"{self.prefix}history.{job}", -size * (EVENTS_PER_RUN + 1), -1)
        try:
            with self._outages.asking():  # (in workers too: no outage of the beat's)
                pipe.execute()
        except (self._refused, *self._errors) as exc:
            logger.warning("anarchon: %d history event(s) not written to %s (%s)", len(kept), self.describe(), exc)
            return 0
        return len(kept)

    def read_history(self, jobs: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        pipe = self.client.pipeline(transaction=False)
        for job in jobs:
            pipe.lrange(f"{self.prefix}history.{job}", 0, -1)
        try:
            lists = pipe.execute() if jobs else []
        except (self._refused, *self._errors) as exc:
            raise BrokerUnavailable(f"cannot read history from {self.describe()}: {exc}") from exc
        found: dict[str, list[dict[str, Any]]] = {}
        for job, raw in zip(jobs, lists):
            found[job] = [decoded for event in raw if (decoded := decode_event(event)) is not None]
        return found
