"""Each extra installed alone, as the getting-started page says, in a fresh virtualenv (no system
site-packages, no test dependencies: the package's wheel with that extra, from PyPI): the
getting-started project, with that extra's broker and backend, passes `celery anarchon check`
and a real beat sends a run of it. An extra that misses what its backend or Celery's transport
imports fails here (``[redis]`` without kombu's ``packaging``: every Redis-broker app died at start).

The wheel is built once per process from a copy of the package (the build leaves nothing in the
checkout), each virtualenv once per extra, before the test takes the services' lock."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection, Exchange, Queue

from .support.processes import stop, wait_for_line

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ROOT / "docs" / "examples" / "proj.py"
#: The broker of the getting-started project, replaced by the test's.
PROJECT_BROKER = 'broker="amqp://guest:guest@localhost//"'
#: "" is the package alone: runs decided in RabbitMQ or a SQLite file need no extra.
EXTRAS = ["", "redis", "postgres", "metrics"]
PROBES = re.compile(r"health probes served on http://127\.0\.0\.1:(\d+)/healthz and /readyz, metrics on /metrics")

pytestmark = [pytest.mark.extras, pytest.mark.processes, pytest.mark.timeout(600)]


def _run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=400, **kwargs)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package built as a wheel, from a copy of what it is made of."""
    folder = tmp_path_factory.mktemp("wheel")
    source = folder / "source"
    shutil.copytree(ROOT / "anarchon_celery", source / "anarchon_celery", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(folder), str(source)])
    [built] = folder.glob("anarchon_celery-*.whl")
    return built


@pytest.fixture(scope="module", params=EXTRAS, ids=lambda extra: extra or "none")
def installed(
    request: pytest.FixtureRequest, wheel: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path]:
    """The extra, and a fresh virtualenv with the package installed with that extra alone."""
    extra: str = request.param
    venv = tmp_path_factory.mktemp(f"venv-{extra or 'none'}") / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    _run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", f"{wheel}[{extra}]" if extra else str(wheel)]
    )
    return extra, venv


@dataclass
class Project:
    """The getting-started project as one extra runs it: its broker, settings and task queue, and
    how to read that queue's messages from the test."""

    broker: str
    settings: dict[str, Any]
    queue: str
    messages: Callable[[], list[dict[str, Any]]]


@contextlib.contextmanager
def _project(extra: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Project]:
    """The project of ``extra``, under the test's own names (deleted after it by their fixtures)."""
    if extra == "redis":  # tasks over Redis, runs decided in it (the app's broker)
        redis_url, keys = request.getfixturevalue("redis_url"), request.getfixturevalue("redis_prefix")
        settings = {"anarchon_prefix": keys, "broker_transport_options": {"global_keyprefix": keys}}
        yield Project(redis_url, settings, f"{keys}tasks", lambda: _redis_messages(redis_url, f"{keys}{keys}tasks"))
        return
    broker, prefix = request.getfixturevalue("broker_url"), request.getfixturevalue("prefix")
    settings = {"anarchon_prefix": prefix}
    if extra == "postgres":
        settings["anarchon_prefix"] = request.getfixturevalue("postgres_prefix")
        settings["anarchon_backend"] = request.getfixturevalue("postgres_url")
    elif extra == "metrics":  # runs decided in RabbitMQ, metrics served beside the probes
        settings.update(anarchon_metrics_port=0, anarchon_metrics_address="127.0.0.1")
    else:
        settings["anarchon_backend"] = f"sqlite:///{tmp_path / 'anarchon.db'}"
    with Connection(broker) as conn:  # the task queue, as a worker declares it
        queue = Queue(f"{prefix}tasks", Exchange(f"{prefix}tasks"), f"{prefix}tasks")(conn.default_channel)
        queue.declare()
        yield Project(broker, settings, f"{prefix}tasks", lambda: _amqp_messages(queue))


def _redis_messages(redis_url: str, key: str) -> list[dict[str, Any]]:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        return [json.loads(raw) for raw in client.lrange(key, 0, -1)]
    finally:
        client.close()


def _amqp_messages(queue: Queue) -> list[dict[str, Any]]:
    found = []
    while (message := queue.get(no_ack=True)) is not None:
        found.append({"headers": message.headers})
    return found


def _write_project(folder: Path, project: Project) -> None:
    """proj.py of the getting-started page, on the test's broker and names, with a job every second."""
    text = PROJECT.read_text()
    assert PROJECT_BROKER in text, f"{PROJECT} no longer has {PROJECT_BROKER}"
    text = text.replace(PROJECT_BROKER, f"broker={project.broker!r}")
    text += (
        "\n# The test's own names, and a run every second.\n"
        f"app.conf.update({project.settings!r}, task_default_queue={project.queue!r})\n"
        'app.conf.beat_schedule["every-second"] = {"task": "proj.report", "schedule": 1.0, "args": ("extras",)}\n'
    )
    (folder / "proj.py").write_text(text)


def test_each_extra_alone_runs_the_getting_started_project(
    installed: tuple[str, Path], request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    extra, venv = installed
    celery = str(venv / "bin" / "celery")
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
    with _project(extra, request, tmp_path) as project:
        _write_project(tmp_path, project)
        checked = subprocess.run(
            [celery, "-A", "proj", "anarchon", "check"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert checked.stdout.startswith("ok    config"), checked.stdout
        log = tmp_path / "beat.log"
        beat = subprocess.Popen(
            [celery, "-A", "proj", "beat", "-S", "anarchon_celery.Scheduler", "-l", "info"],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_for_line(log, "anarchon: ready as", beat, timeout=60)
            sent = _wait_for_a_run(project, beat, log)
            assert sent["headers"]["task"] == "proj.report" and sent["headers"]["anarchon_job"] == "every-second"
            if extra == "metrics":
                [port] = PROBES.findall(log.read_text())
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
                    assert "anarchon_runs_sent_total" in answer.read().decode()
        finally:
            stop(beat)
        assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


def _wait_for_a_run(project: Project, beat: subprocess.Popen[bytes], log: Path) -> dict[str, Any]:
    """The first message of the job every second in the task queue."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        runs = [m for m in project.messages() if m["headers"].get("anarchon_job") == "every-second"]
        if runs:
            return runs[0]
        assert beat.poll() is None, log.read_text()[-3000:]
        time.sleep(0.2)
    raise AssertionError(f"no run of every-second in {project.queue} within 60 s:\n{log.read_text()[-3000:]}")
