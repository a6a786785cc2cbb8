"""Overlap protection with real beats and workers: a job every second whose task takes longer,
on each store; a worker killed while it runs; a backlog in the queue. Executions are counted from
the task's own start and end lines: none may overlap another."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from anarchon_celery.history import decode_event, fold

from .support.processes import start_celery, stop, wait_for_line
from .support.stores import delete_redis_keys
from .test_backup_runners import lease_store  # noqa: F401 - a store with leases, cleaned up
from .test_faults import ROOT, kill

APP = "tests.apps.overlap_app"


def _executions(log: Path, killed_at: dict[int, float] | None = None) -> list[tuple[float, float, int]]:
    """Each execution (start, end, slot), from the task's lines; one that never ended (its worker
    killed) ends when its process was killed (``killed_at``: pid to time), else now."""
    lines = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    starts = {(line["slot"], line["pid"]): line["t"] for line in lines if line["event"] == "start"}
    ends = {(line["slot"], line["pid"]): line["t"] for line in lines if line["event"] == "end"}
    killed_at = killed_at or {}
    return sorted((start, ends.get(key, killed_at.get(key[1], time.time())), key[0]) for key, start in starts.items())


def assert_no_overlap(executions: list[tuple[float, float, int]]) -> None:
    for (_, end, slot), (next_start, _, next_slot) in zip(executions, executions[1:]):
        assert next_start >= end, f"slot {next_slot} started at {next_start} while slot {slot} ran until {end}"


def _env(prefix: str, store: str, log: Path, **more: str) -> dict[str, str]:
    return dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        OVERLAP_APP_PREFIX=prefix,
        OVERLAP_APP_BACKEND=store,
        OVERLAP_APP_LOG=str(log),
        **more,
    )


def _use(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """This test's app settings in this process too (its history is read here)."""
    for key, value in env.items():
        if key.startswith("OVERLAP_APP_"):
            monkeypatch.setenv(key, value)


class Deployment:
    """Two beats and some workers of the overlap app, each with its own log."""

    def __init__(self, tmp_path: Path, env: dict[str, str]) -> None:
        self.tmp_path, self.env = tmp_path, env
        #: Node names of their own: two workers of one name share a remote-control queue.
        self.unique = env["OVERLAP_APP_PREFIX"].strip(".")
        self.procs: dict[str, Any] = {}

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Any:
        """Start a process of the app, with ``env`` added to the deployment's environment."""
        log = self.tmp_path / f"{name}.log"
        self.procs[name] = start_celery(args, log, {**self.env, **(env or {})}, app=APP, cwd=ROOT)
        return self.procs[name]

    def worker(self, name: str, concurrency: int = 2, pool: str = "prefork", env: dict[str, str] | None = None) -> Any:
        proc = self.start(
            name,
            [
                "worker",
                "-l",
                "info",
                "-c",
                str(concurrency),
                "-P",
                pool,
                "-n",
                f"{name}-{self.unique}@%h",
                "--without-heartbeat",
            ],
            env,
        )
        wait_for_line(self.tmp_path / f"{name}.log", "ready", proc, 60)
        return proc

    def beats(self, count: int = 2, envs: list[dict[str, str]] | None = None) -> None:
        for n in range(count):
            args = ["beat", "-S", "anarchon_celery.Scheduler", "-l", "info", "--pidfile="]
            self.start(f"beat-{n}", args, envs[n] if envs else None)
        for n in range(count):
            wait_for_line(self.tmp_path / f"beat-{n}.log", "anarchon: ready as", self.procs[f"beat-{n}"], 60)

    def text(self, name: str) -> str:
        return (self.tmp_path / f"{name}.log").read_text(errors="replace")

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                stop(proc, timeout=15)
        for proc in self.procs.values():
            kill(proc)


def _history() -> list[Any]:
    import importlib

    from anarchon_celery.control import configure
    from tests.apps import overlap_app

    overlap_app = importlib.reload(overlap_app)  # read again with this test's environment
    deployment = configure(overlap_app.app)
    try:
        events = deployment.backend.read_history(["slow"])["slow"]
    finally:
        deployment.release()
    return fold([decode_event(json.dumps(e)) for e in events])


@pytest.mark.processes
@pytest.mark.timeout(240)
def test_a_job_slower_than_its_schedule_never_runs_beside_itself(
    lease_store: str,  # noqa: F811
    prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run every second that takes 2.5 s, two beats, two workers of two processes each: under
    ``skip`` no two executions overlap, and the runs due meanwhile are recorded skipped."""
    log = tmp_path / "runs.jsonl"
    env = _env(prefix, lease_store, log)
    _use(env, monkeypatch)
    deployment = Deployment(tmp_path, env)
    try:
        deployment.worker("w1")
        deployment.worker("w2")
        deployment.beats()
        time.sleep(12)
        deployment.close()
    finally:
        deployment.close()
    executions = _executions(log)
    assert len(executions) >= 3, executions
    assert_no_overlap(executions)
    runs = _history()
    skipped = [run for run in runs if run.status == "skipped"]
    assert skipped and all(run.reason == "overlap" for run in skipped), runs
    for name in ("beat-0", "beat-1", "w1", "w2"):
        assert "Traceback" not in deployment.text(name), deployment.text(name)[-3000:]


def _wait_for_start(log: Path, after: int, timeout: float = 30) -> dict[str, Any]:
    """The first execution started after ``after`` lines, once its start line is written."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = log.read_text().splitlines() if log.exists() else []
        starts = [json.loads(line) for line in lines[after:] if '"start"' in line]
        if starts:
            return starts[0]
        time.sleep(0.1)
    raise AssertionError(f"no run started within {timeout}s")


def _killed_worker_case(
    store: str,
    prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    acks_late: bool,
    lease_ms: str = "3000",
    every: str = "1",
) -> None:
    log = tmp_path / "runs.jsonl"
    env = _env(
        prefix,
        store,
        log,
        OVERLAP_APP_SLEEP="4",
        OVERLAP_APP_ACKS_LATE="1" if acks_late else "0",
        OVERLAP_APP_LEASE_MS=lease_ms,
        OVERLAP_APP_EVERY=every,
    )
    _use(env, monkeypatch)
    deployment = Deployment(tmp_path, env)
    killed_at: dict[int, float] = {}
    try:
        w1 = deployment.worker("w1", concurrency=1)
        deployment.beats()
        victim = _wait_for_start(log, 0, timeout=60)
        os.killpg(w1.pid, signal.SIGKILL)  # the whole worker: nothing left to tell its runs' end
        killed_at[victim["pid"]] = time.time()
        w1.wait()
        deployment.worker("w2", concurrency=2)
        time.sleep(14)
        deployment.close()
    finally:
        deployment.close()
    executions = _executions(log, killed_at)
    assert_no_overlap(executions)
    later = [slot for start, _, slot in executions if start > killed_at[victim["pid"]]]
    assert later, executions  # the job went on
    runs = {run.slot: run for run in _history()}
    if acks_late:  # delivered again: the same run, on w2, once w1's hold ran out
        assert victim["slot"] in later, executions
        assert runs[victim["slot"]].status == "succeeded", runs[victim["slot"]]
    else:
        assert victim["slot"] not in later, executions
        abandoned = runs[victim["slot"]]
        assert (abandoned.status, abandoned.error_type) == ("abandoned", "LeaseExpired"), abandoned
        assert abandoned.worker and abandoned.worker.startswith("w1-"), abandoned


@pytest.mark.processes
@pytest.mark.timeout(240)
def test_a_worker_killed_while_it_runs_frees_the_job_once_its_hold_runs_out(
    lease_store: str,  # noqa: F811
    prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker running a run is killed whole (SIGKILL): the run is recorded abandoned, with the
    worker's name, once its hold runs out (3 s), and the job runs again on another worker."""
    _killed_worker_case(lease_store, prefix, tmp_path, monkeypatch, acks_late=False)


@pytest.mark.processes
@pytest.mark.timeout(240)
def test_on_sqlite_a_killed_workers_job_is_free_at_once(
    prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite frees a dead worker's hold the moment its process is gone (a file lock): with a lease
    of two minutes, the job runs again within the test's 14 s all the same."""
    _killed_worker_case(
        f"sqlite:///{tmp_path / 'anarchon.db'}", prefix, tmp_path, monkeypatch, acks_late=False, lease_ms="120000"
    )


@pytest.mark.processes
@pytest.mark.timeout(240)
def test_a_run_delivered_again_with_acks_late_waits_for_the_dead_workers_hold(
    redis_url: str, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``acks_late`` the killed worker's message is delivered again to another worker, whose
    start check waits for the dead worker's hold to run out, then runs it: never beside it. (On
    Redis, where a dead worker's hold lasts its lease: on SQLite the next claim of the job frees it
    at once, and the run delivered again then finds the job's next run holding it, and is skipped.)"""
    try:
        # A run every 30 s: the next one does not race the run delivered again for the job.
        _killed_worker_case(redis_url, prefix, tmp_path, monkeypatch, acks_late=True, every="30")
    finally:
        delete_redis_keys(redis_url, prefix)


@pytest.mark.processes
@pytest.mark.timeout(240)
def test_a_backlog_in_the_queue_does_not_run_back_to_back(
    prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No worker for 6 s while a run is due every second: the first run sent holds the job while it
    waits in the queue, so the others are skipped, not queued behind it; once a worker comes,
    the runs go one at a time."""
    log = tmp_path / "runs.jsonl"
    env = _env(prefix, f"sqlite:///{tmp_path / 'anarchon.db'}", log, OVERLAP_APP_SLEEP="1.5")
    _use(env, monkeypatch)
    deployment = Deployment(tmp_path, env)
    try:
        deployment.beats()
        time.sleep(6)
        deployment.worker("w1", concurrency=4)
        time.sleep(8)
        deployment.close()
    finally:
        deployment.close()
    executions = _executions(log)
    assert_no_overlap(executions)
    runs = _history()
    skipped = [run for run in runs if run.status == "skipped" and run.reason == "overlap"]
    assert len(skipped) >= 4, runs  # the runs due while the first waited in the queue
    first = min(start for start, _, _ in executions)
    assert len([start for start, _, _ in executions if start < first + 3]) <= 2, executions  # not a burst


def _gil_terms(seconds: float) -> int:
    """How many terms one ``sum(range(n))`` needs to hold the GIL about ``seconds`` on this
    machine now (a fixed count took 0.7 s on one run and 4 s on another)."""
    started = time.perf_counter()
    sum(range(10**7))
    took = max(time.perf_counter() - started, 1e-3)
    return min(int(10**7 * seconds / took), 10**10)


@pytest.mark.processes
@pytest.mark.timeout(240)
@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_a_task_holding_the_gil_past_the_lease_is_told_not_silent(
    pool: str, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task that holds the GIL in one C call for seconds, with a lease of 1 s: under the solo pool
    the heartbeat stalls with it, and its next renewal logs that the hold ran out; under prefork
    the heartbeat runs in the worker's main process and never misses a renewal."""
    log = tmp_path / "runs.jsonl"
    env = _env(
        prefix,
        f"sqlite:///{tmp_path / 'anarchon.db'}",
        log,
        OVERLAP_APP_GIL=str(_gil_terms(3.0)),  # one sum() of about 3 s: three times the lease
        OVERLAP_APP_LEASE_MS="1000",
        OVERLAP_APP_EVERY="2",
    )
    _use(env, monkeypatch)
    deployment = Deployment(tmp_path, env)
    try:
        deployment.worker("w1", concurrency=1, pool=pool)
        deployment.beats(1)
        _wait_for_start(log, 0)
        time.sleep(10)
        deployment.close()
    finally:
        deployment.close()
    ended = [line for line in log.read_text().splitlines() if '"end"' in line]
    assert ended, log.read_text()
    text = deployment.text("w1")
    told = "its hold on the job had run out when renewed" in text or "its hold on the job was gone when renewed" in text
    assert told == (pool == "solo"), text[-3000:]
