"""A beat that is not ours, running an app that uses anarchon_celery, says so loudly: above all
``celery worker -B -S anarchon_celery.Scheduler``, where ``-S`` is ``--statedb``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from celery import Celery

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
@pytest.mark.parametrize(
    "option, ours",
    [
        (["-S", "anarchon_celery.Scheduler"], False),  # the worker's -S is --statedb
        (["--scheduler", "anarchon_celery.Scheduler"], True),
    ],
)
def test_a_worker_embedding_celerys_own_beat_says_so(
    prefix: str, broker_url: str, tmp_path: Path, option: list[str], ours: bool
) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HISTORY_APP_PREFIX=prefix, HISTORY_APP_BROKER=broker_url)
    log = tmp_path / "worker.log"
    args = ["worker", "-B", *option, "--pool=solo", "-l", "info", "--without-mingle", "--without-gossip"]
    args += ["-n", f"{prefix}guard@%h"]
    worker = start_celery(args, log, env, app="tests.apps.history_app", cwd=tmp_path)
    try:
        wait_for(log, "ready.", worker)
        if ours:
            wait_for(log, "anarchon: ready as", worker)
        worker.terminate()
        worker.wait(30)
    except subprocess.TimeoutExpired:
        pass
    finally:
        kill(worker)
    text = log.read_text(errors="replace")
    error = "anarchon: this worker's embedded beat (-B) runs celery.beat:PersistentScheduler"
    if ours:
        assert error not in text
    else:
        assert error in text
        assert "--scheduler anarchon_celery.Scheduler" in text
        assert "-S is --statedb" in text


def test_the_readme_never_tells_a_worker_to_take_the_scheduler_with_dash_s() -> None:
    commands = [line for line in (ROOT / "README.md").read_text().splitlines() if "celery " in line and " -B" in line]
    assert commands, "the README shows how to embed the scheduler in a worker"
    for line in commands:
        if "`" not in line:  # a command line of a code block, not prose about the mistake
            assert "--scheduler anarchon_celery.Scheduler" in line and " -S " not in line, line
