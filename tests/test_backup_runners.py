"""Backup runners, with real `celery beat` processes on each store that holds leases (the tasks
go to the suite's RabbitMQ), and a real prefork worker: a winner that dies (or stalls) at an
exact point loses no run, and no run is executed twice."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection

from anarchon_celery import task_id_for

from .support.processes import start_celery
from .support.stores import delete_postgres_rows, delete_redis_keys
from .test_cli import celery
from .test_faults import (
    APP,
    ROOT,
    Fleet,
    assert_each_run_once,
    kill,
    wait_for,
)

pytestmark = [pytest.mark.broker, pytest.mark.processes, pytest.mark.stores]

#: The winner's lease in these tests, and the runs' lateness allowed: a short lease, so that the
#: backups act soon, but not so short that a healthy winner on a loaded machine (its confirm and
#: its mark) is taken over; the lateness leaves room for two backups after it.
LEASE_MS = 3_000
MAX_LATE_MS = 10_000


@pytest.fixture(params=["sqlite", "redis", "postgres"])
def lease_store(request: pytest.FixtureRequest, prefix: str, tmp_path: Path) -> Iterator[str]:
    """The URL of a store with leases; what the beats leave in it under ``prefix`` is deleted."""
    kind = request.param
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'anarchon.db'}"
        return
    url = request.getfixturevalue(f"{kind}_url")
    yield url
    if kind == "redis":
        delete_redis_keys(url, prefix)
    else:
        delete_postgres_rows(url, prefix)


def _fleet_envs(base: dict[str, str], store: str, fault: str, tmp_path: Path) -> list[dict[str, str]]:
    """The faulty beat first; the two others claim up to 300 ms after the slot, so it wins most
    races. It faults only once :func:`_start_fleet` says the fleet is ready."""
    env = dict(
        base,
        HISTORY_APP_BACKEND=store,
        HISTORY_APP_EVERY="1",
        HISTORY_APP_LEASE_MS=str(LEASE_MS),
        HISTORY_APP_MAX_LATE_MS=str(MAX_LATE_MS),
        HISTORY_APP_HISTORY_SIZE="500",
    )
    faulty = dict(
        env,
        TEST_BEAT_SCHEDULER="tests.apps.faulty_scheduler.FaultyScheduler",
        TEST_FAULT=fault,
        TEST_FAULT_FROM=str(tmp_path / "fault-from"),
    )
    others = dict(env, HISTORY_APP_JITTER_MS="300")
    return [faulty, others, others]


def _start_fleet(tmp_path: Path, envs: list[dict[str, str]]) -> Fleet:
    """Start the beats; once all are ready, let the faulty one fault from a second later on. A
    run won before the others had started has no backups (they claim from their start on):
    faulted, nobody would take it over."""
    fleet = Fleet(tmp_path, envs)
    try:
        fleet.wait_ready()
    except BaseException:
        fleet.kill()
        raise
    written = Path(envs[0]["TEST_FAULT_FROM"])
    partial = written.with_suffix(".partial")
    # A second ahead: a run is faulted at both of its steps (written, then sent) or at neither.
    partial.write_text(str(int(time.time() * 1000) + 1000))
    partial.rename(written)  # read whole, or not at all
    return fleet


def _faulted_slot(log: Path) -> int:
    match = re.search(r"fault: \S+ \[\('every', (\d+)\)\]", log.read_text(errors="replace"))
    assert match, log.read_text(errors="replace")[-3000:]
    return int(match.group(1))


def _wait_in_any(logs: list[Path], needle: str, what: str, timeout: float = 30) -> None:
    """Wait until one of the logs holds ``needle``; fail saying ``what`` did not happen."""
    deadline = time.monotonic() + timeout
    while not any(needle in log.read_text() for log in logs):
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def _tokens(broker_url: str, prefix: str) -> dict[int, list[int]]:
    """The tokens of the messages of job ``every`` in the task queue (drained), by slot."""
    tokens: dict[int, list[int]] = {}
    with Connection(broker_url) as conn:
        while (message := conn.default_channel.basic_get(f"{prefix}tasks", no_ack=True)) is not None:
            if message.headers["anarchon_job"] == "every":
                tokens.setdefault(message.headers["anarchon_slot"], []).append(message.headers["anarchon_token"])
    return tokens


def _stop(procs: list[subprocess.Popen[bytes]], logs: list[Path]) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc, log in zip(procs, logs):
        assert proc.wait(30) == 0, log.read_text(errors="replace")[-3000:]


@pytest.mark.timeout(180)
def test_a_winner_killed_after_its_claim_loses_no_run(
    beat_env: dict[str, str],
    lease_store: str,
    broker_url: str,
    prefix: str,
    tmp_path: Path,
) -> None:
    """Killed right after winning, before its task is written: a backup sends that run once its
    lease has run out, and every run is sent exactly once."""
    envs = _fleet_envs(beat_env, lease_store, "die-after-claim", tmp_path)
    fleet = _start_fleet(tmp_path, envs)
    procs, logs = fleet.procs, fleet.logs
    try:
        procs[0].wait(60)  # it won a run, and died
        slot = _faulted_slot(logs[0])
        _wait_in_any(logs[1:], f"slot {slot}: not sent by its winner", "no backup took the run over")
        time.sleep(3)
        _stop(procs[1:], logs[1:])
    finally:
        for proc in procs:
            kill(proc)
    tokens = _tokens(broker_url, prefix)
    assert tokens[slot] == [2]  # sent by the backup alone, with the next token
    assert_each_run_once([s for s, sent in tokens.items() for _ in sent])
    assert "taken over (token 2)" in "".join(log.read_text() for log in logs[1:])


@pytest.mark.timeout(180)
def test_a_lease_handed_back_is_taken_over_before_it_would_have_ended(
    beat_env: dict[str, str],
    lease_store: str,
    broker_url: str,
    prefix: str,
    tmp_path: Path,
) -> None:
    """The winner cannot send a run's task (the broker refuses it): it hands the lease back, and a
    backup takes the run over at once. The lease (15 s) would otherwise outlast most of the
    run's lateness allowed (20 s): the hand-back is what saves it."""
    envs = [
        dict(env, HISTORY_APP_LEASE_MS="15000", HISTORY_APP_MAX_LATE_MS="20000")
        for env in _fleet_envs(beat_env, lease_store, "fail-send", tmp_path)
    ]
    fleet = _start_fleet(tmp_path, envs)
    procs, logs = fleet.procs, fleet.logs
    try:
        wait_for(logs[0], "fault: ", procs[0])
        slot = _faulted_slot(logs[0])
        wait_for(logs[0], "1 run(s) whose send failed handed back to their backups", procs[0])
        _wait_in_any(
            logs, f"slot {slot}: its lease was handed back; taking it over", "no backup heard of the hand-back"
        )
        time.sleep(2)
        _stop(procs, logs)
    finally:
        for proc in procs:
            kill(proc)
    tokens = _tokens(broker_url, prefix)
    assert tokens[slot] == [2]
    assert_each_run_once([s for s, sent in tokens.items() for _ in sent])


def _worker(env: dict[str, str], log: Path) -> object:
    # A node name of its own: workers of one name share a remote-control queue, which RabbitMQ
    # gives to one of them only (the suite runs tests side by side).
    name = f"w-{uuid.uuid4().hex[:8]}@%h"
    args = ["worker", "--pool=prefork", "-c", "1", "-l", "info", "-n", name, "--without-mingle", "--without-gossip"]
    return start_celery(args, log, env, app=APP, cwd=ROOT)


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "lease_store, fault",
    # The worker's check is the same step on each store (tests/test_backends.py runs it on each):
    # each fault is played on some of them, to keep the suite short.
    [("sqlite", "die-after-send"), ("redis", "pause-after-send"), ("postgres", "pause-after-send")],
    indirect=["lease_store"],
)
def test_a_run_sent_by_its_winner_and_by_a_backup_is_executed_once(
    fault: str,
    beat_env: dict[str, str],
    lease_store: str,
    broker_url: str,
    prefix: str,
    tmp_path: Path,
) -> None:
    """The winner's task is sent, then the winner dies (or stalls past its lease) before marking
    it sent: a backup takes the run over and sends it again with the next token. Both messages
    wait in the queue; the worker runs the backup's and refuses the first winner's."""
    envs = _fleet_envs(beat_env, lease_store, fault, tmp_path)
    fleet = _start_fleet(tmp_path, envs)
    procs, logs = fleet.procs, fleet.logs
    worker = None
    try:
        wait_for(logs[0], "fault: ", procs[0]) if fault.startswith("pause") else procs[0].wait(60)
        slot = _faulted_slot(logs[0])
        _wait_in_any(logs[1:], f"slot {slot}: not sent by its winner", "no backup took the run over")
        if fault.startswith("pause"):
            os.kill(procs[0].pid, signal.SIGCONT)  # it marks the run sent, too late: another holds it
            wait_for(logs[0], "sent after this instance's lease on them ran out", procs[0])
            assert f"job 'every' slot {slot} (our token 1)" in logs[0].read_text(errors="replace")
        time.sleep(2)
        running = procs[1:] if fault.startswith("die") else procs
        _stop(running, logs[-len(running) :])
        worker_log = tmp_path / "worker.log"
        worker = _worker(envs[1], worker_log)
        twice_sent = task_id_for(prefix, "every", slot)
        # Both of its messages done (the worker prefetches: an empty queue is not enough), then
        # the rest: the queue empty and the last task's end logged.
        done = [f"[{twice_sent}] succeeded", f"[{twice_sent}] ignored"]
        deadline = time.monotonic() + 90
        while _waiting(broker_url, prefix) or not all(line in worker_log.read_text() for line in done):
            assert time.monotonic() < deadline, worker_log.read_text()[-3000:]
            time.sleep(0.5)
        time.sleep(2)
        if fault.startswith("pause"):
            _assert_history_names_the_starter(envs[1], twice_sent, procs)
    finally:
        for proc in procs:
            kill(proc)
        if worker is not None:
            kill(worker)  # type: ignore[arg-type]
    text = worker_log.read_text()
    executed = Counter(re.findall(r"Task history_app\.fine\[([^\]]+)\] succeeded", text))
    ignored = re.findall(r"Task history_app\.fine\[([^\]]+)\] ignored", text)
    assert ignored == [twice_sent], ignored  # the first winner's message
    assert executed[twice_sent] == 1 and max(executed.values()) == 1, executed  # the backup's, once
    assert len(executed) >= 4, executed
    assert f"job 'every' slot {slot}: task {twice_sent} (token 1) not run" in text
    assert "Traceback" not in text


def _assert_history_names_the_starter(env: dict[str, str], task_id: str, beats: list[Any]) -> None:
    """The history of a run sent by its stalled winner and by a backup names the backup, whose
    message started it, with its own send time; every run was sent before it started."""
    deadline = time.monotonic() + 60
    while True:
        done = celery(env, "anarchon", "history", "every", "-n", "500", "--json")
        assert done.returncode == 0, done.stderr
        runs = json.loads(done.stdout)
        run = next((r for r in runs if r["task_id"] == task_id), None)
        if run is not None and run["status"] == "succeeded":
            break
        assert time.monotonic() < deadline, done.stdout[-3000:]
        time.sleep(1)
    starter = int(run["instance"].rsplit(":", 1)[1])
    assert starter in {beat.pid for beat in beats[1:]}, (run, [beat.pid for beat in beats])
    for other in runs:
        if other["started_at_ms"] is not None and other["sent_at_ms"] is not None:
            assert other["sent_at_ms"] <= other["started_at_ms"], other


def _waiting(broker_url: str, prefix: str) -> int:
    """Messages in the task queue not yet taken by a worker."""
    with Connection(broker_url) as conn:
        return int(conn.default_channel.queue_declare(f"{prefix}tasks", passive=True).message_count)


if sys.platform != "linux":  # pragma: no cover
    pytestmark.append(pytest.mark.skip(reason="signals and process groups as on Linux"))
