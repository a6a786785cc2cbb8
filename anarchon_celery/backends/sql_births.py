"""When each job came to be, on the SQL stores (see :mod:`.births`): the column
``anarchon_jobs.born``, beside the job's cursor. A part of :class:`~.sql.SqlBackend`."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .births import born

__all__ = ["SqlBirths"]

#: Jobs read and written per statement (SQLite takes at most 32,766 parameters in one).
CHUNK = 500


class SqlBirths:
    """The births step of a SQL store, mixed into :class:`~.sql.SqlBackend`."""

    prefix: str
    #: Appended to the statement that reads rows to change them (PostgreSQL locks them).
    lock_row = ""

    if TYPE_CHECKING:

        def _rows(self) -> contextlib.AbstractContextManager[Any]: ...

    def _introduce(self, since: Mapping[str, int]) -> dict[str, int]:
        """Every job's row made if missing, then read (locked, in job order: two instances never
        deadlock) and its birth written where it goes down, in one transaction."""
        jobs = sorted(since)
        found: dict[str, int] = {}
        with self._rows() as db:
            db.executemany(
                "INSERT INTO anarchon_jobs (prefix, job, cursor) VALUES (?, ?, -1) "
                "ON CONFLICT (prefix, job) DO NOTHING",
                [(self.prefix, job) for job in jobs],
            )
            changed: list[tuple[int, str, str]] = []
            for start in range(0, len(jobs), CHUNK):
                chunk = jobs[start : start + CHUNK]
                rows = db.execute(
                    f"SELECT job, cursor, born FROM anarchon_jobs WHERE prefix = ? AND job IN "
                    f"({', '.join('?' * len(chunk))}) ORDER BY job{self.lock_row}",
                    (self.prefix, *chunk),
                ).fetchall()
                for job, cursor, kept in rows:
                    value = born(kept, None if cursor < 0 else int(cursor), since[job])
                    found[job] = value
                    if value != kept:
                        changed.append((value, self.prefix, job))
            db.executemany("UPDATE anarchon_jobs SET born = ? WHERE prefix = ? AND job = ?", changed)
        return found
