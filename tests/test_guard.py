"""A beat that is not ours, running an app that uses anarchon_celery, says so loudly, and a worker
that would embed one is not started: above all ``celery worker -B -S anarchon_celery.Scheduler``,
where ``-S`` is ``--statedb``."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from celery import Celery
from kombu import Connection, Exchange, Queue

from anarchon_celery import cron
from anarchon_celery.guard import foreign_scheduler_error

from .support.processes import start_celery
from .test_faults import kill, wait_for

ROOT = Path(__file__).resolve().parent.parent


def test_a_foreign_scheduler_is_named_with_the_fix() -> None:
    app = Celery("guarded", set_as_current=False)

    @cron("*/5 * * * *")
    @app.task(name="guarded.job", shared=False)
    def job() -> None: ...

    error = foreign_scheduler_error(
        app, "celery.beat:PersistentScheduler", embedded=True, statedb="anarchon_celery.Scheduler"
    )
    assert error is not None
    assert "celery.beat:PersistentScheduler" in error
    assert "--scheduler anarchon_celery.Scheduler" in error
    assert "-S is --statedb" in error
    plain = foreign_scheduler_error(app, "celery.beat:PersistentScheduler", embedded=False)
    assert plain is not None and "celery beat -S anarchon_celery.Scheduler" in plain
    assert foreign_scheduler_error(app, "anarchon_celery.Scheduler", embedded=True) is None
    assert foreign_scheduler_error(app, "anarchon_celery.scheduler:Scheduler", embedded=False) is None


def test_an_app_without_anarchon_is_left_alone() -> None:
    app = Celery("plain", set_as_current=False)
    app.conf.beat_schedule = {"x": {"task": "plain.x", "schedule": 10}}
    assert foreign_scheduler_error(app, "celery.beat:PersistentScheduler", embedded=True) is None
    app.conf.anarchon_prefix = "p."  # an anarchon setting: the app means to use it
    assert foreign_scheduler_error(app, "celery.beat:PersistentScheduler", embedded=True) is not None


@pytest.mark.broker
@pytest.mark.processes
@pytest.mark.timeout(120)
def test_a_worker_embedding_our_scheduler_starts_without_the_error(
    prefix: str, broker_url: str, tmp_path: Path
) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HISTORY_APP_PREFIX=prefix, HISTORY_APP_BROKER=broker_url)
    log = tmp_path / "worker.log"
    args = ["worker", "-B", "--scheduler", "anarchon_celery.Scheduler", "--pool=solo", "-l", "info"]
    args += ["--without-mingle", "--without-gossip", "-n", f"{prefix}guard@%h"]
    worker = start_celery(args, log, env, app="tests.apps.history_app", cwd=tmp_path)
    try:
        wait_for(log, "ready.", worker)
        wait_for(log, "anarchon: ready as", worker)
        worker.terminate()
        worker.wait(30)
    except subprocess.TimeoutExpired:
        pass
    finally:
        kill(worker)
    assert "anarchon: this worker's embedded beat (-B)" not in log.read_text(errors="replace")


@pytest.mark.broker
@pytest.mark.processes
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "option",
    [["-S", "anarchon_celery.Scheduler"], []],  # the worker's -S is --statedb; -B alone: Celery's default
    ids=["dash-s", "default-scheduler"],
)
def test_a_worker_that_would_embed_celerys_own_beat_is_not_started(
    prefix: str, broker_url: str, connection: Connection, tmp_path: Path, option: list[str]
) -> None:
    """No plain beat runs, not even for a moment: the worker exits with the error before it
    starts its beat, its pool, or the state file that -S names."""
    tasks = f"{prefix}tasks"
    Queue(tasks, Exchange(tasks), tasks)(connection.default_channel).declare()  # a run sent would wait here
    env = dict(os.environ, PYTHONPATH=str(ROOT), EMBEDDED_APP_PREFIX=prefix, EMBEDDED_APP_BROKER=broker_url)
    log = tmp_path / "worker.log"
    args = ["worker", "-B", *option, "--pool=solo", "-l", "info", "--without-mingle", "--without-gossip"]
    args += ["-Q", f"{prefix}elsewhere", "-n", f"{prefix}guard@%h"]  # (not the queue of the runs)
    worker = start_celery(args, log, env, app="tests.apps.embedded_app", cwd=tmp_path)
    try:
        # Until the worker exits, or its plain beat sends the job every second.
        deadline = time.monotonic() + 90
        while worker.poll() is None and "Sending due task" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.2)
    finally:
        kill(worker)
    text = log.read_text(errors="replace")
    assert "Sending due task" not in text
    assert worker.returncode == 1, text[-3000:]
    assert "anarchon: this worker's embedded beat (-B) runs celery.beat:PersistentScheduler" in text
    assert "The worker is not started. Start it with `-B --scheduler anarchon_celery.Scheduler`" in text
    assert ("-S is --statedb" in text) == bool(option)
    assert connection.default_channel.queue_declare(tasks, passive=True).message_count == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == ["worker.log"]  # no state or schedule file


def test_the_readme_never_tells_a_worker_to_take_the_scheduler_with_dash_s() -> None:
    commands = [line for line in (ROOT / "README.md").read_text().splitlines() if "celery " in line and " -B" in line]
    assert commands, "the README shows how to embed the scheduler in a worker"
    for line in commands:
        if "`" not in line:  # a command line of a code block, not prose about the mistake
            assert "--scheduler anarchon_celery.Scheduler" in line and " -S " not in line, line
