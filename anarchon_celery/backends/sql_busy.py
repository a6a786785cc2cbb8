"""Overlap protection on the SQL stores (see :mod:`.busy`): each protected job's state is the
column ``anarchon_jobs.busy``, read (and locked, on PostgreSQL) before the runs' records, in job
order, as a claim reads them; the rules are :mod:`.busy`'s, applied in one transaction per step.
A part of :class:`~.sql.SqlBackend`."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import busy, leases
from .base import Claim, Outcome, Start
from .busy import Freed, JobBusy

if TYPE_CHECKING:
    from .leases import RunRecord

__all__ = ["SqlOverlap"]


class SqlOverlap:
    """The overlap steps of a SQL store, mixed into :class:`~.sql.SqlBackend`, which gives the
    transactions and the runs' records."""

    prefix: str
    lease_ms: int
    lock_rows: str
    _freed: list[tuple[str, Freed]]

    if TYPE_CHECKING:

        def _rows(self) -> contextlib.AbstractContextManager[Any]: ...

        def _records(self, db: Any, keys: Sequence[tuple[str, int]]) -> dict[tuple[str, int], RunRecord]: ...

        def _write_records(self, db: Any, records: Mapping[tuple[str, int], RunRecord]) -> None: ...

        def _locked_now(self, db: Any) -> int: ...

        def _reading(self) -> contextlib.AbstractContextManager[Any]: ...

        def _now(self, db: Any) -> int: ...

    def busy_states(self, jobs: Sequence[str]) -> tuple[dict[str, JobBusy], int]:
        """The overlap states of ``jobs`` that have one, with the store's clock, in one read that
        locks nothing and frees nothing (a hold run out is freed by the job's next claim or start):
        what a page or a command shows."""
        unique = sorted(set(jobs))
        with self._reading() as db:
            rows = (
                db.execute(
                    f"SELECT job, busy FROM anarchon_jobs WHERE prefix = ? AND job IN ({', '.join('?' * len(unique))})",
                    (self.prefix, *unique),
                ).fetchall()
                if unique
                else []
            )
            now_ms = self._now(db)
        return {job: state for job, text in rows if (state := JobBusy.decode(text)) is not None}, now_ms

    def _busy_states(self, db: Any, jobs: Sequence[str]) -> dict[str, JobBusy]:
        """The overlap states of ``jobs`` that have one, read (and locked, where the store locks
        rows: before their runs' records, as a claim does) in job order."""
        unique = sorted(set(jobs))
        if not unique:
            return {}
        rows = db.execute(
            f"SELECT job, busy FROM anarchon_jobs WHERE prefix = ? AND job IN ({', '.join('?' * len(unique))}) "
            f"ORDER BY job{self.lock_rows}",
            (self.prefix, *unique),
        ).fetchall()
        return {job: state for job, text in rows if (state := JobBusy.decode(text)) is not None}

    def _write_busy(self, db: Any, states: Mapping[str, JobBusy], read: Mapping[str, str] | None = None) -> None:
        """Write the overlap states of jobs (a row made for a job that has none yet); with
        ``read`` (job: the state as read, encoded), only those that changed."""
        rows = []
        for job, state in sorted(states.items()):
            text = state.encode()
            if read is None or read.get(job) != text:
                rows.append((self.prefix, job, text))
        db.executemany(
            "INSERT INTO anarchon_jobs (prefix, job, cursor, busy) VALUES (?, ?, -1, ?) "
            "ON CONFLICT (prefix, job) DO UPDATE SET busy = excluded.busy",
            rows,
        )

    def _admit(
        self, claims: Sequence[Claim], results: list[tuple[Outcome, int]], states: dict[str, JobBusy], now: int
    ) -> dict[int, str]:
        """:func:`.busy.admit_wins` for the claims just won, in a claim's transaction: returns the
        verdicts of the wins not sent, by index; the states changed are in ``states``."""
        won = [i for i, (outcome, _) in enumerate(results) if outcome is Outcome.WON]
        if not any(claims[i].overlap not in ("", busy.ALLOW) or claims[i].job in states for i in won):
            return {}
        verdicts, freed = busy.admit_wins(
            [(c.job, c.slot, c.overlap, c.queued_ms) for c in claims], won, states, now, self.lease_ms, self._gone
        )
        self._freed += freed
        return verdicts

    def _start(self, job: str, slot: int, token: int, redelivered: bool, run: str, worker: str, lease_ms: int) -> Start:
        with self._rows() as db:
            states = self._busy_states(db, [job])
            record = self._records(db, [(job, slot)]).get((job, slot))
            allowed = leases.start(record, token, redelivered) if token else None
            if allowed is False:
                return Start(False)
            state = states.get(job)
            now = self._locked_now(db)
            verdict, freed = busy.start(
                state, slot, run, worker, now, lease_ms, has_record=record is not None, gone=self._gone
            )
            if state is not None:
                self._write_busy(db, {job: state})
            if verdict != busy.RUN:
                left = max(0, state.until_ms - now) if state is not None else 0
                return Start(False, verdict, left, freed)
            if allowed and record is not None:
                self._write_records(db, {(job, slot): record})
        holds = state is not None and state.policy != busy.ALLOW
        return Start(allowed, "", 0, freed, holds)

    def _gone(self, worker: str) -> bool:
        """Whether ``worker`` is known to be gone (see :data:`.busy.Gone`); by default, never."""
        return False

    def _renew_busy(self, runs: Sequence[tuple[str, int, str]], lease_ms: int) -> list[str | None]:
        with self._rows() as db:
            states = self._busy_states(db, [job for job, _, _ in runs])
            if not states:
                return [None] * len(runs)
            read = {job: state.encode() for job, state in states.items()}
            now = self._locked_now(db)
            renewed = [busy.renew(states.get(job), slot, holder, now, lease_ms) for job, slot, holder in runs]
            self._write_busy(db, states, read)
        return renewed

    def _end_busy(self, job: str, slot: int, holder: str, retrying: bool) -> bool:
        with self._rows() as db:
            state = self._busy_states(db, [job]).get(job)
            if retrying:
                ended = busy.retrying(state, slot, holder, self._locked_now(db))
            else:
                ended = busy.end(state, slot, holder)
            if ended and state is not None:
                self._write_busy(db, {job: state})
        return ended

    def _next_pending(
        self, jobs: Sequence[str], instance: str, deadline_ms: Mapping[str, int]
    ) -> tuple[list[tuple[str, int, int]], list[tuple[str, Freed]]]:
        with self._rows() as db:
            states = self._busy_states(db, jobs)
            now = self._locked_now(db)
            taken: list[tuple[str, int, int]] = []
            freed: list[tuple[str, Freed]] = []
            for job, state in sorted(states.items()):
                slot, ended = busy.next_pending(state, now, self.lease_ms, self._gone)
                if ended is not None:
                    freed.append((job, ended))
                if slot is None:
                    continue
                token = db.execute(
                    "INSERT INTO anarchon_runs (prefix, job, slot, holder, token, state, decided_ms, deadline_ms, "
                    "lease_end_ms, backups) VALUES (?, ?, ?, ?, 1, 'claimed', ?, ?, ?, 0) "
                    "ON CONFLICT (prefix, job, slot) DO UPDATE SET holder = excluded.holder, "
                    "token = anarchon_runs.token + 1, state = 'claimed', decided_ms = excluded.decided_ms, "
                    "deadline_ms = excluded.deadline_ms, lease_end_ms = excluded.lease_end_ms RETURNING token",
                    (self.prefix, job, slot, instance, now, deadline_ms.get(job), now + self.lease_ms),
                ).fetchone()[0]
                taken.append((job, slot, int(token)))
            self._write_busy(db, states)
        return taken, freed
