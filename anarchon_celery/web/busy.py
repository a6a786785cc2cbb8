"""Whether jobs protected from overlap are busy: read from the store, as the claims and the
workers' start checks leave each job's state (see :mod:`anarchon_celery.backends.busy`).

A job is busy while a run holds it: ``queued`` (won and sent, no worker started it yet) or
``running`` (a worker started it and renews its hold), until the hold's end on the store's clock.
Only the stores protect jobs from overlap (Redis, PostgreSQL, SQLite): on another backend no job
is ever busy. A read changes nothing: no row is locked and no hold that ran out is freed (the
next claim or start check of the job does that).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..backends.base import Backend
from ..backends.redis import RedisBackend
from ..backends.sql import SqlBackend
from ..errors import BrokerUnavailable

__all__ = ["Busy", "busy_jobs"]


@dataclass(frozen=True)
class Busy:
    """The run that holds a job: its slot, ``queued`` or ``running`` (then on ``worker``), until
    ``until_ms`` (epoch ms, the store's clock) unless renewed; and how many runs wait for it."""

    slot: int
    state: str
    until_ms: int
    worker: str = ""
    pending: int = 0


def busy_jobs(backend: Backend, jobs: Sequence[str]) -> dict[str, Busy]:
    """The jobs among ``jobs`` that a run holds now. Opens the backend; raises BrokerUnavailable,
    saying where, when the store cannot be read."""
    if not jobs or backend.lease_store is None:
        return {}
    names = sorted(set(jobs))
    if not isinstance(backend, (RedisBackend, SqlBackend)):  # a store of another kind: its own way
        return {}
    backend.open()
    try:
        states, now_ms = backend.busy_states(names)
    except (*backend.answer_lost_errors, *backend.failure_errors) as exc:
        raise BrokerUnavailable(
            f"cannot read which jobs are busy from {backend.describe()}: {type(exc).__name__}: {exc}"
        ) from exc
    found = {}
    for job, state in states.items():
        if state.slot is not None and state.until_ms > now_ms:
            found[job] = Busy(state.slot, state.state, state.until_ms, state.worker, len(state.pending))
    return found
