"""The SQL stores' one schema definition: pure, with SQLite in memory (PostgreSQL's own tests make
and read its tables on the real server)."""

from __future__ import annotations

import sqlite3

import pytest

from anarchon_celery.backends.sql_schema import POSTGRES, SQLITE, TABLES, columns_missing, create_sql

RUNS_OF_SCHEMA_1 = {"prefix", "job", "slot", "holder", "token", "state", "decided_ms", "deadline_ms"}


def _columns(db: sqlite3.Connection) -> dict[str, set[str]]:
    return {
        table.name: {row[1] for row in db.execute(f"PRAGMA table_info({table.name})")}
        for table in TABLES
        if SQLITE in table.dialects
    }


def test_a_new_sqlite_database_has_every_column_and_needs_nothing_added() -> None:
    db = sqlite3.connect(":memory:")
    db.executescript(create_sql(SQLITE))
    db.executescript(create_sql(SQLITE))  # again: nothing happens
    assert columns_missing(SQLITE, _columns(db)) == []
    assert {"lease_end_ms", "backups"} <= _columns(db)["anarchon_runs"]


@pytest.mark.parametrize(
    "dialect, expected",
    [
        (
            POSTGRES,
            [
                "ALTER TABLE anarchon_runs ADD COLUMN IF NOT EXISTS lease_end_ms bigint NOT NULL DEFAULT 0;",
                "ALTER TABLE anarchon_runs ADD COLUMN IF NOT EXISTS backups integer NOT NULL DEFAULT 0;",
                "ALTER TABLE anarchon_runs ADD COLUMN IF NOT EXISTS gap_after bigint;",
            ],
        ),
        (
            SQLITE,
            [
                "ALTER TABLE anarchon_runs ADD COLUMN lease_end_ms INTEGER NOT NULL DEFAULT 0;",
                "ALTER TABLE anarchon_runs ADD COLUMN backups INTEGER NOT NULL DEFAULT 0;",
                "ALTER TABLE anarchon_runs ADD COLUMN gap_after INTEGER;",
            ],
        ),
    ],
)
def test_a_database_of_schema_1_gets_the_columns_added_since(dialect: str, expected: list[str]) -> None:
    existing = {table.name: {column.name for column in table.columns} for table in TABLES}
    existing["anarchon_runs"] = set(RUNS_OF_SCHEMA_1)
    assert columns_missing(dialect, existing) == expected


def test_the_statements_that_add_columns_make_a_sqlite_database_of_schema_1_whole() -> None:
    db = sqlite3.connect(":memory:")
    older = create_sql(SQLITE)
    for column in ("lease_end_ms", "backups", "gap_after", "catch_up_key", "busy", "paused", "born"):  # added since
        older = older.replace(f"    {column}", "    -- ")
    db.executescript(older)
    assert _columns(db)["anarchon_runs"] == RUNS_OF_SCHEMA_1
    assert _columns(db)["anarchon_jobs"] == {"prefix", "job", "cursor"}
    for statement in columns_missing(SQLITE, _columns(db)):
        db.execute(statement)
    assert columns_missing(SQLITE, _columns(db)) == []


def test_postgresql_makes_the_tables_with_their_first_columns_and_adds_the_later_ones() -> None:
    sql = create_sql(POSTGRES)
    assert "lease_end_ms" not in sql.split("CREATE TABLE IF NOT EXISTS anarchon_runs")[1].split(");")[0]
    assert "ALTER TABLE anarchon_runs ADD COLUMN IF NOT EXISTS lease_end_ms bigint NOT NULL DEFAULT 0;" in sql
    # The leases handed back go by NOTIFY, and the schema's version by the columns: two tables fewer.
    names = {dialect: {t.name for t in TABLES if dialect in t.dialects} for dialect in (POSTGRES, SQLITE)}
    assert names[SQLITE] - names[POSTGRES] == {"anarchon_meta", "anarchon_handbacks"}
    assert "anarchon_meta" not in sql and "anarchon_handbacks" not in sql
