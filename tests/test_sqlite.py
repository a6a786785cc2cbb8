"""The SQLite backend: runs decided in one database file by real processes, on SQLite's clock,
each job's runs in slot order; what it refuses and how it fails. No broker involved."""

from __future__ import annotations

import logging
import multiprocessing
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from anarchon_celery import BrokerRefused, BrokerUnavailable, Claim, ConfigError, Outcome, SQLiteBackend
from anarchon_celery.backends import TakeoverKind
from anarchon_celery.backends.sqlite import network_file_system, sqlite_path
from anarchon_celery.backends.store import EARLY_WAIT_MS


def _open(path: Path, **kwargs: Any) -> SQLiteBackend:
    backend = SQLiteBackend(path, prefix="t.", **kwargs)
    backend.open()
    return backend


def test_a_run_not_due_on_the_databases_clock_is_early_never_won(tmp_path: Path) -> None:
    backend = _open(tmp_path / "a.db")
    now = backend.store_now_ms()
    # An instance whose clock is a minute ahead claims its run a minute early: not decided.
    assert backend.claim([Claim("job", now + 60_000)], "ahead") == [Outcome.EARLY]
    assert backend.holder("job", now + 60_000) is None
    # Nor does the early claim move the job's cursor: an earlier run is still won.
    assert backend.claim([Claim("job", now - 1)], "b") == [Outcome.WON]
    backend.close()


def test_a_run_a_little_early_waits_for_its_slot_on_the_databases_clock(tmp_path: Path) -> None:
    backend = _open(tmp_path / "a.db")
    slot = backend.store_now_ms() + EARLY_WAIT_MS // 2
    assert backend.claim([Claim("job", slot)], "a") == [Outcome.WON]
    with sqlite3.connect(tmp_path / "a.db") as db:
        decided = db.execute("SELECT decided_ms FROM anarchon_runs WHERE job = 'job'").fetchone()[0]
    assert decided >= slot  # never before its slot, on the store's clock
    backend.close()


def test_the_deadline_is_judged_on_the_databases_clock(tmp_path: Path) -> None:
    backend = _open(tmp_path / "a.db")
    now = backend.store_now_ms()
    # The instance thought there was time left; the database says the deadline is past.
    claims = [Claim("late", now - 5_000, deadline_ms=now - 1_000), Claim("ok", now - 5_000, deadline_ms=now + 60_000)]
    assert backend.claim(claims, "a") == [Outcome.UNDECIDED, Outcome.WON]
    backend.close()


def test_runs_decided_in_one_batch_in_slot_order_whatever_the_order_given(tmp_path: Path) -> None:
    a, b = _open(tmp_path / "a.db"), _open(tmp_path / "a.db")
    assert a.claim([Claim("job", 3_000), Claim("job", 1_000), Claim("job", 2_000)], "a") == [Outcome.WON] * 3
    assert b.claim([Claim("job", 1_000), Claim("job", 2_000), Claim("job", 3_000)], "b") == [Outcome.LOST] * 3
    a.close()
    b.close()


def test_a_locked_database_leaves_runs_away_and_says_when_it_is_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="anarchon_celery")
    backend = _open(tmp_path / "a.db", timeout=0.2)
    holder = sqlite3.connect(tmp_path / "a.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holding the write lock
    try:
        # Away: the scheduler claims them again until their deadline; nothing was decided.
        assert backend.claim([Claim("job", 1), Claim("job", 2)], "a") == [Outcome.AWAY] * 2
        assert backend.in_outage()
        backend.missed("job", [7, 8, 9])  # runs the scheduler gave up meanwhile
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert backend.claim([Claim("job", 1)], "a") == [Outcome.WON]
    assert not backend.in_outage()
    assert "cannot decide claims (OperationalError: database is locked)" in caplog.text
    assert (
        "is back after" in caplog.text
        and "3 run(s) were not claimed meanwhile (their deadline passed): job 'job' slots 7, 8, 9" in caplog.text
    )
    backend.close()


def test_a_database_that_cannot_be_opened_is_a_clear_error(tmp_path: Path) -> None:
    backend = SQLiteBackend(tmp_path / "no" / "such" / "dir" / "a.db")
    # Neither can succeed by trying again: refused (beat stops at start), with what to do.
    with pytest.raises(BrokerRefused, match=r"cannot open SQLite database .*/no/such/dir/a.db: .*does not exist"):
        backend.open()
    (tmp_path / "not-a-db").write_bytes(b"this is no database, and it is long enough to be read as a header" * 10)
    with pytest.raises(BrokerRefused, match="not-a-db: file is not a database"):
        SQLiteBackend(tmp_path / "not-a-db").open()


def test_a_locked_database_is_an_outage_not_a_refusal(tmp_path: Path) -> None:
    backend = _open(tmp_path / "a.db")
    backend.timeout = 0.2
    holder = sqlite3.connect(tmp_path / "a.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(BrokerUnavailable, match="database is locked"):
            backend.check_claims()
    finally:
        holder.rollback()
        holder.close()
        backend.close()


def _open_at_once(path: str, barrier: Any, results: Any) -> None:
    barrier.wait()
    try:
        SQLiteBackend(path, prefix="t.").open()
        results.put("opened")
    except Exception as exc:  # noqa: BLE001 - told to the test
        results.put(repr(exc))


def test_processes_opening_a_new_file_at_once_all_open_it(tmp_path: Path) -> None:
    """Beats started together on a new file: its switch to write-ahead logging can fail at once
    ("database is locked", SQLite's busy handler not called); each waits its turn instead. The
    race is lost now and then (a few rounds in a hundred without the wait), hence 60 rounds."""
    context = multiprocessing.get_context("fork")
    failed = []
    for round_ in range(60):
        path = str(tmp_path / f"r{round_}.db")
        barrier, results = context.Barrier(4), context.Queue()
        procs = [context.Process(target=_open_at_once, args=(path, barrier, results)) for _ in range(4)]
        for proc in procs:
            proc.start()
        failed += [told for told in (results.get(timeout=30) for _ in procs) if told != "opened"]
        for proc in procs:
            proc.join()
    assert failed == []


def test_history_is_trimmed_to_about_its_size(tmp_path: Path) -> None:
    from anarchon_celery.history import EVENTS_PER_RUN, encode_event

    backend = _open(tmp_path / "a.db")
    events = [("job", encode_event("sent", run=f"r{n:03d}", job="job", at_ms=n, slot=n), 5) for n in range(100)]
    assert backend.record_many(events) == 100
    assert not backend.record("job", b"not an event", 5)
    kept = [event["run"] for event in backend.read_history(["job"])["job"]]
    assert kept == [f"r{n:03d}" for n in range(100 - 5 * (EVENTS_PER_RUN + 1), 100)]
    backend.close()


def test_a_forked_child_opens_its_own_connection(tmp_path: Path) -> None:
    backend = _open(tmp_path / "a.db")
    assert backend.claim([Claim("job", 1)], "parent") == [Outcome.WON]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's connection must not be used across the fork
        try:
            outcome = backend.claim([Claim("job", 1), Claim("job", 2)], "child")
            os.write(write, ",".join(o.value for o in outcome).encode())
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 100).decode() == "lost,won"
    assert backend.holder("job", 2) == "child"
    backend.close()


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:///anarchon.db", "anarchon.db"),
        ("sqlite:///data/anarchon.db", "data/anarchon.db"),
        ("sqlite:////var/lib/anarchon.db", "/var/lib/anarchon.db"),
        ("sqlite:////var/lib/anarchon.db?mode=rw", "/var/lib/anarchon.db"),
    ],
)
def test_sqlite_urls_read_as_sqlalchemy_reads_them(url: str, path: str) -> None:
    assert sqlite_path(url) == path


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite://", "invalid SQLite URL"),
        ("sqlite:///", "invalid SQLite URL"),
        ("sqlite://host/a.db", "invalid SQLite URL"),
        ("sqlite:///:memory:", "not shared between processes"),
    ],
)
def test_bad_sqlite_urls_are_clear_errors(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        sqlite_path(url)


@pytest.mark.parametrize("timeout", [0, -1, "5", True])
def test_bad_options_are_clear_errors(timeout: Any, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="timeout must be a positive number"):
        SQLiteBackend(tmp_path / "a.db", timeout=timeout)


@pytest.mark.parametrize("lease_ms", [0, 99, 3_600_001, 1.5, True, None])
def test_a_bad_lease_is_a_clear_error(lease_ms: Any, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="lease_ms must be an integer from 100 to 3600000"):
        SQLiteBackend(tmp_path / "a.db", lease_ms=lease_ms)


def test_a_file_made_before_leases_is_upgraded(tmp_path: Path) -> None:
    """A file of schema 1 (runs without leases) gets the lease columns at first open, and keeps
    its cursors: a run decided before is still decided."""
    import sqlite3

    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE anarchon_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO anarchon_meta VALUES ('schema', '1');
        CREATE TABLE anarchon_jobs (prefix TEXT NOT NULL, job TEXT NOT NULL, cursor INTEGER NOT NULL,
            PRIMARY KEY (prefix, job)) WITHOUT ROWID;
        INSERT INTO anarchon_jobs VALUES ('cron.', 'j', 5000);
        CREATE TABLE anarchon_runs (prefix TEXT NOT NULL, job TEXT NOT NULL, slot INTEGER NOT NULL,
            holder TEXT NOT NULL, token INTEGER NOT NULL, state TEXT NOT NULL, decided_ms INTEGER NOT NULL,
            deadline_ms INTEGER, PRIMARY KEY (prefix, job, slot)) WITHOUT ROWID;
        INSERT INTO anarchon_runs VALUES ('cron.', 'j', 5000, 'old', 1, 'claimed', 99999999999999, NULL);
        """
    )
    db.close()
    backend = SQLiteBackend(path)
    assert backend.claim([Claim("j", 5000), Claim("j", 6000, backups=1)], "new") == [Outcome.LOST, Outcome.WON]
    record = backend.run_record("j", 5000)
    assert record is not None and (record.holder, record.token, record.lease_end_ms) == ("old", 1, 0)
    # Won before leases: its task went without a token, so a takeover could run it twice. Left alone.
    assert backend.take_over([Claim("j", 5000)], "new")[0].kind is TakeoverKind.DONE
    backend.close()


MOUNTS = """\
/dev/sda1 / ext4 rw,relatime 0 0
server:/export /srv/shared nfs4 rw,relatime 0 0
//nas/share /mnt/nas cifs rw 0 0
sshfs#me@host: /mnt/remote fuse.sshfs rw 0 0
tmpfs /srv/shared/local tmpfs rw 0 0
/dev/sdb1 /mnt/nas\\040disk ext4 rw 0 0
"""


@pytest.mark.parametrize(
    ("path", "found"),
    [
        ("/var/lib/anarchon.db", None),
        ("/srv/shared/anarchon.db", "nfs4"),
        ("/srv/shared/deep/er/anarchon.db", "nfs4"),
        ("/srv/shared/local/anarchon.db", None),  # a local mount inside the network one
        ("/srv/sharedness/anarchon.db", None),  # a prefix of the name, not of the path
        ("/mnt/nas/a.db", "cifs"),
        ("/mnt/nas disk/a.db", None),
        ("/mnt/remote/a.db", "fuse.sshfs"),
    ],
)
def test_network_file_systems_are_told_from_the_mount_table(path: str, found: str | None) -> None:
    assert network_file_system(path, MOUNTS) == found


def test_a_database_on_a_network_file_system_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file system as /proc/mounts would say it on a host with an NFS home."""
    import anarchon_celery.backends.sqlite as module

    real = module.network_file_system
    monkeypatch.setattr(module, "network_file_system", lambda path: real(path, f"nfs:/x {tmp_path} nfs rw 0 0\n"))
    with pytest.raises(ConfigError, match=r"network file system \(nfs\).*a run could be won twice"):
        SQLiteBackend(tmp_path / "a.db").open()
