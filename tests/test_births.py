"""A job's first runs, with real beats on every backend: a start claims the runs still within
their lateness, but only of a job that existed then (a new deployment, a job added to the code, a
runtime job added while every beat was down)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from kombu import Connection, Exchange, Queue

from anarchon_celery import clock

from .conftest import ROOT
from .support.stores import delete_postgres_rows, delete_redis_keys
from .test_cli import celery
from .test_faults import kill, start_beat, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.processes]

APP = "tests.apps.births_app"


@pytest.fixture(params=["rabbitmq", "sqlite", "redis", "postgres"])
def births_env(
    request: pytest.FixtureRequest, prefix: str, broker_url: str, tmp_path: Path
) -> Iterator[dict[str, str]]:
    """The environment of a beat of tests.apps.births_app deciding its runs on each backend, its
    task queue declared as a worker would; what the beats leave in a store is deleted."""
    kind = request.param
    store = {"rabbitmq": "", "sqlite": f"sqlite:///{tmp_path / 'anarchon.db'}"}.get(kind)
    if store is None:
        store = request.getfixturevalue(f"{kind}_url")
    with Connection(broker_url) as conn:
        Queue(f"{prefix}tasks", Exchange(f"{prefix}tasks"), f"{prefix}tasks")(conn.default_channel).declare()
    try:
        yield dict(os.environ, PYTHONPATH=str(ROOT), BIRTHS_APP_PREFIX=prefix, BIRTHS_APP_BACKEND=store)
    finally:
        if kind == "redis":
            delete_redis_keys(store, prefix)
        elif kind == "postgres":
            delete_postgres_rows(store, prefix)


def _sent(broker_url: str, prefix: str) -> dict[str, list[int]]:
    """The slots of each job's runs in the task queue (drained), in order."""
    runs: dict[str, list[int]] = {}
    with Connection(broker_url) as conn:
        while (message := conn.default_channel.basic_get(f"{prefix}tasks", no_ack=True)) is not None:
            runs.setdefault(message.headers["anarchon_job"], []).append(message.headers["anarchon_slot"])
    return {job: sorted(slots) for job, slots in runs.items()}


def _run(where: Path, envs: list[dict[str, str]], apart_s: float) -> str:
    """Beats started ``apart_s`` apart, until one has sent a run, 2 s more, then stopped cleanly
    (each exits 0); their logs."""
    where.mkdir()
    logs = [where / f"beat-{n}.log" for n in range(len(envs))]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for n, (env, log) in enumerate(zip(envs, logs)):
            time.sleep(apart_s if n else 0)
            procs.append(start_beat(env, log, APP))
        for proc, log in zip(procs, logs):
            wait_for(log, "anarchon: ready as", proc)
        wait_for(logs[0], "won, sent", procs[0])  # (the first beat to start wins the first runs)
        time.sleep(2)
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc, log in zip(procs, logs):
            assert proc.wait(30) == 0, log.read_text(errors="replace")[-3000:]
    finally:
        for proc in procs:
            kill(proc)
    return "".join(log.read_text(errors="replace") for log in logs)


@pytest.mark.timeout(240)
def test_a_start_sends_the_runs_missed_only_of_jobs_that_existed_then(
    births_env: dict[str, str], broker_url: str, prefix: str, tmp_path: Path
) -> None:
    """A new deployment (two beats started 2 s apart, a job every second, a lateness of 20 s)
    sends no run from before its first beat. Stopped 4 s, then started again with a job added to
    the code, after a runtime job was added: the runs missed while they were down are sent for the
    job that existed, and for the runtime job from when it was added; none of the new code job
    from before the restart. Every run is sent once."""
    first = clock.now_ms()
    text = _run(tmp_path / "new", [births_env, births_env], apart_s=2)
    sent = _sent(broker_url, prefix)
    assert set(sent) == {"every"}, sent
    assert sent["every"][0] >= first, (first, sent)  # none from before the deployment
    stopped = clock.now_ms()

    added_at = clock.now_ms()
    add = celery(births_env, "anarchon", "add", "rt", "--task", "births_app.work", "--schedule", "1", app=APP)
    assert add.returncode == 0, add.stdout + add.stderr
    time.sleep(4)  # every beat down: the runs of these seconds are missed
    restart = clock.now_ms()
    text += _run(tmp_path / "again", [dict(births_env, BIRTHS_APP_ADDED="1")] * 2, apart_s=0)
    again = _sent(broker_url, prefix)
    assert set(again) == {"every", "added", "rt"}, again
    every = sent["every"] + again["every"]
    assert [slot for slot, n in Counter(every).items() if n > 1] == [], "runs sent twice"
    # The runs missed while every beat was down were sent (the job existed then): none is missing.
    assert sorted(set(range(every[0], every[-1] + 1, 1_000)) - set(every)) == [], every
    assert min(again["every"]) < restart - 3_000, (restart, again["every"])
    # The runtime job from when it was added (while the beats were down), not before.
    assert added_at - 1_000 <= min(again["rt"]) < restart - 2_000, (added_at, restart, again["rt"])
    assert min(again["rt"]) > stopped - 1_000
    # The job added to the code: from the restart on.
    assert min(again["added"]) >= restart, (restart, again["added"])
    for job in ("added", "rt"):
        assert sorted(set(range(again[job][0], again[job][-1] + 1, 1_000)) - set(again[job])) == [], again
        assert len(again[job]) == len(set(again[job])), again
    assert "Traceback" not in text
