"""PostgresBackend: runs decided in PostgreSQL, one transaction per batch, on the server's clock.

Each job keeps a cursor (a row of ``anarchon_jobs``), the latest slot decided. A batch locks its
jobs' cursor rows in job order (``FOR UPDATE``: instances never deadlock, and each sees the cursor
the last one committed), decides its claims (:func:`.ordered.decide`) on the server's clock read
once the locks are held, and writes the wins, so a run decided once is never won again, however
late an instance comes (see :mod:`.ordered`). A win is
recorded with its instance: a claim whose commit's answer was lost with the connection is made
again on a new one, and finds its own win.

History events and the instances' job definitions are rows of the same database. The tables are
made at first use (``anarchon_*`` in the connection's schema); several deployments may share them,
each under its prefix.

Needs psycopg 3 (``pip install anarchon_celery[postgres]``) and PostgreSQL 12 or newer.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
from collections.abc import Collection, Iterator, Sequence
from typing import Any

from ..errors import BrokerError, BrokerRefused, BrokerUnavailable, ConfigError
from . import busy
from .base import Claim, Outcome
from .busy import JobBusy, run_state
from .ordered import decide_current, end_expired_pauses, set_paused
from .pauses import PAUSED, Pause
from .sql import SqlBackend, _first_line, _Placeholders
from .sql_schema import POSTGRES, TABLES, columns_missing, create_sql
from .store import DEFAULT_LEASE_MS, Answer

__all__ = ["POSTGRES_SCHEMES", "PostgresBackend"]

logger = logging.getLogger(__name__)

POSTGRES_SCHEMES = ("postgresql", "postgres")

_NOW = "SELECT (extract(epoch FROM now()) * 1000)::bigint"
#: The channel on which leases handed back are told (NOTIFY), for every prefix.
HANDBACK_CHANNEL = "anarchon_handback"
#: The server's clock as it is now, not at the transaction's start: read once rows are locked.
_CLOCK = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint"

_TABLES = "\n" + create_sql(POSTGRES)


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigError("the PostgreSQL backend needs psycopg 3: pip install 'anarchon_celery[postgres]'") from exc
    return psycopg


class PostgresBackend(SqlBackend):
    """Decides runs in PostgreSQL (12 or newer), shared by instances on any number of hosts.

    Arguments:
        url: a libpq connection string or URL, ``postgresql://user:password@host:5432/dbname``.
        prefix: the deployment's name in the tables.
        slot_ttl_ms: how long the record of a run won is kept. Runs are never decided twice
            whatever it is: each job's cursor says so.
        timeout: seconds to connect, and the longest a statement (or a wait for another
            instance's lock) may take before its claims are given up as not decided.
        lease_ms: how long a winner holds its run before the run's backups may take it over
            (see :mod:`.leases`).
    """

    clock_name = "PostgreSQL's clock"
    placeholder = "%s"
    now_sql = _NOW

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "cron.",
        slot_ttl_ms: int = 300_000,
        timeout: float = 5.0,
        lease_ms: int = DEFAULT_LEASE_MS,
    ) -> None:
        super().__init__(prefix, slot_ttl_ms, timeout, lease_ms)
        psycopg = _psycopg()
        if not isinstance(url, str) or not url:
            raise ConfigError(f"PostgresBackend needs a postgresql:// URL or a libpq connection string, not {url!r}")
        self.url = url
        self._psycopg = psycopg
        self.answer_lost_errors = (psycopg.OperationalError,)  # the connection went: a commit's answer too
        self.failure_errors = (psycopg.Error, BrokerUnavailable, BrokerRefused)
        self._lock = threading.RLock()
        self._db: Any = None
        self._pid = 0
        self._listener: Any = None  # LISTENs for leases handed back
        self._listener_pid = 0
        self._version = "?"

    # -- the connection -------------------------------------------------------------------------

    def open(self) -> None:
        with self._lock:
            self._connection()

    def _connection(self) -> Any:
        """The open connection (made again when lost, or in a forked child)."""
        if self._db is not None and not self._db.closed and self._pid == os.getpid():
            return self._db
        if self._db is not None and self._pid == os.getpid():
            with contextlib.suppress(Exception):
                self._db.close()
        self._db = None
        psycopg = self._psycopg
        try:
            db = psycopg.connect(self.url, **self._connect_options())
        except psycopg.Error as exc:
            text = _first_line(exc)
            if _LOGIN_REFUSED.search(str(exc)):
                raise BrokerRefused(
                    f"{self.describe()} refused the connection ({text}): fix the user, password or "
                    "database in the URL, or the server's pg_hba.conf"
                ) from exc
            raise BrokerUnavailable(f"{self.describe()} does not answer ({text})") from exc
        try:
            if not _schema_complete(db):
                with db.transaction():
                    # Made once, whoever comes first: concurrent CREATE ... IF NOT EXISTS can collide.
                    # (Only when something is missing: ALTER TABLE locks the table even when the
                    # column exists, and every worker process connects.)
                    db.execute("SELECT pg_advisory_xact_lock(hashtext('anarchon_celery schema'))")
                    db.execute(_TABLES)
            settings = dict(
                db.execute(
                    "SELECT name, setting FROM pg_settings WHERE name IN ('server_version', 'synchronous_commit')"
                ).fetchall()
            )
            db.commit()
        except psycopg.Error as exc:
            db.close()
            raise self._unusable("keep anarchon's tables", exc) from exc
        self._version = f"PostgreSQL {settings.get('server_version', '?')}"
        if settings.get("synchronous_commit") == "off":
            logger.warning(
                "anarchon: %s commits without waiting for the disk (synchronous_commit off): a win can be "
                "lost in a crash and its run won again. Set synchronous_commit on for anarchon's user or database",
                self.describe(),
            )
        self._db, self._pid = db, os.getpid()
        return db

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Any]:
        """One transaction on the connection; a connection that failed is never used again."""
        with self._lock:
            db = self._connection()
            try:
                with db.transaction():
                    yield db
            except self._psycopg.OperationalError:
                with contextlib.suppress(Exception):
                    db.close()
                self._db = None
                raise

    def store_version(self) -> str:
        return self._version

    # -- claims ---------------------------------------------------------------------------------

    lock_rows = " FOR UPDATE"
    # Rows locked in the order Python sorts the keys (code points, as UTF-8 bytes compare), so
    # that batches of keys lock in one order whatever the database's collation.
    key_order = 'job COLLATE "C", slot'
    locked_now_sql = _CLOCK
    lock_row = " FOR UPDATE"

    def _decide(self, claims: Sequence[Claim], instance: str, recover: Collection[tuple[str, int]]) -> list[Answer]:
        jobs = sorted({claim.job for claim in claims})
        with self._transaction() as db:
            # Every job's cursor row exists, then is locked, in job order.
            db.execute(
                "INSERT INTO anarchon_jobs (prefix, job, cursor) SELECT %s, job, -1 FROM unnest(%s::text[]) AS job "
                "ORDER BY job ON CONFLICT DO NOTHING",
                (self.prefix, jobs),
            )
            rows = db.execute(
                "SELECT job, cursor, catch_up_key, busy, paused FROM anarchon_jobs WHERE prefix = %s "
                "AND job = ANY(%s) ORDER BY job FOR UPDATE",
                (self.prefix, jobs),
            ).fetchall()
            cursors: dict[str, int | None] = {job: (None if cursor < 0 else cursor) for job, cursor, *_ in rows}
            keys = {job: key or "" for job, _, key, *_ in rows}
            states = {job: state for job, _, _, text, _ in rows if (state := JobBusy.decode(text)) is not None}
            pauses = {job: pause for job, *_, text in rows if (pause := Pause.decode(text)) is not None}
            read = {job: state.encode() for job, state in states.items()}
            keys_before = dict(keys)
            # The clock read once the locks are held (now() is the transaction's start, which may
            # be as long ago as the wait for another instance's lock).
            now = db.execute(_CLOCK).fetchone()[0]
            before = dict(cursors)
            resumed = end_expired_pauses(pauses, cursors, now)
            # The runs' records, read (and locked) once their jobs' cursors are: every claim of
            # these jobs waits for this one.
            records = self._records(_Placeholders(db, self._sql), [(c.job, c.slot) for c in claims])
            gaps: dict[int, int] = {}
            versions = self._versions(_Placeholders(db, self._sql), [c.job for c in claims if c.version])
            results = decide_current(claims, versions, now, cursors, records, self.slot_ttl_ms, keys, gaps)
            paused = set_paused(claims, results, pauses, gaps)
            won = [i for i, (outcome, _) in enumerate(results) if outcome is Outcome.WON] + paused
            verdicts = self._admit(claims, results, states, now)
            for i, claim in enumerate(claims if recover else ()):  # held: won by a try whose answer was lost
                record = records.get((claim.job, claim.slot))
                if record is None or record.holder != instance or results[i][0] is not Outcome.LOST:
                    continue
                if (claim.job, claim.slot) in recover:
                    results[i] = (Outcome.PAUSED if record.state == PAUSED else Outcome.WON, 0)
                    if record.state in (busy.SKIPPED, busy.PENDING):  # won, not sent: its job was busy
                        verdicts[i] = record.state
                    if record.gap_after is not None:
                        gaps[i] = record.gap_after
            moved = [job for job in jobs if (cursors[job], keys[job]) != (before[job], keys_before[job])]
            if moved:
                db.execute(
                    "UPDATE anarchon_jobs AS j SET cursor = v.cursor, catch_up_key = v.key FROM "
                    "unnest(%s::text[], %s::bigint[], %s::text[]) AS v(job, cursor, key) "
                    "WHERE j.prefix = %s AND j.job = v.job",
                    (moved, [_stored(cursors[job]) for job in moved], [keys[job] for job in moved], self.prefix),
                )
            if won:
                db.execute(
                    "INSERT INTO anarchon_runs (prefix, job, slot, holder, token, state, decided_ms, deadline_ms, "
                    "lease_end_ms, backups, gap_after) SELECT %s, job, slot, %s, 1, state, %s, deadline, %s, 0, "
                    "after FROM unnest(%s::text[], %s::bigint[], %s::bigint[], %s::bigint[], %s::text[]) "
                    "AS v(job, slot, deadline, after, state) ON CONFLICT (prefix, job, slot) DO NOTHING",
                    (
                        self.prefix,
                        instance,
                        now,
                        now + self.lease_ms,
                        [claims[i].job for i in won],
                        [claims[i].slot for i in won],
                        [claims[i].deadline_ms for i in won],
                        [gaps.get(i) for i in won],
                        [PAUSED if i in paused else run_state(verdicts.get(i)) for i in won],
                    ),
                )
            self._end_pauses(_Placeholders(db, self._sql), resumed)
            if states:
                self._write_busy(_Placeholders(db, self._sql), states, read)
            return self._arm(db, claims, results, now, records, gaps, verdicts)

    def _tell_handed_back(self, db: Any, runs: list[tuple[str, int]], now: int) -> None:
        """A notification per run, sent when the transaction commits."""
        for job, slot in runs:
            told = json.dumps({"prefix": self.prefix, "job": job, "slot": slot})
            db.execute("SELECT pg_notify(?, ?)", (HANDBACK_CHANNEL, told))

    def _handed_back(self) -> list[tuple[str, int]]:
        psycopg = self._psycopg
        with self._lock:
            listener = self._listener
            if listener is None or listener.closed or self._listener_pid != os.getpid():
                listener = psycopg.connect(self.url, autocommit=True, **self._connect_options())
                try:
                    listener.execute(f"LISTEN {HANDBACK_CHANNEL}")
                except BaseException:
                    listener.close()
                    raise
                self._listener, self._listener_pid = listener, os.getpid()
                return []  # from now on
            try:
                heard = list(listener.notifies(timeout=0))
            except psycopg.Error:
                with contextlib.suppress(Exception):
                    listener.close()
                self._listener = None
                raise
        found = []
        for notice in heard:
            try:
                told = json.loads(notice.payload)
            except ValueError:
                continue
            if isinstance(told, dict) and told.get("prefix") == self.prefix:
                found.append((str(told["job"]), int(told["slot"])))
        return found

    def _inserted_id(self, db: Any, sql: str, params: Sequence[Any]) -> int:
        return int(db.execute(sql + " RETURNING id", params).fetchone()[0])

    def check_claims(self) -> None:
        """Lock a cursor row and let it go: a user without the rights fails here."""
        try:
            with self._transaction() as db:
                db.execute(  # (one row, in the order claims lock them)
                    "SELECT cursor FROM anarchon_jobs WHERE prefix = %s ORDER BY job LIMIT 1 FOR UPDATE", (self.prefix,)
                )
                db.execute("DELETE FROM anarchon_runs WHERE false")
        except self._psycopg.Error as exc:
            raise self._unusable("decide claims", exc) from exc

    def schema_sql(self) -> str:
        """The SQL that makes anarchon's tables, for a DBA who makes them instead of the backend's
        user, with the rights that user needs then."""
        return (
            "-- anarchon_celery's tables (PostgreSQL), in the schema the backend's user connects to.\n"
            "-- Its user then needs, with USER its name:\n"
            "--   GRANT SELECT, INSERT, UPDATE, DELETE ON anarchon_jobs, anarchon_runs, anarchon_events,\n"
            "--     anarchon_peers, anarchon_backfills, anarchon_defs, anarchon_changes TO USER;\n"
            "--   GRANT USAGE ON SEQUENCE anarchon_events_id_seq, anarchon_peers_id_seq,\n"
            "--     anarchon_changes_id_seq TO USER;" + _TABLES
        )

    def _unusable(self, doing: str, exc: BaseException) -> BrokerError:
        """BrokerRefused for a missing right, which only a grant fixes; else BrokerUnavailable."""
        text = f"{self.describe()} cannot {doing}: {_first_line(exc)}"
        if isinstance(exc, self._psycopg.errors.InsufficientPrivilege):
            return BrokerRefused(
                f"{text}. Its user needs CREATE on the schema, once, to make anarchon's tables; or a "
                "DBA makes them with the SQL that 'celery -A proj anarchon schema' prints, which also "
                "lists the rights the user then needs"
            )
        return BrokerUnavailable(text)

    def describe(self) -> str:
        return f"PostgreSQL at {_shown(self.url)} (prefix {self.prefix!r})"

    def _connect_options(self) -> dict[str, Any]:
        """libpq options of our connections, on top of the URL's own."""
        waited_ms = round(self.timeout * 1000)
        given = self._psycopg.conninfo.conninfo_to_dict(self.url).get("options") or ""
        return {
            "connect_timeout": max(1, round(self.timeout)),
            "options": f"{given} -c statement_timeout={waited_ms} -c lock_timeout={waited_ms}".strip(),
            # A server gone without a word (a cut cable) is found within about 10 s.
            "keepalives": 1,
            "keepalives_idle": 5,
            "keepalives_interval": 2,
            "keepalives_count": 2,
            "application_name": "anarchon_celery",
        }

    def close(self) -> None:
        with self._lock:
            for connection, pid in ((self._db, self._pid), (self._listener, self._listener_pid)):
                if connection is not None and pid == os.getpid():
                    with contextlib.suppress(Exception):
                        connection.close()
            self._db = self._listener = None


#: The server's FATAL answers to a connection that only a change of configuration fixes (libpq
#: gives them no SQLSTATE, only their text; these are the server's English messages).
_LOGIN_REFUSED = re.compile(
    r"FATAL:.*(password authentication failed|authentication failed|role \S+ does not exist|"
    r"database \S+ does not exist|no pg_hba\.conf entry|permission denied for database|not permitted to log in)"
)


def _schema_complete(db: Any) -> bool:
    """Whether anarchon's tables are there with every column this release writes, read from the
    catalog without taking locks."""
    names = [table.name for table in TABLES if POSTGRES in table.dialects]
    with db.transaction():
        rows = db.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = ANY(%s)",
            (names,),
        ).fetchall()
    existing: dict[str, set[str]] = {}
    for table, column in rows:
        existing.setdefault(table, set()).add(column)
    return not columns_missing(POSTGRES, existing)


def _shown(url: str) -> str:
    """The URL without its password (a URL's user information or ``password=`` parameter, or a
    connection string's ``password=``). Read by hand: a URL may name several hosts
    (``postgresql://u:p@db1:5432,db2:5432/proj``), which URL parsers refuse."""
    if "://" not in url:
        return " ".join("password=**" if part.startswith("password=") else part for part in url.split())
    scheme, rest = url.split("://", 1)
    netloc, slash, tail = rest.partition("/")
    if "@" in netloc:
        user_info, hosts = netloc.rsplit("@", 1)
        user, colon, _ = user_info.partition(":")
        netloc = f"{user}{':**' if colon else ''}@{hosts}"
    tail = re.sub(r"(^|[?&])password=[^&]*", r"\1password=**", tail)
    return f"{scheme}://{netloc}{slash}{tail}"


def _stored(cursor: int | None) -> int:
    """A cursor as its row holds it: -1 for none yet."""
    return -1 if cursor is None else cursor
