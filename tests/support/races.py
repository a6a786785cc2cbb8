"""Processes racing on one store: each opens its own backend, and they all start at once."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from anarchon_celery import PostgresBackend, RabbitMQBackend, RedisBackend, SQLiteBackend
from anarchon_celery.backends import Backend


def place(kind: str, request: pytest.FixtureRequest, tmp_path: Path, prefix: str) -> tuple[str, str]:
    """Where a race of ``kind`` (rabbitmq, sqlite, redis or postgres) runs, and under which prefix
    (on Redis and PostgreSQL the fixture's, whose keys or rows are deleted after the test)."""
    if kind == "sqlite":
        return str(tmp_path / "race.db"), prefix
    if kind == "rabbitmq":
        return request.getfixturevalue("broker_url"), prefix
    return request.getfixturevalue(f"{kind}_url"), request.getfixturevalue(f"{kind}_prefix")


def open_kind(kind: str, target: str, prefix: str, lease_ms: int = 5_000) -> Backend:
    backend: Backend
    if kind == "rabbitmq":
        backend = RabbitMQBackend(target, prefix=prefix, slot_ttl_ms=60_000)
    elif kind == "redis":
        backend = RedisBackend(target, prefix=prefix, lease_ms=lease_ms)
    elif kind == "postgres":
        backend = PostgresBackend(target, prefix=prefix, lease_ms=lease_ms)
    else:
        backend = SQLiteBackend(target, prefix=prefix, lease_ms=lease_ms)
    backend.open()
    return backend


def race(work: Callable[[tuple[Any, ...]], Any], processes: int, *args: Any) -> list[Any]:
    """``work((*args, me, start))`` in ``processes`` fresh processes (``me`` from 0), each
    waiting on the barrier ``start`` until all are ready; their results, in order of ``me``.
    ``work`` is a module-level function (the processes import it)."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        start = manager.Barrier(processes)
        with ctx.Pool(processes) as pool:
            return pool.map(work, [(*args, me, start) for me in range(processes)])
