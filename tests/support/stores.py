"""Deleting what a test left in Redis or PostgreSQL under its prefix; pointing the history app
of the process tests at one of the stores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: anarchon's PostgreSQL tables, each with a ``prefix`` column.
POSTGRES_TABLES = (
    "anarchon_jobs",
    "anarchon_runs",
    "anarchon_events",
    "anarchon_peers",
    "anarchon_backfills",
    "anarchon_defs",
    "anarchon_changes",
)


def history_app_on(where: str, env: dict[str, str], tmp_path: Path, request: Any) -> dict[str, str]:
    """``env`` (of tests.apps.history_app) with its runs decided ``where``: ``rabbitmq`` (as it
    is), ``sqlite`` (a file of the test's), or the suite's ``redis`` or ``postgres`` under a prefix
    of the test's own, deleted after it."""
    env = dict(env)
    if where == "sqlite":
        env["HISTORY_APP_BACKEND"] = f"sqlite:///{tmp_path / 'anarchon.db'}"
    elif where in ("redis", "postgres"):
        env["HISTORY_APP_BACKEND"] = request.getfixturevalue(f"{where}_url")
        env["HISTORY_APP_ANARCHON_PREFIX"] = request.getfixturevalue(f"{where}_prefix")
    return env


def delete_redis_keys(redis_url: str, prefix: str) -> None:
    """Delete every key under ``prefix`` in the database of ``redis_url``."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def delete_postgres_rows(postgres_url: str, prefix: str) -> None:
    """Delete every row under ``prefix`` in anarchon's tables (those that exist)."""
    import psycopg

    with psycopg.connect(postgres_url) as db:
        for table in POSTGRES_TABLES:
            if db.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0] is not None:
                db.execute(f"DELETE FROM {table} WHERE prefix = %s", (prefix,))
