"""When each job came to be, on the SQL stores (see :mod:`.births`): the column
``anarchon_jobs.born``, beside the job's cursor. A part of :class:`~.sql.SqlBackend`."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .births import born

__all__ = ["SqlBirths"]


class SqlBirths:
    """The births step of a SQL store, mixed into :class:`~.sql.SqlBackend`."""

    prefix: str
    #: Appended to the statement that reads rows to change them (PostgreSQL locks them).
    lock_row = ""

    if TYPE_CHECKING:

        def _rows(self) -> contextlib.AbstractContextManager[Any]: ...

    def _introduce(self, since: Mapping[str, int]) -> dict[str, int]:
        """Every job's row made if missing, then the deployment's rows read, locked in the order
        a claim locks them (the database's order of their names: instances never deadlock), and
        each birth written where it goes down, in one transaction."""
        found: dict[str, int] = {}
        with self._rows() as db:
            db.executemany(
                "INSERT INTO anarchon_jobs (prefix, job, cursor) VALUES (?, ?, -1) "
                "ON CONFLICT (prefix, job) DO NOTHING",
                [(self.prefix, job) for job in sorted(since)],
            )
            rows = db.execute(
                f"SELECT job, cursor, born FROM anarchon_jobs WHERE prefix = ? ORDER BY job{self.lock_row}",
                (self.prefix,),
            ).fetchall()
            changed: list[tuple[int, str, str]] = []
            for job, cursor, kept in rows:
                if job in since:
                    value = found[job] = born(kept, None if cursor < 0 else int(cursor), since[job])
                    if value != kept:
                        changed.append((value, self.prefix, job))
            db.executemany("UPDATE anarchon_jobs SET born = ? WHERE prefix = ? AND job = ?", changed)
        return found
