"""Runtime jobs on the SQL stores (see :mod:`.definitions`): each definition is a row of
``anarchon_defs``, and each change a row of ``anarchon_changes``, which the instances read in
order. A change locks its job's row of ``anarchon_jobs`` first, as a claim does, so that a claim
and a change of one job never interleave. A part of :class:`~.sql.SqlBackend`."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .definitions import JobDef, check_change, removed

__all__ = ["SqlDefinitions"]

#: Changes older than this are deleted by the next change (an instance that has not looked for
#: them since reads every definition instead).
CHANGES_KEPT_MS = 86_400_000


class SqlDefinitions:
    """The runtime job steps of a SQL store, mixed into :class:`~.sql.SqlBackend`."""

    prefix: str
    lock_row: str

    if TYPE_CHECKING:

        def _rows(self) -> contextlib.AbstractContextManager[Any]: ...

        def _now(self, db: Any) -> int: ...

        def _reading(self) -> contextlib.AbstractContextManager[Any]: ...

    def _lock_job(self, db: Any, job: str) -> None:
        """The job's row of ``anarchon_jobs`` made if missing, and locked (PostgreSQL)."""
        db.execute(
            "INSERT INTO anarchon_jobs (prefix, job, cursor) VALUES (?, ?, -1) ON CONFLICT (prefix, job) DO NOTHING",
            (self.prefix, job),
        )
        db.execute(f"SELECT cursor FROM anarchon_jobs WHERE prefix = ? AND job = ?{self.lock_row}", (self.prefix, job))

    def _kept(self, db: Any, job: str) -> JobDef | None:
        row = db.execute(
            "SELECT version, entry, author, at_ms FROM anarchon_defs WHERE prefix = ? AND job = ?", (self.prefix, job)
        ).fetchone()
        return None if row is None else _def(job, *row)

    def _changed(self, db: Any, job: str, version: int, now: int) -> None:
        db.execute(
            "INSERT INTO anarchon_changes (prefix, job, version, at_ms) VALUES (?, ?, ?, ?)",
            (self.prefix, job, version, now),
        )
        db.execute("DELETE FROM anarchon_changes WHERE prefix = ? AND at_ms < ?", (self.prefix, now - CHANGES_KEPT_MS))

    def _put_job(self, name: str, entry: Mapping[str, Any], base: int | None, by: str) -> JobDef:
        with self._rows() as db:
            self._lock_job(db, name)
            version = check_change(name, self._kept(db, name), base)
            now = self._now(db)
            kept = JobDef(name, version, dict(entry), by, now)
            db.execute(
                "INSERT INTO anarchon_defs (prefix, job, version, entry, author, at_ms) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (prefix, job) DO UPDATE SET version = excluded.version, entry = excluded.entry, "
                "author = excluded.author, at_ms = excluded.at_ms",
                (self.prefix, name, version, json.dumps(kept.entry, sort_keys=True), by, now),
            )
            self._changed(db, name, version, now)
        return kept

    def _remove_job(self, name: str, base: int | None) -> JobDef:
        with self._rows() as db:
            self._lock_job(db, name)
            gone = removed(name, self._kept(db, name), base)
            db.execute("DELETE FROM anarchon_defs WHERE prefix = ? AND job = ?", (self.prefix, name))
            db.execute("UPDATE anarchon_jobs SET paused = NULL WHERE prefix = ? AND job = ?", (self.prefix, name))
            self._changed(db, name, 0, self._now(db))
        return gone

    def _runtime_jobs(self, names: Sequence[str] | None) -> dict[str, JobDef]:
        select = "SELECT job, version, entry, author, at_ms FROM anarchon_defs WHERE prefix = ?"
        rows: list[Any] = []
        with self._rows() as db:
            if names is None:
                rows = db.execute(f"{select} ORDER BY job", (self.prefix,)).fetchall()
            unique = sorted(set(names or ()))
            for start in range(0, len(unique), 400):
                part = unique[start : start + 400]
                rows += db.execute(
                    f"{select} AND job IN ({', '.join('?' * len(part))}) ORDER BY job", (self.prefix, *part)
                ).fetchall()
        return {str(job): _def(str(job), *rest) for job, *rest in rows}

    def _job_changes(self, since: Any) -> tuple[set[str] | None, Any]:
        with self._reading() as db:
            if since is None:
                row = db.execute("SELECT MAX(id) FROM anarchon_changes WHERE prefix = ?", (self.prefix,)).fetchone()
                return set(), int(row[0] or 0)
            rows = db.execute(
                "SELECT id, job FROM anarchon_changes WHERE prefix = ? AND id > ? ORDER BY id", (self.prefix, since)
            ).fetchall()
        return {str(job) for _, job in rows}, (int(rows[-1][0]) if rows else since)

    def _versions(self, db: Any, jobs: Sequence[str]) -> dict[str, int]:
        """The versions kept of those of ``jobs`` that are runtime jobs (in a claim's transaction)."""
        unique = sorted(set(jobs))
        if not unique:
            return {}
        rows = db.execute(
            f"SELECT job, version FROM anarchon_defs WHERE prefix = ? AND job IN ({', '.join('?' * len(unique))})",
            (self.prefix, *unique),
        ).fetchall()
        return {str(job): int(version) for job, version in rows}


def _def(job: str, version: Any, entry: str, author: str, at_ms: Any) -> JobDef:
    try:
        kept = json.loads(entry)
    except ValueError:
        kept = {}
    return JobDef(job, int(version), kept if isinstance(kept, dict) else {}, author or "", int(at_ms or 0))
