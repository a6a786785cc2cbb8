"""Deleting what a test left in Redis or PostgreSQL under its prefix."""

from __future__ import annotations

#: anarchon's PostgreSQL tables, each with a ``prefix`` column.
POSTGRES_TABLES = ("anarchon_jobs", "anarchon_runs", "anarchon_events", "anarchon_peers")


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
