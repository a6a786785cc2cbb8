"""Pauses on the SQL stores (see :mod:`.pauses`): each job's pause is the column
``anarchon_jobs.paused``, which a claim reads in its transaction (a job paused before its first
claim gets a row without a cursor). A part of :class:`~.sql.SqlBackend`."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .ordered import resumed_cursor
from .pauses import Pause

__all__ = ["SqlPauses"]


class SqlPauses:
    """The pause steps of a SQL store, mixed into :class:`~.sql.SqlBackend`."""

    prefix: str

    if TYPE_CHECKING:

        def _rows(self) -> contextlib.AbstractContextManager[Any]: ...

        def _now(self, db: Any) -> int: ...

    def _end_pauses(self, db: Any, jobs: Sequence[str]) -> None:
        """Forget the pauses of ``jobs``, which ran out (in a claim's transaction)."""
        db.executemany(
            "UPDATE anarchon_jobs SET paused = NULL WHERE prefix = ? AND job = ?", [(self.prefix, job) for job in jobs]
        )

    def _pause(self, job: str, pause: Pause) -> None:
        with self._rows() as db:
            db.execute(
                "INSERT INTO anarchon_jobs (prefix, job, cursor, paused) VALUES (?, ?, -1, ?) "
                "ON CONFLICT (prefix, job) DO UPDATE SET paused = excluded.paused",
                (self.prefix, job, pause.encode()),
            )

    def _resume(self, job: str) -> Pause | None:
        with self._rows() as db:
            row = db.execute(
                f"SELECT cursor, paused FROM anarchon_jobs WHERE prefix = ? AND job = ?{self.lock_row}",
                (self.prefix, job),
            ).fetchone()
            pause = Pause.decode(row[1]) if row is not None else None
            if pause is None:
                return None
            now = self._now(db)
            at = now if pause.in_effect(now) or pause.until_ms is None else pause.until_ms  # (ran out then)
            cursor = resumed_cursor(None if row[0] < 0 else int(row[0]), at)
            db.execute(
                "UPDATE anarchon_jobs SET paused = NULL, cursor = ? WHERE prefix = ? AND job = ?",
                (-1 if cursor is None else cursor, self.prefix, job),
            )
        return pause if pause.in_effect(now) else None

    def _pauses(self) -> dict[str, Pause]:
        with self._rows() as db:
            rows = db.execute(
                "SELECT job, paused FROM anarchon_jobs WHERE prefix = ? AND paused IS NOT NULL", (self.prefix,)
            ).fetchall()
            now = self._now(db)
        found = {str(job): Pause.decode(text) for job, text in rows}
        return {job: pause for job, pause in sorted(found.items()) if pause is not None and pause.in_effect(now)}

    #: Appended to the statement that reads one job's row to change it (PostgreSQL locks it).
    lock_row = ""
