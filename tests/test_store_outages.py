"""Store outages under running `celery beat` processes: the store is killed and started again (or
stops answering) while three beats run a job every second; every run due over the outage is sent
once it is back, exactly once. The tasks go to the suite's RabbitMQ, where they are counted."""

from __future__ import annotations

import os
import re
import shutil
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .support import postgres_servers
from .support.redis_servers import OwnRedisServer
from .support.stores import delete_postgres_rows
from .test_backup_runners import _tokens
from .test_faults import Fleet, assert_each_run_once

pytestmark = [pytest.mark.broker, pytest.mark.processes, pytest.mark.stores]

#: How long the store is away: longer than the job's period (1 s) several times over, far shorter
#: than the runs' lateness allowed.
OUTAGE_S = 4.0
MAX_LATE_MS = 30_000
#: Longer than the outage: a run won just before it is marked sent once the store is back, before
#: its backups could take it over (a takeover would send it again, with a new token, legitimately).
#: The outages that last longer than OUTAGE_S (a stopped Redis, a locked SQLite) set longer ones.
LEASE_MS = 12_000
#: The line that says an outage started, whichever call of the beat found it.
OUTAGE_STARTS = re.compile(r"\) cannot [a-z' ]+ \(.*?\); no answer for [\d.]+s", re.S)


def _beat_envs(base: dict[str, str], store: str) -> list[dict[str, str]]:
    env = dict(
        base,
        HISTORY_APP_BACKEND=store,
        HISTORY_APP_EVERY="1",
        HISTORY_APP_MAX_LATE_MS=str(MAX_LATE_MS),
        HISTORY_APP_LEASE_MS=str(LEASE_MS),
        HISTORY_APP_SLOT_TTL_MS="120000",
        # Each instance claims each run at another moment, as a fleet's hosts do.
        HISTORY_APP_JITTER_MS="800",
    )
    return [env] * 3


def _run_through_an_outage(
    tmp_path: Path, envs: list[dict[str, str]], away: Iterator[None], broker_url: str, prefix: str
) -> None:
    """Start the beats, let runs be sent, play the outage (``away``'s first step takes the store
    away, its end brings it back), let runs be sent again, stop: every run sent exactly once."""
    fleet = Fleet(tmp_path, envs)
    try:
        fleet.wait_ready()
        fleet.wait_any("won, sent", fleet.offsets())
        time.sleep(2)
        before = fleet.offsets()
        next(away)  # the store is away
        time.sleep(OUTAGE_S)
        for _ in away:  # and back
            pass
        fleet.wait_any("won, sent", fleet.offsets(), timeout=60)
        # Runs due after the outage are sent too (the ones due meanwhile are claimed on the way).
        time.sleep(6)
        fleet.stop()
    finally:
        fleet.kill()
    tokens = _tokens(broker_url, prefix)
    assert all(sent == [1] for sent in tokens.values()), {s: t for s, t in tokens.items() if t != [1]}
    assert_each_run_once(list(tokens))
    during = [fleet.text(i)[offset:] for i, offset in enumerate(before)]
    # (the outage is found by whichever call of a beat the store fails first: a claim, a look for changes...)
    assert any(re.search(OUTAGE_STARTS, text) or "claiming again on a new connection" in text for text in during)
    text = "".join(fleet.text(i) for i in range(len(envs)))
    assert "Traceback" not in text
    assert "not run by this instance" not in text  # no run was given up


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fault", ["killed", "stopped"])
def test_runs_due_while_redis_is_away_are_each_sent_once(
    fault: str,
    beat_env: dict[str, str],
    broker_url: str,
    prefix: str,
    tmp_path: Path,
) -> None:
    """Redis killed and started again with its data; or stopped (SIGSTOP: connections accepted,
    nothing answered) for longer than a claim waits for it (5 s, then 5 s more on a new
    connection), so that claims sent before the stop are answered only after it."""
    if shutil.which("redis-server") is None:
        pytest.skip("no redis-server here")
    server = OwnRedisServer(tmp_path / "redis")
    envs = _beat_envs(beat_env, server.url)
    if fault == "stopped":  # the leases outlast the stop: runs won before it are marked sent after it
        envs = [dict(env, HISTORY_APP_LEASE_MS="20000") for env in envs]
    try:

        def away() -> Iterator[None]:
            if fault == "killed":
                server.kill()
                yield
                server.start()
                return
            assert server.proc is not None
            server.proc.send_signal(signal.SIGSTOP)
            try:
                time.sleep(10)  # with OUTAGE_S: longer than a claim's two waits
                yield
            finally:
                server.proc.send_signal(signal.SIGCONT)

        _run_through_an_outage(tmp_path, envs, away(), broker_url, prefix)
    finally:
        if server.proc is not None:
            server.proc.send_signal(signal.SIGCONT)
        server.kill()


@pytest.mark.exclusive  # stops the suite's PostgreSQL
@pytest.mark.timeout(180)
def test_runs_due_while_postgres_is_stopped_are_each_sent_once(
    beat_env: dict[str, str],
    postgres_url: str,
    broker_url: str,
    prefix: str,
    tmp_path: Path,
) -> None:
    if shutil.which("pg_ctlcluster") is None or os.environ.get("ANARCHON_TEST_POSTGRES"):
        pytest.skip("the PostgreSQL of the tests is not this machine's cluster: not ours to stop")

    def away() -> Iterator[None]:
        postgres_servers.system_cluster("stop", "-m", "immediate")  # as a crash: no goodbye to the clients
        try:
            yield
        finally:
            postgres_servers.system_cluster("start")

    try:
        _run_through_an_outage(tmp_path, _beat_envs(beat_env, postgres_url), away(), broker_url, prefix)
    finally:
        if not postgres_servers.system_cluster_answers():
            postgres_servers.system_cluster("start")
        delete_postgres_rows(postgres_url, prefix)


@pytest.mark.timeout(180)
def test_runs_due_while_sqlite_is_locked_are_each_sent_once(
    beat_env: dict[str, str],
    broker_url: str,
    prefix: str,
    tmp_path: Path,
) -> None:
    """Another process holds the database's write lock longer than a beat waits for it (5 s for
    the announcements it reads, then 5 s for the claims)."""
    path = tmp_path / "anarchon.db"
    held = threading.Event()
    release = threading.Event()

    def hold() -> None:
        db = sqlite3.connect(path, isolation_level=None)
        try:
            db.execute("BEGIN EXCLUSIVE")
            held.set()
            release.wait(60)
            db.execute("ROLLBACK")
        finally:
            db.close()

    def away() -> Iterator[None]:
        holder = threading.Thread(target=hold)
        holder.start()
        assert held.wait(30), "the write lock was not taken"
        time.sleep(10)  # with OUTAGE_S: longer than a beat's waits for the lock
        try:
            yield
        finally:
            release.set()
            holder.join()

    # The lock is held for 14 s in all: the leases must outlast it, or a run won just before it is
    # taken over when it ends (sent again with a new token, legitimately) as its holder marks it sent.
    envs = [dict(env, HISTORY_APP_LEASE_MS="20000") for env in _beat_envs(beat_env, f"sqlite:///{path}")]
    _run_through_an_outage(tmp_path, envs, away(), broker_url, prefix)


if os.name != "posix":  # pragma: no cover
    pytestmark.append(pytest.mark.skip(reason="signals and process groups as on Linux"))


@pytest.mark.timeout(180)
def test_an_outage_longer_than_the_lateness_names_the_runs_it_cost(
    beat_env: dict[str, str],
    broker_url: str,
    prefix: str,
    tmp_path: Path,
) -> None:
    """Redis away for longer than the runs' lateness (3 s): the runs whose deadline passed are not
    sent, and the line that says Redis is back names each of them, by job and slot. Meanwhile
    each beat reminds that the outage goes on (every 2 s here, every minute by default)."""
    if shutil.which("redis-server") is None:
        pytest.skip("no redis-server here")
    server = OwnRedisServer(tmp_path / "redis")
    envs = [
        dict(
            env,
            HISTORY_APP_MAX_LATE_MS="3000",
            HISTORY_APP_LEASE_MS="1000",
            HISTORY_APP_JITTER_MS="0",
            HISTORY_APP_OUTAGE_REMINDER_S="2",
        )
        for env in _beat_envs(beat_env, server.url)
    ]
    fleet = Fleet(tmp_path, envs)
    try:
        fleet.wait_ready()
        fleet.wait_any("won, sent", fleet.offsets())
        before = fleet.offsets()
        server.kill()
        time.sleep(9)
        server.start()
        fleet.wait_any("is back after", before, timeout=60)
        time.sleep(4)
        fleet.stop()
    finally:
        fleet.kill()
        server.kill()
    sent = set(_tokens(broker_url, prefix))
    missing = set(range(min(sent), max(sent), 1000)) - sent
    assert len(missing) >= 3, sorted(missing)  # about 9 s of a job every second, less its 3 s of lateness
    named: set[int] = set()
    for index in range(len(envs)):
        text = fleet.text(index)
        back = re.search(r"is back after [\d.]+s; (\d+) run\(s\) were not claimed meanwhile(.*)", text)
        assert back is not None
        named |= {int(slot) for slot in re.findall(r"\d{13}", back.group(2))}
        started = re.search(OUTAGE_STARTS, text)
        assert started is not None, text[-3000:]
        during = text[started.start() : back.start()]
        reminders = re.findall(r"still cannot [a-z' ]+ after \d+s .*; \d+ run\(s\) not claimed so far", during)
        assert len(reminders) >= 2, during
    assert missing <= named, (sorted(missing), sorted(named))


@pytest.mark.timeout(240)
def test_a_postgres_failover_to_a_synchronous_standby_loses_and_doubles_no_run(
    beat_env: dict[str, str],
    broker_url: str,
    prefix: str,
    tmp_path: Path,
) -> None:
    """A primary of the test's own with a synchronous standby (each commit waits for it); the
    beats name both hosts and ask for the one that takes writes. The primary crashes, the standby
    is promoted: the runs due meanwhile are claimed on it, each sent once."""
    if not postgres_servers.available():
        pytest.skip("PostgreSQL's server programs are not here")
    primary = postgres_servers.OwnPostgres()
    standby = None
    fleet = None
    try:
        standby = postgres_servers.OwnPostgres(standby_of=primary)
        primary.wait_streaming()
        primary.sql("ALTER SYSTEM SET synchronous_standby_names = '*'")  # (not copied to the standby)
        primary.sql("SELECT pg_reload_conf()")
        url = (
            f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/postgres"
            "?target_session_attrs=read-write"
        )
        fleet = Fleet(tmp_path, _beat_envs(beat_env, url))
        fleet.wait_ready()
        fleet.wait_any("won, sent", fleet.offsets())
        assert primary.sql("SELECT sync_state FROM pg_stat_replication") == [("sync",)]
        time.sleep(2)
        before = fleet.offsets()
        primary.crash()
        time.sleep(2)  # as long as a failover manager takes to decide
        standby.promote()
        fleet.wait_any("is back after", before, timeout=60)
        time.sleep(6)
        fleet.stop()
    finally:
        if fleet is not None:
            fleet.kill()
        for server in (standby, primary):
            if server is not None:
                server.remove()
    tokens = _tokens(broker_url, prefix)
    assert all(sent == [1] for sent in tokens.values()), {s: t for s, t in tokens.items() if t != [1]}
    assert_each_run_once(list(tokens))
    text = "".join(fleet.text(i) for i in range(3))
    assert "Traceback" not in text and "not run by this instance" not in text


@pytest.mark.timeout(180)
def test_a_store_that_hangs_costs_the_worker_one_bounded_wait_not_one_per_task(
    beat_env: dict[str, str], broker_url: str, prefix: str, tmp_path: Path
) -> None:
    """Redis stopped (SIGSTOP: it accepts connections and never answers) while run messages wait:
    a real worker asks it once (its own short timeout), runs the tasks without asking while it is
    away, and checks them again once it answers."""
    from celery import Celery

    from .test_backup_runners import _worker
    from .test_faults import kill

    if shutil.which("redis-server") is None:
        pytest.skip("no redis-server here")
    server = OwnRedisServer(tmp_path / "redis")
    sender = Celery("sender", broker=broker_url, set_as_current=False)
    count = 40

    def send(n: int) -> None:
        headers = {"anarchon_job": "every", "anarchon_slot": 1_000 + n, "anarchon_run": f"r{n}", "anarchon_token": 1}
        sender.send_task("history_app.fine", queue=f"{prefix}tasks", headers=headers)

    worker = None
    log = tmp_path / "worker.log"
    try:
        assert server.proc is not None
        server.proc.send_signal(signal.SIGSTOP)
        for n in range(count):
            send(n)
        worker = _worker(dict(beat_env, HISTORY_APP_BACKEND=server.url, HISTORY_APP_HISTORY_SIZE="0"), log)
        deadline = time.monotonic() + 60  # at 2 x 5 s a task, as before, 40 tasks took 400 s
        while log.read_text(errors="replace").count("succeeded in") < count:
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.2)
        text = log.read_text(errors="replace")
        asked = text.count("could not ask")
        assert asked == 1, text[-3000:]  # said once (asked again every 5 s: at debug level)
        assert "and so do this process's tasks without asking it until it answers" in text
        server.proc.send_signal(signal.SIGCONT)
        time.sleep(6)  # past ASK_AGAIN_S: the next task asks again
        send(count)
        deadline = time.monotonic() + 60
        while "answers again: tasks are checked against their runs again" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.2)
    finally:
        if server.proc is not None:
            server.proc.send_signal(signal.SIGCONT)
        if worker is not None:
            kill(worker)  # type: ignore[arg-type]
        server.kill()
        sender.close()
