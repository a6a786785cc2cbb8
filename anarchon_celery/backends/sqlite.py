"""SQLiteBackend: runs decided in one SQLite database file, for the instances of one host.

Every beat instance (or ``worker -B``) of the host opens the same file. A claim is one
``BEGIN IMMEDIATE`` transaction per batch, so the database's write lock orders the claims, and
each job keeps a cursor: the latest slot decided. A run is won once: while its record is kept,
the record says it was decided; after, the cursor does (see :mod:`.ordered`), so a run decided
once is never won again, however late an instance comes, and no safety rule binds
``max_late_ms`` to how long the runs are remembered. Times are
read in the transaction from SQLite's own clock (the host's), never from the instance's, so an
instance whose clock is wrong can neither win a run early nor win it twice.

History events, and the instances' job definitions (see :mod:`.peers`), are rows of the same file.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from .. import docs
from ..errors import BrokerError, BrokerRefused, BrokerUnavailable, ConfigError
from .base import Claim, Outcome
from .busy import JobBusy, run_state
from .ordered import decide_current, end_expired_pauses, set_paused
from .pauses import PAUSED, Pause
from .sql import SqlBackend, _Placeholders
from .sql_schema import SQLITE, TABLES, columns_missing, create_sql
from .store import DEFAULT_LEASE_MS, Answer

__all__ = ["NETWORK_FILE_SYSTEMS", "SQLiteBackend", "network_file_system", "sqlite_path"]

logger = logging.getLogger(__name__)

#: The store's clock, in epoch milliseconds, as SQLite reads it ('now' is fixed within a statement).
_NOW = "SELECT CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"

#: File systems on which SQLite's locks cannot be trusted across hosts (and often not at all).
NETWORK_FILE_SYSTEMS = frozenset(
    {"nfs", "nfs4", "cifs", "smbfs", "smb3", "9p", "afs", "ceph", "glusterfs", "lustre", "gpfs", "davfs"}
)

SCHEMA = 2
#: Rows telling of leases handed back are deleted after this long.
HANDBACKS_KEPT_MS = 3_600_000
_TABLES = create_sql(SQLITE)


#: SQLite's primary result codes that trying again cannot cure: SQLITE_PERM, SQLITE_READONLY,
#: SQLITE_CORRUPT, SQLITE_CANTOPEN, SQLITE_AUTH, SQLITE_NOTADB.
_PERMANENT_CODES = frozenset({3, 8, 11, 14, 23, 26})
#: SQLITE_BUSY and SQLITE_LOCKED: another connection holds the lock; tried again.
_BUSY_CODES = frozenset({5, 6})


def _why_not_writable(path: str) -> str:
    """What stands between this process and writing ``path`` and its journal beside it."""
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        return f"the directory {folder} does not exist: create it, or give another path"
    if hasattr(os, "statvfs") and os.statvfs(folder).f_flag & os.ST_RDONLY:
        return f"{folder} is on a read-only file system: put the database on a writable local disk"
    user = _user()
    if not os.access(folder, os.W_OK | os.X_OK):
        return (
            f"user {user} may not write in {folder}, where SQLite keeps the database's -wal and -shm "
            "files beside it: give it that right, or another path"
        )
    if os.path.exists(path) and not os.access(path, os.R_OK | os.W_OK):
        return f"user {user} may not read and write {path}: give it that right"
    return "fix the file (or give another path) and start again"


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return str(os.geteuid())


def sqlite_path(url: str) -> str:
    """The file of a ``sqlite://`` URL, as SQLAlchemy reads it: ``sqlite:///app.db`` is relative
    to the working directory, ``sqlite:////var/lib/app.db`` absolute."""
    if not url.startswith("sqlite:///") or url == "sqlite:///":
        raise ConfigError(
            f"invalid SQLite URL {url!r}: use sqlite:///relative/file.db or sqlite:////absolute/file.db "
            "(a file on a local disk, shared by the instances of one host)"
        )
    path = url[len("sqlite:///") :].split("?", 1)[0]
    if path in (":memory:", ""):
        raise ConfigError(
            f"{url!r}: an in-memory SQLite database is not shared between processes; use memory:// for tests, or a file"
        )
    return path


def network_file_system(path: str | os.PathLike[str], mounts: str | None = None) -> str | None:
    """The type of the network file system holding ``path`` (per ``/proc/mounts``, or the
    ``mounts`` text given), or None: a local one, or none could be told."""
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text()
        except OSError:
            return None
    target = os.path.realpath(os.path.abspath(os.fspath(path)))
    best, best_type = "", None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, best_type = point, fields[2]
    if best_type is None:
        return None
    base = best_type.split(".", 1)[1] if best_type.startswith("fuse.") else best_type
    return best_type if base in NETWORK_FILE_SYSTEMS or best_type == "fuse.sshfs" else None


def _upgrade(db: sqlite3.Connection) -> None:
    """Add the columns an older file lacks (schema 1: runs without leases), once, under the write
    lock, and say the file is of this release's schema."""
    db.execute("BEGIN IMMEDIATE")
    try:
        existing = {
            table.name: {row[1] for row in db.execute(f"PRAGMA table_info({table.name})")}
            for table in TABLES
            if SQLITE in table.dialects
        }
        for statement in columns_missing(SQLITE, existing):
            db.execute(statement)
        db.execute("UPDATE anarchon_meta SET value = ? WHERE key = 'schema' AND value = '1'", (str(SCHEMA),))
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


class SQLiteBackend(SqlBackend):
    """Decides runs in a SQLite database file shared by the instances of one host.

    Arguments:
        path: the database file (created if need be, with its tables). It must be on a local
            disk: SQLite's locks do not hold on a network file system, and one is refused when
            it can be told (``/proc/mounts``).
        prefix: the deployment's name in the file: several deployments may share one.
        slot_ttl_ms: how long the record of a run won is kept (it serves nothing after its
            send). Runs are never decided twice whatever it is: each job's cursor says so.
        timeout: seconds a claim waits for the database's write lock (another process writing)
            before its runs are given up as not decided.
        lease_ms: how long a winner holds its run before the run's backups may take it over
            (see :mod:`.leases`).
    """

    clock_name = "the database's clock"
    failure_errors = (sqlite3.Error, BrokerUnavailable, BrokerRefused)
    now_sql = _NOW

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        prefix: str = "cron.",
        slot_ttl_ms: int = 300_000,
        timeout: float = 5.0,
        lease_ms: int = DEFAULT_LEASE_MS,
    ) -> None:
        super().__init__(prefix, slot_ttl_ms, timeout, lease_ms)
        given = os.fspath(path)
        #: Resolved once, here: instances started from other directories must not open other files.
        self.path = os.path.abspath(given)
        self._relative = None if os.path.isabs(given) else given
        self._lock = threading.RLock()
        self._db: sqlite3.Connection | None = None
        self._pid = 0
        self._heard_handback: int | None = None
        self._worker_lock: tuple[int, str] | None = None  # the file lock of hold_worker(), and its path

    @classmethod
    def location_of(cls, url: str) -> str:
        return sqlite_path(url)

    # -- the connection -------------------------------------------------------------------------

    def open(self) -> None:
        if self._relative is not None:
            logger.warning(
                "anarchon: the SQLite path %r is relative: this process opens %s (from its working "
                "directory); an instance started elsewhere would open another file and run every job "
                "again. Give an absolute path: sqlite:///%s (see %s)",
                self._relative,
                self.path,
                self.path,
                docs.SQLITE_NEEDS,
            )
            self._relative = None
        with self._lock:
            self._connection()

    def _connection(self) -> sqlite3.Connection:
        """The open database (opened, or opened again in a forked child, whose parent's
        connection must not be used). Raises BrokerUnavailable, BrokerRefused or ConfigError."""
        if self._db is not None and self._pid == os.getpid():
            return self._db
        self._db = None
        remote = network_file_system(self.path)  # the file's real place, through any symlink
        if remote is not None:
            raise ConfigError(
                f"SQLite database {self.path} is on a network file system ({remote}), where SQLite's "
                "locks do not hold: a run could be won twice. Put it on a local disk, or use the "
                "Redis or PostgreSQL backend for instances on several hosts"
            )
        # Two processes opening a new file at once: the switch to write-ahead logging can fail
        # at once with "database is locked", without waiting for the busy timeout (SQLite does
        # not call the busy handler there). Tried again until the timeout, as a write would wait.
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                db = self._open_once()
            except sqlite3.OperationalError as exc:
                code = getattr(exc, "sqlite_errorcode", None)  # (Python 3.11 and later)
                busy = code & 0xFF in _BUSY_CODES if code is not None else "locked" in str(exc) or "busy" in str(exc)
                if not busy or time.monotonic() >= deadline:
                    raise self._unusable("open", exc) from exc
                time.sleep(0.05)
                continue
            except sqlite3.Error as exc:
                raise self._unusable("open", exc) from exc
            break
        self._db, self._pid = db, os.getpid()
        return db

    def _open_once(self) -> sqlite3.Connection:
        """The database opened, in write-ahead logging, its tables made and its schema checked."""
        db = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False)
        try:
            mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise ConfigError(f"SQLite database {self.path} cannot use write-ahead logging (journal mode {mode})")
            # A run won must stay won through a power cut: FULL syncs the log at every commit.
            db.execute("PRAGMA synchronous=FULL")
            db.executescript(_TABLES)
            db.execute(
                "INSERT INTO anarchon_meta (key, value) VALUES ('schema', ?) ON CONFLICT (key) DO NOTHING",
                (str(SCHEMA),),
            )
            _upgrade(db)
            schema = db.execute("SELECT value FROM anarchon_meta WHERE key = 'schema'").fetchone()[0]
            if schema != str(SCHEMA):
                raise ConfigError(
                    f"SQLite database {self.path} has anarchon schema {schema}; this release reads schema {SCHEMA}"
                )
        except BaseException:
            db.close()
            raise
        return db

    @contextlib.contextmanager
    def _transaction(self) -> Any:
        """One ``BEGIN IMMEDIATE`` transaction (the write lock taken at once): committed at the
        end of the block, rolled back if it raises."""
        with self._lock:
            db = self._connection()
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("COMMIT")  # a failed commit decides nothing: its runs are not won
            except BaseException:
                if db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        db.execute("ROLLBACK")
                raise

    @contextlib.contextmanager
    def _reading(self) -> Any:
        """A read in autocommit, without the write lock that ``BEGIN IMMEDIATE`` takes."""
        with self._lock:
            yield _Placeholders(self._connection(), self._sql)

    # -- claims ---------------------------------------------------------------------------------

    def _decide(self, claims: Sequence[Claim], instance: str, recover: Collection[tuple[str, int]]) -> list[Answer]:
        """One ``BEGIN IMMEDIATE`` transaction: the cursors of the claims' jobs read, the claims
        decided (:func:`.ordered.decide`), the wins written. (A local commit's answer is never
        lost: ``recover`` is not needed.)"""
        jobs = sorted({claim.job for claim in claims})
        with self._transaction() as db:
            now = db.execute(_NOW).fetchone()[0]
            found = db.execute(
                "SELECT job, cursor, catch_up_key, busy, paused FROM anarchon_jobs "
                f"WHERE prefix = ? AND job IN ({', '.join('?' * len(jobs))})",
                (self.prefix, *jobs),
            ).fetchall()
            cursors: dict[str, int | None] = {job: (None if cursor < 0 else cursor) for job, cursor, *_ in found}
            keys = {job: key or "" for job, _, key, *_ in found}
            states = {job: state for job, _, _, text, _ in found if (state := JobBusy.decode(text)) is not None}
            pauses = {job: pause for job, *_, text in found if (pause := Pause.decode(text)) is not None}
            read = {job: state.encode() for job, state in states.items()}
            before = dict(cursors), dict(keys)
            resumed = end_expired_pauses(pauses, cursors, now)
            records = self._records(db, [(c.job, c.slot) for c in claims])
            gaps: dict[int, int] = {}
            versions = self._versions(db, [c.job for c in claims if c.version])
            results = decide_current(claims, versions, now, cursors, records, self.slot_ttl_ms, keys, gaps)
            paused = set_paused(claims, results, pauses, gaps)
            verdicts = self._admit(claims, results, states, now)
            moved = [
                job
                for job in jobs
                if (cursors.get(job), keys.get(job, "")) != (before[0].get(job), before[1].get(job, ""))
            ]
            db.executemany(
                "INSERT INTO anarchon_jobs (prefix, job, cursor, catch_up_key) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (prefix, job) DO UPDATE SET cursor = excluded.cursor, "
                "catch_up_key = excluded.catch_up_key",
                [(self.prefix, job, _stored(cursors[job]), keys.get(job, "")) for job in moved],
            )
            self._end_pauses(db, resumed)
            db.executemany(
                "INSERT INTO anarchon_runs (prefix, job, slot, holder, token, state, decided_ms, "
                "deadline_ms, lease_end_ms, backups, gap_after) VALUES (?, ?, ?, ?, 1, ?, ?, ?, ?, 0, ?)",
                [
                    (
                        self.prefix,
                        c.job,
                        c.slot,
                        instance,
                        PAUSED if i in paused else run_state(verdicts.get(i)),
                        now,
                        c.deadline_ms,
                        now + self.lease_ms,
                        gaps.get(i),
                    )
                    for i, c in enumerate(claims)
                    if results[i][0] is Outcome.WON or i in paused
                ],
            )
            if states:
                self._write_busy(db, states, read)
            return self._arm(db, claims, results, now, records, gaps, verdicts)

    # -- workers' liveness (overlap protection) ---------------------------------------------------

    def _worker_file(self, worker: str) -> str:
        return os.path.join(f"{self.path}.workers", re.sub(r"[^A-Za-z0-9_.@#-]", "_", f"{self.prefix}{worker}"))

    def hold_worker(self, worker: str) -> bool:
        """Lock a file named after ``worker`` (``node#main``: the worker's main process) beside
        the database, for the process's life and its pool processes' (taken before they are
        forked, they share it): the kernel releases it once all of them are gone, however they
        died, and the instances of this host, which share the database, see it (:meth:`_gone`)."""
        path = self._worker_file(worker)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        for _ in range(100):  # (a look by another process holds it for a moment)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(0.01)
        else:
            os.close(fd)
            logger.warning("anarchon: %s is locked by another live process: holds are freed by their lease only", path)
            return False
        self.release_worker()
        self._worker_lock = (fd, path)
        return True

    def release_worker(self) -> None:
        held, self._worker_lock = self._worker_lock, None
        if held is not None:
            with contextlib.suppress(OSError):
                os.unlink(held[1])
            os.close(held[0])

    def _gone(self, holder: str) -> bool:
        """Whether the worker of ``holder`` (``node#main.pool``) is gone: the file lock its main
        process took is free. False when it never took one (a worker of an earlier release)."""
        if "#" not in holder:
            return False
        try:
            fd = os.open(self._worker_file(holder.rsplit(".", 1)[0]), os.O_RDWR)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)  # (releases the lock, if taken)
        return True

    def _tell_handed_back(self, db: Any, runs: list[tuple[str, int]], now: int) -> None:
        """A row per run, which the other instances read at their next wake-up (and forgotten an
        hour later)."""
        db.execute("DELETE FROM anarchon_handbacks WHERE at_ms < ?", (now - HANDBACKS_KEPT_MS,))
        db.executemany(
            "INSERT INTO anarchon_handbacks (prefix, job, slot, at_ms) VALUES (?, ?, ?, ?)",
            [(self.prefix, job, slot, now) for job, slot in runs],
        )

    def _handed_back(self) -> list[tuple[str, int]]:
        with self._lock:
            db = self._connection()
            if self._heard_handback is None:  # from now on
                row = db.execute("SELECT max(id) FROM anarchon_handbacks").fetchone()
                self._heard_handback = int(row[0] or 0)
                return []
            rows = db.execute(
                "SELECT id, job, slot FROM anarchon_handbacks WHERE id > ? AND prefix = ? ORDER BY id",
                (self._heard_handback, self.prefix),
            ).fetchall()
        if rows:
            self._heard_handback = rows[-1][0]
        return [(job, int(slot)) for _, job, slot in rows]

    def _inserted_id(self, db: Any, sql: str, params: Sequence[Any]) -> int:
        return int(db.execute(sql, params).lastrowid or 0)

    def check_claims(self) -> None:
        """Take the write lock and let it go: a read-only file or directory fails here."""
        try:
            with self._transaction() as db:
                db.execute("DELETE FROM anarchon_runs WHERE 0")
        except sqlite3.Error as exc:
            raise self._unusable("write to", exc) from exc

    def schema_sql(self) -> str:
        """The SQL that makes anarchon's tables (the backend makes them itself in a new file)."""
        return (
            "-- anarchon_celery's tables (SQLite); the backend makes them in a new file itself.\n"
            + _TABLES.strip()
            + "\n"
        )

    def _unusable(self, doing: str, exc: sqlite3.Error) -> BrokerError:
        """BrokerRefused when only a change of configuration helps (no such directory, no right
        to write, not a database), else BrokerUnavailable (locked, busy: tried again)."""
        text = f"cannot {doing} SQLite database {self.path}: {exc}"
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF not in _PERMANENT_CODES:
            return BrokerUnavailable(text)
        return BrokerRefused(f"{text}: {_why_not_writable(self.path)}")

    def store_version(self) -> str:
        """What the store is, for ``check``."""
        return f"SQLite {sqlite3.sqlite_version}, write-ahead log"

    def describe(self) -> str:
        return f"SQLite database {self.path} (prefix {self.prefix!r})"

    def close(self) -> None:
        with self._lock:
            if self._db is not None and self._pid == os.getpid():
                with contextlib.suppress(sqlite3.Error):
                    self._db.close()
            self._db = None


def _stored(cursor: int | None) -> int:
    """A cursor as its row keeps it: -1 for none (a row made for a job's overlap state only)."""
    return -1 if cursor is None else cursor
