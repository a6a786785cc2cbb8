"""What the SQL stores (PostgreSQL, SQLite) share beyond the claim loop: the record of each win,
history events and the instances' job definitions, as rows of the ``anarchon_*`` tables, each
deployment's under its prefix. Statements are written with ``?`` placeholders; a store whose
driver takes ``%s`` says so."""

from __future__ import annotations

import abc
import contextlib
import logging
import secrets
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..errors import BrokerUnavailable
from ..history import EVENTS_PER_RUN, decode_event
from . import busy, leases
from .base import Claim, Outcome
from .leases import RunRecord
from .peers import Peers
from .sql_births import SqlBirths
from .sql_busy import SqlOverlap
from .sql_defs import SqlDefinitions
from .sql_pauses import SqlPauses
from .store import Answer, StoreBackend

__all__ = ["SqlBackend"]

logger = logging.getLogger(__name__)

#: Announcements of job definitions older than this are deleted by the next one written.
PEERS_KEPT_MS = 86_400_000
#: Seconds between two prunings of the records of old wins.
PRUNE_EVERY_S = 60.0


class SqlBackend(SqlDefinitions, SqlPauses, SqlBirths, SqlOverlap, StoreBackend):
    """Rows of runs won, history and job definitions, in a SQL database."""

    #: The driver's placeholder, for the ``?`` of the statements below.
    placeholder = "?"

    def __init__(self, prefix: str, slot_ttl_ms: int, timeout: float, lease_ms: int) -> None:
        super().__init__(prefix, slot_ttl_ms, timeout, lease_ms)
        self._peers: Peers | None = None
        self._heard = 0  # the last anarchon_peers row read
        self._pruned = 0.0

    @abc.abstractmethod
    def _transaction(self) -> contextlib.AbstractContextManager[Any]:
        """One transaction, committed at the end of the block, rolled back if it raises; yields
        an object with ``execute(sql, params)`` and ``executemany``."""

    @abc.abstractmethod
    def _inserted_id(self, db: Any, sql: str, params: Sequence[Any]) -> int:
        """Run an INSERT of one row in ``db``; return the row's id."""

    def _sql(self, statement: str) -> str:
        return statement if self.placeholder == "?" else statement.replace("?", self.placeholder)

    @contextlib.contextmanager
    def _rows(self) -> Iterator[Any]:
        """A transaction whose statements take ``?`` placeholders."""
        with self._transaction() as db:
            yield _Placeholders(db, self._sql)

    def _reading(self) -> contextlib.AbstractContextManager[Any]:
        """Where a read that changes nothing is made: a transaction by default (SQLite reads
        without taking its write lock)."""
        return self._rows()

    def _now(self, db: Any) -> int:
        """The store's clock, read in ``db``'s transaction."""
        return int(db.execute(self.now_sql, ()).fetchone()[0])

    #: The statement that reads the store's clock, in epoch milliseconds.
    now_sql = ""

    #: Appended to the statement that reads run records to change them (PostgreSQL locks them).
    lock_rows = ""
    #: The order in which run records are read (and locked): the order Python sorts the keys in.
    key_order = "job, slot"
    #: The statement that reads the store's clock once the rows are locked (see :attr:`now_sql`).
    locked_now_sql = ""

    # -- leases -------------------------------------------------------------------------------

    def _records(self, db: Any, keys: Sequence[tuple[str, int]]) -> dict[tuple[str, int], RunRecord]:
        """The records of runs ``(job, slot)`` kept, read (and locked, where the store locks rows)
        in job and slot order."""
        found: dict[tuple[str, int], RunRecord] = {}
        unique = sorted(set(keys))
        for start in range(0, len(unique), 400):
            part = unique[start : start + 400]
            rows = db.execute(
                "SELECT job, slot, holder, token, state, lease_end_ms, deadline_ms, backups, gap_after "
                "FROM anarchon_runs "
                f"WHERE prefix = ? AND (job, slot) IN (VALUES {', '.join(['(?, ?)'] * len(part))}) "
                f"ORDER BY {self.key_order}{self.lock_rows}",
                (self.prefix, *(value for key in part for value in key)),
            ).fetchall()
            for job, slot, holder, token, state, lease_end, deadline, backups, gap_after in rows:
                found[job, int(slot)] = RunRecord(holder, token, state, lease_end, deadline, backups, gap_after)
        return found

    def _write_records(self, db: Any, records: Mapping[tuple[str, int], RunRecord]) -> None:
        db.executemany(
            "UPDATE anarchon_runs SET holder = ?, token = ?, state = ?, lease_end_ms = ?, backups = ? "
            "WHERE prefix = ? AND job = ? AND slot = ?",
            [
                (r.holder, r.token, r.state, r.lease_end_ms, r.backups, self.prefix, job, slot)
                for (job, slot), r in records.items()
            ],
        )

    def _locked_now(self, db: Any) -> int:
        return int(db.execute(self.locked_now_sql or self.now_sql, ()).fetchone()[0])

    def _arm(
        self,
        raw: Any,
        claims: Sequence[Claim],
        decided: Sequence[tuple[Outcome, int]],
        now: int,
        records: Mapping[tuple[str, int], RunRecord],
        gaps: Mapping[int, int],
        verdicts: Mapping[int, str],
    ) -> list[Answer]:
        """The answers to claims decided in ``raw``'s transaction, the losers of runs still only
        claimed armed as their backups (while the claims want more). ``records`` are the runs'
        records as read (and locked) in the transaction, before its wins; ``gaps`` the gaps the
        wins left, by claim index (see :func:`.ordered.decide`); ``verdicts`` the wins not sent,
        their job busy (not won, then: nobody sends them)."""
        answers = [
            Answer(Outcome.LOST, 0, 0, gaps.get(i), verdicts[i])
            if i in verdicts
            else Answer(outcome, amount, 0, gaps.get(i))
            for i, (outcome, amount) in enumerate(decided)
        ]
        losers = [i for i, (outcome, _) in enumerate(decided) if outcome is Outcome.LOST and claims[i].backups > 0]
        if not losers:
            return answers
        db = _Placeholders(raw, self._sql)
        changed = {}
        for i in losers:
            key = (claims[i].job, claims[i].slot)
            armed = leases.arm(records.get(key), claims[i].backups, now)
            if armed is not None:
                answers[i] = Answer(Outcome.LOST, armed[1], armed[0])
                changed[key] = records[key]
        if changed:
            self._write_records(db, changed)
        return answers

    def _take_over(self, claims: Sequence[Claim], instance: str) -> list[tuple[str, int]]:
        with self._rows() as db:
            states = self._busy_states(db, [c.job for c in claims])  # (locked before the runs, as a claim does)
            records = self._records(db, [(c.job, c.slot) for c in claims])
            now = self._locked_now(db)
            answers = []
            changed = {}
            for claim in claims:
                key = (claim.job, claim.slot)
                answer = leases.take_over(records.get(key), instance, now, self.lease_ms)
                if answer[0] == "won":
                    changed[key] = records[key]
                answers.append(answer)
            self._write_records(db, changed)
            for (job, slot), record in changed.items():  # the run holds its job for the new lease
                busy.held_by_lease(states.get(job), slot, record.lease_end_ms)
            self._write_busy(db, {job: states[job] for job, _ in changed if job in states})
        return answers

    def _mark_sent(self, runs: Sequence[tuple[str, int, int]]) -> list[bool]:
        with self._rows() as db:
            states = self._busy_states(db, [job for job, _, _ in runs])  # (locked before the runs)
            records = self._records(db, [(job, slot) for job, slot, _ in runs])
            results = [leases.mark_sent(records.get((job, slot)), token) for job, slot, token in runs]
            self._write_records(db, records)
            if states:  # a run sent holds its job until a worker starts it (queued_ms)
                now = self._locked_now(db)
                for (job, slot, _), marked in zip(runs, results):
                    if marked:
                        busy.sent(states.get(job), slot, now)
                self._write_busy(db, states)
        return results

    def _hand_back(self, runs: Sequence[tuple[str, int, int]], instance: str) -> int:
        with self._rows() as db:
            records = self._records(db, [(job, slot) for job, slot, _ in runs])
            now = self._locked_now(db)
            given = {
                (job, slot): records[job, slot]
                for job, slot, token in runs
                if leases.hand_back(records.get((job, slot)), instance, token, now)
            }
            self._write_records(db, given)
            if given:
                self._tell_handed_back(db, list(given), now)
        return len(given)

    @abc.abstractmethod
    def _tell_handed_back(self, db: Any, runs: list[tuple[str, int]], now: int) -> None:
        """Tell the other instances, in ``db``'s transaction, of runs handed back."""

    def _mark_backfilled(self, job: str, slots: Sequence[int], instance: str) -> list[bool]:
        """A row per run, inserted unless there is one: two backfills of one range mark each run
        once, whichever inserts first."""
        with self._rows() as db:
            now = self._now(db)
            return [
                db.execute(
                    "INSERT INTO anarchon_backfills (prefix, job, slot, instance, at_ms) VALUES (?, ?, ?, ?, ?) "
                    "ON CONFLICT (prefix, job, slot) DO NOTHING",
                    (self.prefix, job, slot, instance, now),
                ).rowcount
                == 1
                for slot in slots
            ]

    def _unmark_backfilled(self, job: str, slots: Sequence[int]) -> None:
        with self._rows() as db:
            db.executemany(
                "DELETE FROM anarchon_backfills WHERE prefix = ? AND job = ? AND slot = ?",
                [(self.prefix, job, slot) for slot in slots],
            )

    def _backfilled(self, job: str, slots: Sequence[int]) -> set[int]:
        found: set[int] = set()
        unique = sorted(set(slots))
        with self._rows() as db:
            for start in range(0, len(unique), 400):
                part = unique[start : start + 400]
                rows = db.execute(
                    f"SELECT slot FROM anarchon_backfills WHERE prefix = ? AND job = ? AND slot IN "
                    f"({', '.join('?' * len(part))})",
                    (self.prefix, job, *part),
                ).fetchall()
                found.update(int(slot) for (slot,) in rows)
        return found

    def run_record(self, job: str, slot: int) -> RunRecord | None:
        """The record of a run won, while it is kept: for tests and diagnostics."""
        with self._rows() as db:
            return self._records(db, [(job, slot)]).get((job, slot))

    def holder(self, job: str, slot: int) -> str | None:
        """The instance that won a run, while its record is kept: for tests and diagnostics."""
        with self._rows() as db:
            row = db.execute(
                "SELECT holder FROM anarchon_runs WHERE prefix = ? AND job = ? AND slot = ?", (self.prefix, job, slot)
            ).fetchone()
        return row[0] if row else None

    def store_now_ms(self) -> int:
        with self._rows() as db:
            return self._now(db)

    def _after_claims(self) -> None:
        """Forget the records of runs won more than ``slot_ttl_ms`` ago, about once a minute."""
        if time.monotonic() - self._pruned < PRUNE_EVERY_S:
            return
        self._pruned = time.monotonic()
        try:
            with self._rows() as db:
                db.execute(
                    "DELETE FROM anarchon_runs WHERE prefix = ? AND decided_ms < ?",
                    (self.prefix, self._now(db) - self.slot_ttl_ms),
                )
        except self.failure_errors as exc:
            logger.info("anarchon: old run records not pruned from %s (%s)", self.describe(), _first_line(exc))

    # -- instances' definitions -----------------------------------------------------------------

    def share_definitions(self, instance: str, definitions: Mapping[str, Mapping[str, str]]) -> None:
        """Say hello with our definitions (a row); the instances running answer with theirs when
        they next wake (an announcement of an instance long gone is never read)."""
        self._peers = Peers(instance, definitions)
        try:
            self._heard = self._announce(hello=True)
        except self.failure_errors as exc:
            logger.info("anarchon: job definitions not shared through %s (%s)", self.describe(), _first_line(exc))

    def _announce(self, *, hello: bool) -> int:
        """Write our announcement (and forget those over a day old); returns its row id."""
        peers = self._peers
        assert peers is not None
        peers.answer_due = False
        with self._rows() as db:
            now = self._now(db)
            db.execute("DELETE FROM anarchon_peers WHERE prefix = ? AND at_ms < ?", (self.prefix, now - PEERS_KEPT_MS))
            return self._inserted_id(
                db.raw,
                self._sql("INSERT INTO anarchon_peers (prefix, instance, announcement, at_ms) VALUES (?, ?, ?, ?)"),
                (self.prefix, peers.instance, peers.announcement(hello=hello).decode(), now),
            )

    def maintain(self) -> None:
        """Hear the announcements written since the last look, and answer a hello."""
        peers = self._peers
        if peers is None:
            return
        try:
            with self._outages.asking("read the instances' announcements"), self._rows() as db:
                rows = db.execute(
                    "SELECT id, announcement FROM anarchon_peers WHERE prefix = ? AND id > ? ORDER BY id",
                    (self.prefix, self._heard),
                ).fetchall()
            for row_id, announcement in rows:
                self._heard = row_id
                peers.heard(announcement)
            if peers.answer_due:
                with self._outages.asking("announce this instance's jobs"):
                    self._announce(hello=False)
        except self.failure_errors as exc:
            logger.debug("anarchon: announcements not shared through %s (%s)", self.describe(), _first_line(exc))

    # -- history --------------------------------------------------------------------------------

    def record(self, job: str, event: bytes, history_size: int) -> bool:
        return self.record_many([(job, event, history_size)]) == 1

    def record_many(self, events: Sequence[tuple[str, bytes, int]]) -> int:
        kept = [(job, event.decode(), size) for job, event, size in events if decode_event(event) is not None]
        if not kept:
            return 0
        try:
            with self._outages.asking(), self._rows() as db:  # (in workers too: no outage of the beat's)
                db.executemany(
                    "INSERT INTO anarchon_events (prefix, job, event) VALUES (?, ?, ?)",
                    [(self.prefix, job, event) for job, event, _ in kept],
                )
                for job, size in {job: size for job, _, size in kept}.items():
                    db.execute(
                        "DELETE FROM anarchon_events WHERE prefix = ? AND job = ? AND id <= "
                        "(SELECT id FROM anarchon_events WHERE prefix = ? AND job = ? ORDER BY id DESC "
                        "LIMIT 1 OFFSET ?)",
                        (self.prefix, job, self.prefix, job, size * (EVENTS_PER_RUN + 1)),
                    )
        except self.failure_errors as exc:
            logger.warning(
                "anarchon: %d history event(s) not written to %s (%s)", len(kept), self.describe(), _first_line(exc)
            )
            return 0
        return len(kept)

    def read_history(self, jobs: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        found: dict[str, list[dict[str, Any]]] = {job: [] for job in jobs}
        if not jobs:
            return found
        try:
            with self._rows() as db:
                rows = db.execute(
                    f"SELECT job, event FROM anarchon_events WHERE prefix = ? AND job IN "
                    f"({', '.join('?' * len(found))}) ORDER BY id",
                    (self.prefix, *found),
                ).fetchall()
        except self.failure_errors as exc:
            raise BrokerUnavailable(f"cannot read history from {self.describe()}: {_first_line(exc)}") from exc
        for job, event in rows:
            decoded = decode_event(event.encode())
            if decoded is not None:
                found[job].append(decoded)
        return found

    def _store_id(self) -> str:
        # A row of anarchon_jobs under a prefix no deployment can have ('#'): no table to add.
        with self._rows() as db:
            db.execute(
                "INSERT INTO anarchon_jobs (prefix, job, cursor) VALUES ('#', 'store-id', ?) "
                "ON CONFLICT (prefix, job) DO NOTHING",
                (secrets.randbits(62),),
            )
            (value,) = db.execute("SELECT cursor FROM anarchon_jobs WHERE prefix = '#' AND job = 'store-id'").fetchone()
        return f"{int(value):016x}"

    # -- what removed jobs leave ----------------------------------------------------------------

    def stored_jobs(self) -> list[str]:
        try:
            with self._rows() as db:
                rows = db.execute(
                    "SELECT job FROM anarchon_jobs WHERE prefix = ? UNION SELECT job FROM anarchon_runs WHERE "
                    "prefix = ? UNION SELECT job FROM anarchon_events WHERE prefix = ?",
                    (self.prefix, self.prefix, self.prefix),
                ).fetchall()
        except self.failure_errors as exc:
            raise BrokerUnavailable(f"cannot list the jobs in {self.describe()}: {_first_line(exc)}") from exc
        return sorted(str(job) for (job,) in rows)

    def jobs_with_state(self, prefix: str, jobs: Sequence[str]) -> list[str]:
        if not jobs:
            return []
        try:
            with self._rows() as db:
                rows = db.execute(
                    f"SELECT job FROM anarchon_jobs WHERE prefix = ? AND job IN ({', '.join('?' * len(jobs))})",
                    (prefix, *jobs),
                ).fetchall()
        except self.failure_errors as exc:
            raise BrokerUnavailable(f"cannot look up jobs in {self.describe()}: {_first_line(exc)}") from exc
        return sorted(str(job) for (job,) in rows)

    def forget_job(self, job: str) -> None:
        try:
            with self._rows() as db:
                for table in ("anarchon_jobs", "anarchon_runs", "anarchon_events", "anarchon_backfills"):
                    db.execute(f"DELETE FROM {table} WHERE prefix = ? AND job = ?", (self.prefix, job))
        except self.failure_errors as exc:
            raise BrokerUnavailable(f"cannot delete job {job!r} from {self.describe()}: {_first_line(exc)}") from exc


class _Placeholders:
    """A connection whose statements are written with ``?`` placeholders."""

    def __init__(self, raw: Any, sql: Any) -> None:
        self.raw, self._sql = raw, sql

    def execute(self, statement: str, params: Sequence[Any] = ()) -> Any:
        return self.raw.execute(self._sql(statement), params)

    def executemany(self, statement: str, rows: Sequence[Sequence[Any]]) -> Any:
        if not rows:
            return None
        target = self.raw if hasattr(self.raw, "executemany") else self.raw.cursor()
        return target.executemany(self._sql(statement), rows)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
