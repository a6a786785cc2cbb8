"""The worker's metrics: counted in the task's own process (a prefork child), served by the
worker's main process from prometheus-client's multiprocess files; checked against what the
beats sent and what the tasks themselves logged."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from anarchon_celery import Claim, Outcome, SQLiteBackend
from anarchon_celery.worker import history as signals
from anarchon_celery.worker import metrics as worker_side

from .support.processes import start_celery, wait_for_line
from .support.proxy import free_port
from .test_backup_runners import lease_store  # noqa: F401 - a store with leases, cleaned up
from .test_cli import celery
from .test_faults import ROOT, kill
from .test_health import _scrape, _total
from .test_overlap_processes import APP, Deployment, _env, _executions, _use

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


# -- without a service ----------------------------------------------------------------------------


def _value(metric: str, **labels: str) -> float:
    return worker_side.worker_metrics().registry.get_sample_value(metric, labels) or 0.0


def test_a_start_refused_is_counted_with_its_reason(tmp_path: Path) -> None:
    """The first message of a run starts it; a second message of the run (its token used) is
    refused, counted as fencing; its end counts under its status, with the job's last success."""
    job = f"j{uuid.uuid4().hex[:8]}"
    app = Celery("wm", broker="memory://", set_as_current=False)
    app.conf.update(
        anarchon_backend=f"sqlite:///{tmp_path / 'runs.db'}", anarchon_prefix="wm.", anarchon_history_size=0
    )

    @app.task(name="wm.work", shared=False)
    def work() -> str:
        return "done"

    store = SQLiteBackend(tmp_path / "runs.db", prefix="wm.")
    assert store.claim([Claim(job, 1000)], "a") == [Outcome.WON]
    headers = {"anarchon_job": job, "anarchon_slot": 1000, "anarchon_run": "r", "anarchon_token": 1}
    task = app.tasks["wm.work"]
    for _ in range(2):
        task.push_request({"id": str(uuid.uuid4()), "delivery_info": {}, "retries": 0, **headers})
        try:
            signals._on_prerun(task=task)
        finally:
            task.pop_request()
    assert _value("anarchon_worker_runs_started_total", anarchon_job=job) == 1
    assert _value("anarchon_worker_starts_refused_total", anarchon_job=job, reason="fencing") == 1
    before = time.time()
    task.push_request({"id": str(uuid.uuid4()), **headers})
    try:
        signals._on_postrun(task=task, state="SUCCESS")
    finally:
        task.pop_request()
    assert _value("anarchon_worker_runs_finished_total", anarchon_job=job, status="succeeded") == 1
    assert _value("anarchon_worker_last_success_timestamp_seconds", anarchon_job=job) >= before
    store.close()


def test_every_processs_files_but_its_own_are_removed_at_start(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    files = {
        "mine": tmp_path / f"counter_{os.getpid()}.db",
        "gone": tmp_path / f"counter_{gone.pid}.db",
        "gone gauge": tmp_path / f"gauge_livesum_{gone.pid}.db",
        "alive": tmp_path / f"counter_{os.getppid()}.db",  # (a process id an earlier run had, reused)
        "not ours": tmp_path / "notes.txt",
    }
    for path in files.values():
        path.write_bytes(b"")
    assert worker_side.clear_earlier_runs(str(tmp_path)) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([files["mine"].name, files["not ours"].name])


def test_the_registry_to_mount_is_this_processs_or_every_processs_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(worker_side.MULTIPROC_ENV, raising=False)
    assert worker_side.registry() is worker_side.worker_metrics().registry
    monkeypatch.setenv(worker_side.MULTIPROC_ENV, str(tmp_path))
    mounted = worker_side.registry()
    assert mounted is not worker_side.worker_metrics().registry
    assert [family.name for family in mounted.collect()] == ["anarchon_worker_started_timestamp_seconds"]


# -- real beats and workers -----------------------------------------------------------------------


def _pause(env: dict[str, str], job: str) -> None:
    done = celery(env, "anarchon", "pause", job, app=APP)
    assert done.returncode == 0, done


def _sum(scraped: list[Samples], name: str, **labels: str) -> float:
    return sum(_total(samples, name, **labels) for samples in scraped)


@pytest.mark.processes
@pytest.mark.timeout(240)
def test_the_workers_metrics_add_up_to_what_the_beats_sent_and_the_tasks_ran(
    lease_store: str,  # noqa: F811
    prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two beats, two prefork workers of two processes each, a job every second whose task takes
    2.5 s under ``skip``. Once the job is paused and the queue is drained: the runs the beats
    sent are the starts and refusals the workers counted; the starts are the executions the task
    logged, all succeeded; each worker's last success is its last execution's end."""
    log = tmp_path / "runs.jsonl"
    env = _env(prefix, lease_store, log)
    _use(env, monkeypatch)
    beat_ports = [free_port() for _ in range(2)]
    worker_ports = {name: free_port() for name in ("w1", "w2")}
    deployment = Deployment(tmp_path, env)
    try:
        for name, port in worker_ports.items():
            folder = tmp_path / f"{name}-metrics"
            folder.mkdir()
            more = {"OVERLAP_APP_WORKER_METRICS_PORT": str(port), worker_side.MULTIPROC_ENV: str(folder)}
            deployment.worker(name, env=more)
            assert f"worker metrics served on http://0.0.0.0:{port}/metrics" in deployment.text(name)
        deployment.beats(envs=[{"OVERLAP_APP_METRICS_PORT": str(port)} for port in beat_ports])
        time.sleep(10)
        _pause(env, "slow")
        deadline = time.monotonic() + 90
        while True:
            beats = [_scrape(port) for port in beat_ports]
            workers = [_scrape(port) for port in worker_ports.values()]
            sent = _sum(beats, "anarchon_runs_sent_total", anarchon_job="slow")
            started = _sum(workers, "anarchon_worker_runs_started_total", anarchon_job="slow")
            refused = _sum(workers, "anarchon_worker_starts_refused_total", anarchon_job="slow")
            succeeded = _sum(workers, "anarchon_worker_runs_finished_total", anarchon_job="slow", status="succeeded")
            buffered = _sum(workers, "anarchon_worker_history_buffer_events")
            if sent == started + refused and succeeded == started and not buffered:
                break
            assert time.monotonic() < deadline, (sent, started, refused, succeeded, buffered)
            time.sleep(0.5)
        executions = _executions(log)
        assert started == len(executions) >= 3, (started, executions)
        # Runs due while the job was busy: most not sent (the beats' skips), any sent refused.
        assert refused == _sum(workers, "anarchon_worker_starts_refused_total", anarchon_job="slow", reason="overlap")
        assert _sum(beats, "anarchon_runs_skipped_total", anarchon_job="slow", reason="overlap") > 0
        assert _sum(workers, "anarchon_worker_runs_finished_total", anarchon_job="slow", status="failed") == 0
        ends = [json.loads(line) for line in log.read_text().splitlines() if '"end"' in line]
        last_end = max(end["t"] for end in ends)
        last_success = max(
            _total(samples, "anarchon_worker_last_success_timestamp_seconds", anarchon_job="slow")
            for samples in workers
        )
        assert last_end <= last_success < time.time()
        # Only the worker's own metrics are served there, summed over its processes.
        for samples in workers:
            assert not [name for name, _ in samples if not name.startswith("anarchon_worker_")]
        deployment.close()
        for name in ("beat-0", "beat-1", "w1", "w2"):
            assert "Traceback" not in deployment.text(name), deployment.text(name)[-3000:]
    finally:
        deployment.close()


@pytest.mark.processes
@pytest.mark.broker
@pytest.mark.timeout(120)
def test_a_prefork_worker_without_the_directory_says_how_and_a_solo_one_serves_its_own(
    prefix: str, tmp_path: Path
) -> None:
    env = _env(prefix, f"sqlite:///{tmp_path / 'runs.db'}", tmp_path / "runs.jsonl")
    env.pop(worker_side.MULTIPROC_ENV, None)
    env["OVERLAP_APP_WORKER_METRICS_PORT"] = str(port := free_port())
    procs: list[Any] = []

    def start(pool: str) -> Path:
        log = tmp_path / f"{pool}.log"
        name = f"{pool}-{uuid.uuid4().hex[:6]}@%h"
        args = ["worker", "-l", "info", "-c", "1", "-P", pool, "-n", name, "--without-heartbeat"]
        procs.append(start_celery(args, log, env, app=APP, cwd=ROOT))
        wait_for_line(log, "ready", procs[-1], 60)
        return log

    try:
        text = start("prefork").read_text(errors="replace")
        assert "worker metrics not served: under the prefork pool" in text
        assert f"Set {worker_side.MULTIPROC_ENV} to an empty directory of this worker's own" in text
        text = start("solo").read_text(errors="replace")
        assert f"worker metrics served on http://0.0.0.0:{port}/metrics, from this process" in text
        assert _total(_scrape(port), "anarchon_worker_history_buffer_events") == 0
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
    finally:
        for proc in procs:
            kill(proc)
