"""`celery -A app anarchon ...` through click's test runner and as real processes, and the history
a real worker writes (statuses, run-now, a worker killed mid-task)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery.bin.celery import celery as celery_cli
from click.testing import CliRunner

from anarchon_celery.history import encode_event

ROOT = Path(__file__).resolve().parent.parent
APP = "tests.history_app"

pytestmark = pytest.mark.broker


@pytest.fixture
def app_env(prefix: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """history_app configured with this test's prefix, imported afresh."""
    monkeypatch.setenv("HISTORY_APP_PREFIX", prefix)
    monkeypatch.delenv("HISTORY_APP_BAD", raising=False)
    sys.modules.pop(APP, None)
    yield dict(os.environ, PYTHONPATH=str(ROOT))
    sys.modules.pop(APP, None)


def invoke(*args: str) -> Any:
    result = CliRunner().invoke(celery_cli, ["-A", APP, "anarchon", *args], catch_exceptions=False)
    return result


def celery(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", APP, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_next_shows_local_and_utc_times(app_env: dict[str, str]) -> None:
    result = invoke("next", "fine", "-n", "3", "--json")
    assert result.exit_code == 0, result.output
    runs = json.loads(result.output)
    assert len(runs) == 3
    for run in runs:  # 03:00 in Tokyo is 18:00 UTC the day before
        assert run["local"].endswith("T03:00:00+09:00") and run["utc"].endswith("T18:00:00+00:00")
    table = invoke("next", "fine", "-n", "2").output.splitlines()
    assert table[0].split() == ["#", "LOCAL", "(Asia/Tokyo)", "UTC"] and len(table) == 3


def test_jobs_lists_every_job(app_env: dict[str, str]) -> None:
    result = invoke("jobs", "--json")
    assert result.exit_code == 0, result.output
    jobs = {job["job"]: job for job in json.loads(result.output)}
    assert sorted(jobs) == ["boom", "fine", "sleepy"]
    assert jobs["fine"]["tz"] == "Asia/Tokyo" and jobs["fine"]["last_run"] is None
    assert jobs["boom"]["schedule"] == "every 3600s"


def test_check_passes_on_a_good_config(app_env: dict[str, str]) -> None:
    result = invoke("check", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["ok"] and [c["check"] for c in report["checks"]] == ["config", "broker", "streams"]
    assert "RabbitMQ 3." in report["checks"][1]["detail"] and "guest:**@" in report["checks"][1]["detail"]


def test_check_fails_with_one_clear_line_and_no_traceback(app_env: dict[str, str]) -> None:
    env = dict(app_env, HISTORY_APP_BAD="1")
    done = celery(env, "anarchon", "check")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "FAIL  config   job 'bad': invalid cron spec '61 * * * *': see `man 5 crontab` for the syntax"
    ]
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["history", "nope"], "Error: no job named 'nope'. Jobs: boom, fine, sleepy"),
        (["run-now", "fien"], "Error: no job named 'fien'. Did you mean 'fine'?"),
        (["next", "nope"], "Error: no job named 'nope'"),
    ],
)
def test_errors_are_one_line_and_exit_1(app_env: dict[str, str], args: list[str], message: str) -> None:
    done = celery(app_env, "anarchon", *args)
    assert done.returncode == 1
    assert done.stderr.strip().startswith(message) and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_an_unreachable_broker_is_one_line(app_env: dict[str, str]) -> None:
    env = dict(app_env, HISTORY_APP_BROKER="amqp://guest:s3cr3t@127.0.0.1:1//")
    done = celery(env, "anarchon", "history", "fine")
    assert done.returncode == 1
    assert "cannot reach RabbitMQ at amqp://guest:**@127.0.0.1:1//" in done.stderr
    assert "s3cr3t" not in done.stderr + done.stdout and "Traceback" not in done.stderr


def _history(env: dict[str, str], job: str) -> list[dict[str, Any]]:
    done = celery(env, "anarchon", "history", job, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _wait_for_status(env: dict[str, str], job: str, run_id: str, status: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        runs = {run["run_id"]: run for run in _history(env, job)}
        if runs.get(run_id, {}).get("status") == status:
            return runs[run_id]
        assert time.monotonic() < deadline, f"{job} run {run_id} never reached {status}: {runs.get(run_id)}"
        time.sleep(0.5)


@pytest.mark.processes
@pytest.mark.timeout(240)
def test_run_now_and_the_worker_history(app_env: dict[str, str], prefix: str, tmp_path: Path) -> None:
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            APP,
            "worker",
            "--pool=solo",
            "-l",
            "info",
            "-n",
            f"{prefix}w@%h",
            "--without-mingle",
            "--without-gossip",
            "--without-heartbeat",
        ],
        cwd=ROOT,
        env=app_env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:

        def run_now(job: str) -> str:
            done = celery(app_env, "anarchon", "run-now", job, "--json")
            assert done.returncode == 0, done.stderr
            sent = json.loads(done.stdout)
            assert sent["job"] == job and sent["run_id"] == sent["task_id"]
            return sent["run_id"]

        fine = _wait_for_status(app_env, "fine", run_now("fine"), "succeeded")
        assert fine["trigger"] == "manual" and fine["worker"].startswith(f"{prefix}w@")
        assert fine["sent_at_ms"] <= fine["started_at_ms"] <= fine["finished_at_ms"]

        boom = _wait_for_status(app_env, "boom", run_now("boom"), "failed")
        assert boom["error_type"] == "ValueError" and boom["error"].startswith("boom xxx") and len(boom["error"]) == 500

        # A run whose worker dies stays "running": nothing can tell it stopped.
        sleepy = run_now("sleepy")
        _wait_for_status(app_env, "sleepy", sleepy, "running")
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        assert _wait_for_status(app_env, "sleepy", sleepy, "running")["finished_at_ms"] is None

        # Two manual runs of one job are two runs; the table shows them newest first.
        second = run_now("fine")
        runs = _history(app_env, "fine")
        assert [run["run_id"] for run in runs[:2]] == [second, fine["run_id"]]
        assert runs[0]["status"] == "sent"  # no worker any more
        table = celery(app_env, "anarchon", "history", "fine").stdout.splitlines()
        assert table[0].split()[:3] == ["RUN", "TRIGGER", "STATUS"] and second in table[1]
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        log.close()


def test_history_never_returns_more_than_history_size(app_env: dict[str, str], prefix: str) -> None:
    import importlib

    import anarchon_celery

    history_app = importlib.import_module(APP)
    backend = anarchon_celery.RabbitMQBackend("amqp://guest:guest@127.0.0.1:5672//", prefix=prefix)
    for n in range(12):
        assert backend.record("fine", encode_event("sent", run=f"r{n:02d}", job="fine", at_ms=n), 5)
    backend.close()
    time.sleep(0.3)
    runs = anarchon_celery.history(history_app.app, "fine")
    assert [run.run_id for run in runs] == ["r11", "r10", "r09", "r08", "r07"]  # history_size is 5
    assert [run.run_id for run in anarchon_celery.history(history_app.app, "fine", limit=2)] == ["r11", "r10"]
    assert anarchon_celery.last_run(history_app.app, "fine").run_id == "r11"
    assert anarchon_celery.last_run(history_app.app, "boom") is None
