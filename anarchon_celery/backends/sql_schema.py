"""anarchon's tables, one definition for the two SQL stores (PostgreSQL and SQLite), and one way
to bring an older database up to date: the columns a release added since a table was first made
are added where they are missing, found in the database's own catalog. Pure: the stores run the
SQL it writes."""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass

__all__ = ["POSTGRES", "SQLITE", "TABLES", "Column", "Table", "columns_missing", "create_sql"]

POSTGRES = "postgres"
SQLITE = "sqlite"

_TYPES = {
    POSTGRES: {"text": "text", "int": "integer", "bigint": "bigint", "id": "bigserial PRIMARY KEY"},
    SQLITE: {"text": "TEXT", "int": "INTEGER", "bigint": "INTEGER", "id": "INTEGER PRIMARY KEY AUTOINCREMENT"},
}


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # text, int, bigint, or id (a generated key)
    null: bool = False
    default: int | None = None
    comment: str = ""
    #: Added by a release after the table was first made: an older database lacks it.
    added: bool = False

    def sql(self, dialect: str) -> str:
        text = f"{self.name} {_TYPES[dialect][self.kind]}"
        if self.kind != "id" and not self.null:
            text += " NOT NULL"
        if self.default is not None:
            text += f" DEFAULT {self.default}"
        return text


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...] = ()  # the primary key, unless a column is an id
    #: Indexes: (name, columns).
    indexes: tuple[tuple[str, str], ...] = ()
    dialects: tuple[str, ...] = (POSTGRES, SQLITE)

    def sql(self, dialect: str) -> str:
        """CREATE TABLE IF NOT EXISTS, with the columns a table is first made with on ``dialect``
        (on PostgreSQL, added columns come after, as ALTER TABLE ... ADD COLUMN IF NOT EXISTS,
        so that the same script brings an older database up to date)."""
        first = [c for c in self.columns if dialect == SQLITE or not c.added]
        parts = [(c.sql(dialect), c.comment) for c in first]
        if self.key:
            parts.append((f"PRIMARY KEY ({', '.join(self.key)})", ""))
        lines = [
            f"    {text}{',' if n < len(parts) - 1 else ''}{f'  -- {comment}' if comment else ''}"
            for n, (text, comment) in enumerate(parts)
        ]
        rowid = " WITHOUT ROWID" if dialect == SQLITE and self.key else ""
        statements = [f"CREATE TABLE IF NOT EXISTS {self.name} (\n" + "\n".join(lines) + f"\n){rowid};"]
        if dialect == POSTGRES:
            statements += [_add_column(self.name, c, dialect) for c in self.columns if c.added]
        statements += [f"CREATE INDEX IF NOT EXISTS {name} ON {self.name} ({on});" for name, on in self.indexes]
        return "\n".join(statements)


TABLES = (
    Table("anarchon_meta", (Column("key", "text"), Column("value", "text")), key=("key",), dialects=(SQLITE,)),
    Table(
        "anarchon_jobs",
        (
            Column("prefix", "text"),
            Column("job", "text"),
            Column("cursor", "bigint", comment="every slot at or below it is decided"),
            Column("catch_up_key", "text", null=True, comment="the schedule it catches up on", added=True),
            Column(
                "busy", "text", null=True, comment="overlap protection: the run holding it, runs pending", added=True
            ),
            Column("paused", "text", null=True, comment="its pause: by whom, when, why, until when", added=True),
            Column("born", "bigint", null=True, comment="when an instance first knew it: no run before", added=True),
        ),
        key=("prefix", "job"),
    ),
    Table(
        "anarchon_runs",
        (
            Column("prefix", "text"),
            Column("job", "text"),
            Column("slot", "bigint"),
            Column("holder", "text", comment="the instance that runs it"),
            Column("token", "int", comment="fencing token: 1 for the first winner, +1 a takeover"),
            Column("state", "text", comment="claimed, sent, started; skipped or pending (its job busy); paused"),
            Column("decided_ms", "bigint", comment="the store's time of the win"),
            Column("deadline_ms", "bigint", null=True, comment="the latest the run may be sent"),
            Column("lease_end_ms", "bigint", default=0, comment="the holder's lease, until then", added=True),
            Column("backups", "int", default=0, comment="backups armed", added=True),
            Column(
                "gap_after", "bigint", null=True, comment="the cursor its win moved up from, past a gap", added=True
            ),
        ),
        key=("prefix", "job", "slot"),
        indexes=(("anarchon_runs_decided", "decided_ms"),),
    ),
    Table(
        "anarchon_backfills",  # each run backfilled, once (celery anarchon backfill)
        (
            Column("prefix", "text"),
            Column("job", "text"),
            Column("slot", "bigint"),
            Column("instance", "text", comment="the instance that sent it"),
            Column("at_ms", "bigint", comment="when, on the store's clock"),
        ),
        key=("prefix", "job", "slot"),
    ),
    Table(
        "anarchon_defs",  # runtime jobs (celery anarchon add)
        (
            Column("prefix", "text"),
            Column("job", "text"),
            Column("version", "bigint", comment="1, then +1 at each change"),
            Column("entry", "text", comment="its beat_schedule entry, as JSON"),
            Column("author", "text", comment="who made this version"),
            Column("at_ms", "bigint", comment="when, on the store's clock"),
        ),
        key=("prefix", "job"),
    ),
    Table(
        "anarchon_changes",  # each change of a runtime job, in order, for the instances to act on
        (
            Column("id", "id"),
            Column("prefix", "text"),
            Column("job", "text"),
            Column("version", "bigint", comment="the version made; 0: removed"),
            Column("at_ms", "bigint"),
        ),
        indexes=(("anarchon_changes_prefix", "prefix, id"),),
    ),
    Table(
        "anarchon_events",
        (Column("id", "id"), Column("prefix", "text"), Column("job", "text"), Column("event", "text")),
        indexes=(("anarchon_events_job", "prefix, job, id"),),
    ),
    Table(
        "anarchon_handbacks",  # PostgreSQL tells of leases handed back with NOTIFY instead
        (
            Column("id", "id"),
            Column("prefix", "text"),
            Column("job", "text"),
            Column("slot", "bigint"),
            Column("at_ms", "bigint"),
        ),
        dialects=(SQLITE,),
    ),
    Table(
        "anarchon_peers",
        (
            Column("id", "id"),
            Column("prefix", "text"),
            Column("instance", "text"),
            Column("announcement", "text"),
            Column("at_ms", "bigint"),
        ),
    ),
)


def create_sql(dialect: str) -> str:
    """The SQL that makes every table of ``dialect`` that is missing (on PostgreSQL, with the
    columns added since, where missing)."""
    return "\n".join(table.sql(dialect) for table in TABLES if dialect in table.dialects) + "\n"


def columns_missing(dialect: str, existing: Mapping[str, Set[str]]) -> list[str]:
    """The ALTER TABLE statements that add the columns missing from ``existing`` (the columns of
    each of anarchon's tables, as the database's catalog lists them; a table that is not there
    has none). An empty list: the database is up to date."""
    return [
        _add_column(table.name, column, dialect)
        for table in TABLES
        if dialect in table.dialects
        for column in table.columns
        if column.name not in existing.get(table.name, set())
    ]


def _add_column(table: str, column: Column, dialect: str) -> str:
    exists = " IF NOT EXISTS" if dialect == POSTGRES else ""  # (SQLite adds under its write lock, once)
    return f"ALTER TABLE {table} ADD COLUMN{exists} {column.sql(dialect)};"
