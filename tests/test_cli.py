"""`celery -A app anarchon ...` through click's test runner and as real processes, and the history
a real worker writes (statuses, run-now, a worker killed mid-task)."""

from __future__ import annotations

import html
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery.bin.celery import celery as celery_cli
from click.testing import CliRunner
from kombu import Connection

from anarchon_celery.history import encode_event

from .support.broker_control import BROKER
from .support.processes import stop
from .support.redis_servers import keeps_nothing
from .support.stores import history_app_on
from .support.web import start_web, web_port

ROOT = Path(__file__).resolve().parent.parent
APP = "tests.apps.history_app"

pytestmark = pytest.mark.broker


def forget(*modules: str) -> None:
    """Have the next import of ``modules`` run them again: out of sys.modules, and off their
    package, where Celery's ``-A`` finds them first (``symbol_by_name`` takes the attribute)."""
    for module in modules:
        sys.modules.pop(module, None)
        package, _, name = module.rpartition(".")
        if package in sys.modules and hasattr(sys.modules[package], name):
            delattr(sys.modules[package], name)


@pytest.fixture
def app_env(prefix: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """history_app configured with this test's prefix, imported afresh."""
    monkeypatch.setenv("HISTORY_APP_PREFIX", prefix)
    monkeypatch.delenv("HISTORY_APP_BAD", raising=False)
    forget(APP)
    yield dict(os.environ, PYTHONPATH=str(ROOT))
    forget(APP)


def invoke(*args: str) -> Any:
    result = CliRunner().invoke(celery_cli, ["-A", APP, "anarchon", *args], catch_exceptions=False)
    return result


def celery(env: dict[str, str], *args: str, app: str = APP) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", app, *args],
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


def test_next_after_shows_an_autumn_night(app_env: dict[str, str]) -> None:
    # A real command: a job every 5 minutes in Paris keeps running through the repeated hour of
    # 2026-10-25 (02:00-03:00 happens twice), as cron runs such a job.
    env = dict(app_env, HISTORY_APP_FIVE_TZ="Europe/Paris")
    done = celery(env, "anarchon", "next", "five", "-n", "4", "--after", "2026-10-25T02:50", "--json")
    assert done.returncode == 0, done.stderr
    assert [run["local"] for run in json.loads(done.stdout)] == [
        "2026-10-25T02:55:00+02:00",
        "2026-10-25T02:00:00+01:00",
        "2026-10-25T02:05:00+01:00",
        "2026-10-25T02:10:00+01:00",
    ]
    utc = celery(env, "anarchon", "next", "five", "-n", "1", "--after", "2026-10-25T01:02Z", "--json")
    assert json.loads(utc.stdout)[0]["local"] == "2026-10-25T02:05:00+01:00", utc.stderr
    bad = celery(env, "anarchon", "next", "five", "--after", "next october")
    assert bad.returncode != 0 and "'next october' is not an ISO 8601 time" in bad.stderr, bad.stderr


def test_a_refused_cron_option_is_one_line_naming_the_job(app_env: dict[str, str]) -> None:
    done = celery(dict(app_env, HISTORY_APP_BAD_CRON="1"), "anarchon", "jobs")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "Error: job 'caught': hand_over is not available: a backend with leases hands over by itself on "
        "SIGTERM: there is nothing to set"
    ]


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
    assert report["ok"] and [c["check"] for c in report["checks"]] == ["config", "broker", "claims", "streams"]
    with Connection(BROKER) as conn:
        version = conn.connection.server_properties["version"]
    assert f"RabbitMQ {version}" in report["checks"][1]["detail"] and "guest:**@" in report["checks"][1]["detail"]


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_check_says_whether_the_task_queues_outlive_a_node_of_a_cluster(
    app_env: dict[str, str], broker_url: str, queue_type: str
) -> None:
    # Two URLs: a cluster, as far as the configuration tells (here both reach this machine's node).
    nodes = f"{broker_url};{broker_url.replace('127.0.0.1', 'localhost')}"
    env = dict(app_env, HISTORY_APP_BROKER=nodes, HISTORY_APP_TASK_QUEUE_TYPE=queue_type)
    done = celery(env, "anarchon", "check", "--json")
    [tasks] = [c for c in json.loads(done.stdout)["checks"] if c["check"] == "tasks"]
    if queue_type == "classic":
        queue = f"{app_env['HISTORY_APP_PREFIX']}tasks"
        assert tasks.get("warn") and f"task queue(s) {queue} are classic" in tasks["detail"]
        assert "task_default_queue_type = 'quorum'" in tasks["detail"]
    else:
        assert not tasks.get("warn") and "replicated" in tasks["detail"]
    single = celery(app_env, "anarchon", "check", "--json")  # one node: nothing to say
    assert "tasks" not in [c["check"] for c in json.loads(single.stdout)["checks"]]


SQLITE_CHECKS = [("ok", "config"), ("ok", "store"), ("ok", "claims"), ("ok", "history")]


def store_url(store: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """The URL of the suite's store of that kind (a file of the test's own for SQLite)."""
    return {
        "sqlite": lambda: f"sqlite:///{tmp_path / 'anarchon.db'}",
        "redis": lambda: str(request.getfixturevalue("redis_url")),
        "postgres": lambda: str(request.getfixturevalue("postgres_url")),
    }[store]()


@pytest.mark.parametrize("store", ["sqlite", "redis", "postgres"])
def test_check_on_a_lease_store(
    store: str, app_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    url = store_url(store, tmp_path, request)
    monkeypatch.setenv("HISTORY_APP_BACKEND", url)
    monkeypatch.setenv("HISTORY_APP_LEASE_MS", "2000")  # shorter than the jobs' max_late_ms (5 s)
    monkeypatch.setenv("HISTORY_APP_CATCH_UP", "latest")
    forget(APP)
    result = invoke("check")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    expected = [[status, step] for status, step in SQLITE_CHECKS]
    if store == "redis" and keeps_nothing(url):  # warned of, not failed (tests/test_redis_persistence.py)
        expected[1][0] = "warn"
    assert [line.split()[:2] for line in lines] == expected
    assert "a winner holds its run for 2000 ms, 2 backup(s) per run; catch-up latest: boom, fine, sleepy" in lines[2]
    if store == "sqlite":
        assert f"SQLite database {tmp_path / 'anarchon.db'}" in lines[1] and "write-ahead log" in lines[1]
    elif store == "redis":
        assert "Redis at redis://127.0.0.1:6379/5" in lines[1] and ": Redis " in lines[1]
    else:
        assert "PostgreSQL at postgresql://postgres@127.0.0.1:5432/test" in lines[1] and ": PostgreSQL 1" in lines[1]
    # A host whose clock is off the store's is warned of: runs are decided on the store's clock.
    monkeypatch.setattr("anarchon_celery.clock.now_ms", lambda: int(time.time() * 1000) + 5_000)
    result = invoke("check")
    assert result.exit_code == 0 and "warn  store" in result.output and "check time sync" in result.output
    # So are jobs whose lateness allowed ends before the winner's lease: no backup could act.
    monkeypatch.setenv("HISTORY_APP_LEASE_MS", "5000")
    forget(APP)
    result = invoke("check")
    assert result.exit_code == 0 and "warn  claims" in result.output, result.output
    assert "the backups of boom, fine, sleepy can never act" in result.output


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
@pytest.mark.parametrize("store", ["rabbitmq", "sqlite"])
def test_run_now_and_the_worker_history(
    store: str, app_env: dict[str, str], prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if store == "sqlite":  # the worker writes the events to the file, the commands read them there
        app_env = dict(app_env, HISTORY_APP_BACKEND=f"sqlite:///{tmp_path / 'anarchon.db'}")
        monkeypatch.setenv("HISTORY_APP_BACKEND", app_env["HISTORY_APP_BACKEND"])
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
    backend = anarchon_celery.RabbitMQBackend(BROKER, prefix=prefix)
    for n in range(12):
        assert backend.record("fine", encode_event("sent", run=f"r{n:02d}", job="fine", at_ms=n), 5)
    backend.close()
    time.sleep(0.3)
    runs = anarchon_celery.history(history_app.app, "fine")
    assert [run.run_id for run in runs] == ["r11", "r10", "r09", "r08", "r07"]  # history_size is 5
    assert [run.run_id for run in anarchon_celery.history(history_app.app, "fine", limit=2)] == ["r11", "r10"]
    assert anarchon_celery.last_run(history_app.app, "fine").run_id == "r11"
    assert anarchon_celery.last_run(history_app.app, "boom") is None


# -- the app's task modules -----------------------------------------------------------------------

IMPORTS_APP = "tests.apps.cli_imports_app"


@pytest.fixture
def imports_env(prefix: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """cli_imports_app configured with this test's prefix, imported afresh."""
    monkeypatch.setenv("CLI_IMPORTS_APP_PREFIX", prefix)
    modules = [
        IMPORTS_APP,
        "tests.apps.cli_included_tasks",
        "tests.apps.cli_imported_tasks",
        "tests.apps.cli_discovered_tasks",
    ]
    forget(*modules)
    yield dict(os.environ, PYTHONPATH=str(ROOT))
    forget(*modules)


def test_every_command_imports_the_apps_task_modules(imports_env: dict[str, str]) -> None:
    # As `celery beat` does: the tasks (and @cron jobs) of `include`, `imports` and autodiscover_tasks.
    def anarchon(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "celery", "-A", IMPORTS_APP, "anarchon", *args],
            cwd=ROOT,
            env=imports_env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    report = json.loads(anarchon("check", "--json").stdout)
    assert report["ok"] and report["checks"][0]["detail"].startswith("3 job(s) valid"), report
    jobs = {job["job"]: job["task"] for job in json.loads(anarchon("jobs", "--json").stdout)}
    assert jobs == {
        "discovered": "cli_imports.discovered",  # @cron, in a module found by autodiscover_tasks
        "imported": "cli_imports.imported",  # beat_schedule, its task in a module of `imports`
        "included": "cli_imports.included",  # @cron, in a module of `include`
    }
    assert json.loads(anarchon("history", "included", "--json").stdout) == []
    assert len(json.loads(anarchon("next", "discovered", "-n", "2", "--json").stdout)) == 2
    sent = json.loads(anarchon("run-now", "imported", "--json").stdout)
    assert sent["job"] == "imported"


def test_the_task_modules_are_imported_once(imports_env: dict[str, str]) -> None:
    from celery import signals

    sent: list[Any] = []

    def count(sender: Any = None, **_: Any) -> None:
        sent.append(sender)

    signals.import_modules.connect(count, weak=False)
    try:
        for args in (["next", "included"], ["next", "discovered"]):
            result = invoke_app(IMPORTS_APP, *args)
            assert result.exit_code == 0, result.output
    finally:
        signals.import_modules.disconnect(count)
    assert len(sent) == 1 and sent[0].main == "cli_imports_app"


def invoke_app(app: str, *args: str) -> Any:
    return CliRunner().invoke(celery_cli, ["-A", app, "anarchon", *args], catch_exceptions=False)


# -- connections ----------------------------------------------------------------------------------


@pytest.mark.parametrize("shared", [False, True], ids=["own-backend", "backend-instance"])
@pytest.mark.parametrize(
    "args",
    [["jobs"], ["history", "fine"], ["next", "fine"], ["run-now", "fine"], ["check"], ["prune"]],
    ids=lambda a: a[0],
)
def test_every_command_closes_the_connections_it_opens(
    app_env: dict[str, str],
    prefix: str,
    broker_url: str,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    shared: bool,
) -> None:
    """In process: every kombu connection a command used is closed when it returns (not left for the
    process exit, which the broker logs as "client unexpectedly closed TCP connection")."""
    import importlib

    from anarchon_celery import RabbitMQBackend, cli, control

    history_app = importlib.import_module(APP)
    if shared:  # an instance in the app's settings: the command connected it, so it closes it
        history_app.app.conf.anarchon_backend = RabbitMQBackend(broker_url, prefix=prefix, slot_ttl_ms=60_000)
    used: list[Any] = []
    real_configure, real_task_connection = control.configure, control.task_connection

    def configure(app: Any) -> Any:
        deployment = real_configure(app)
        used.append(deployment.backend.connection)
        return deployment

    def task_connection(app: Any, **options: Any) -> Any:
        used.append(real_task_connection(app, **options))
        return used[-1]

    monkeypatch.setattr(cli, "configure", configure)
    monkeypatch.setattr(control, "configure", configure)
    monkeypatch.setattr(control, "task_connection", task_connection)
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert used
    assert [c.connected for c in used] == [False] * len(used)


# -- prune ----------------------------------------------------------------------------------------


def _queue_exists(broker_url: str, name: str) -> bool:
    from amqp.exceptions import NotFound

    with Connection(broker_url) as conn:
        try:
            conn.default_channel.queue_declare(name, passive=True)
            return True
        except NotFound:
            return False


def test_prune_lists_then_deletes_the_streams_of_jobs_that_are_gone(
    app_env: dict[str, str], prefix: str, broker_url: str
) -> None:
    from anarchon_celery import RabbitMQBackend
    from anarchon_celery.backends.rabbitmq import history_arguments

    backend = RabbitMQBackend(broker_url, prefix=prefix)
    for job in ("fine", "stale", "gone-too"):  # "fine" is configured; the others are not any more
        assert backend.ensure_history(job, 5)
    assert backend.record("stale", encode_event("sent", run="r1", job="stale", at_ms=1), 5)
    backend.close()
    with Connection(broker_url) as conn:  # not streams, or not history: never candidates
        channel = conn.default_channel
        channel.queue_declare(f"{prefix}classic.history", durable=True, auto_delete=False)
        channel.queue_declare(f"{prefix}stale.slot.1", durable=True, auto_delete=False)
        channel.queue_declare(
            f"{prefix}odd.name.history", durable=True, auto_delete=False, arguments=history_arguments(1)
        )
    stale, gone, kept = (f"{prefix}{job}.history" for job in ("stale", "gone-too", "fine"))

    dry = invoke("prune", "--json")
    assert dry.exit_code == 0, dry.output
    listed = json.loads(dry.output)
    assert [(s["job"], s["stream"], s["deleted"]) for s in listed] == [
        ("gone-too", gone, False),
        ("stale", stale, False),
    ]
    assert all(_queue_exists(broker_url, name) for name in (stale, gone, kept))
    table = invoke("prune").output
    assert table.splitlines()[0].split() == ["JOB", "STREAM", "ACTION"] and "--yes" in table

    done = invoke("prune", "--yes", "--json")
    assert done.exit_code == 0, done.output
    assert [(s["job"], s["deleted"]) for s in json.loads(done.output)] == [("gone-too", True), ("stale", True)]
    assert not _queue_exists(broker_url, stale) and not _queue_exists(broker_url, gone)
    for name in (kept, f"{prefix}classic.history", f"{prefix}stale.slot.1", f"{prefix}odd.name.history"):
        assert _queue_exists(broker_url, name), name
    again = invoke("prune", "--yes")
    assert again.exit_code == 0 and "(none)" in again.output


def test_prune_named_jobs(app_env: dict[str, str], prefix: str, broker_url: str) -> None:
    from anarchon_celery import RabbitMQBackend

    backend = RabbitMQBackend(broker_url, prefix=prefix)
    for job in ("fine", "old-a", "old-b"):
        assert backend.ensure_history(job, 5)
    backend.close()
    old_a, old_b, kept = (f"{prefix}{job}.history" for job in ("old-a", "old-b", "fine"))
    # No rabbitmqctl needed: a job name, or its stream's name, checked over AMQP.
    env = dict(app_env, PATH="/nonexistent")
    dry = celery(env, "anarchon", "prune", "old-a", old_b)
    assert dry.returncode == 0, dry.stderr
    assert old_a in dry.stdout and old_b in dry.stdout and _queue_exists(broker_url, old_a)

    for args, message in [
        (["fine", "old-a"], "Error: job 'fine' is configured: its history stream is never pruned"),
        ([kept], "Error: job 'fine' is configured"),
        (["nope"], f"Error: no history stream {prefix}nope.history"),
        (
            ["other.x.history"],
            f"Error: 'other.x.history' is neither a job name nor a history stream of prefix {prefix!r}",
        ),
        (["bad/name"], "Error: 'bad/name' is neither a job name"),
    ]:
        refused = celery(env, "anarchon", "prune", "--yes", *args)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert refused.stderr.strip().startswith(message) and len(refused.stderr.strip().splitlines()) == 1, (
            refused.stderr
        )
    assert all(_queue_exists(broker_url, name) for name in (old_a, old_b, kept))  # nothing deleted by a refusal

    done = celery(env, "anarchon", "prune", "--yes", "old-a", old_b, "--json")
    assert done.returncode == 0, done.stderr
    assert [(s["job"], s["deleted"]) for s in json.loads(done.stdout)] == [("old-a", True), ("old-b", True)]
    assert not _queue_exists(broker_url, old_a) and not _queue_exists(broker_url, old_b)
    assert _queue_exists(broker_url, kept)


def test_prune_without_rabbitmqctl_says_what_to_do(app_env: dict[str, str]) -> None:
    env = {key: value for key, value in app_env.items() if key != "ANARCHON_RABBITMQCTL"}
    done = celery(dict(env, PATH="/nonexistent"), "anarchon", "prune")
    assert done.returncode == 1
    error = done.stderr.strip()
    assert error.startswith("Error: cannot list the broker's queues: rabbitmqctl") and len(error.splitlines()) == 1
    assert "prune JOB" in error and "--rabbitmqctl" in error


# -- validation through check ---------------------------------------------------------------------


def test_check_refuses_arguments_the_serializer_cannot_encode(app_env: dict[str, str]) -> None:
    import importlib

    history_app = importlib.import_module(APP)
    history_app.app.conf.beat_schedule["opaque"] = {"task": "history_app.add", "schedule": 60, "args": (object(), 1)}
    result = invoke("check")
    assert result.exit_code == 1
    assert result.output.startswith("FAIL  config   job 'opaque': its args/kwargs cannot be serialized with 'json'")


def test_check_refuses_arguments_that_do_not_fit_the_task(app_env: dict[str, str]) -> None:
    done = celery(dict(app_env, HISTORY_APP_BAD_ARGS="1"), "anarchon", "check")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "FAIL  config   job 'sum': its arguments do not fit task 'history_app.add'(x, y): called as (1), missing 1 "
        "required positional argument: 'y'. Give args/kwargs that the task's parameters take, or make the task "
        "with typing=False (@app.task(typing=False)) if it takes them another way"
    ]
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("store", ["sqlite", "redis", "postgres"])
def test_prune_on_a_lease_store_deletes_what_removed_jobs_left(
    store: str, app_env: dict[str, str], prefix: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from anarchon_celery import Claim
    from anarchon_celery.backends import PostgresBackend, RedisBackend, SQLiteBackend

    from .support.stores import delete_postgres_rows, delete_redis_keys

    url = store_url(store, tmp_path, request)
    kind = {"sqlite": SQLiteBackend, "redis": RedisBackend, "postgres": PostgresBackend}[store]
    backend = kind.from_url(url, prefix=prefix, slot_ttl_ms=60_000)
    try:
        backend.open()
        now = int(time.time() * 1000)
        # A removed job's state (cursor, a run, history), and a configured job's.
        assert len(backend.claim([Claim("gone", now), Claim("fine", now)], "somebody")) == 2
        backend.record("gone", encode_event("sent", run="r1", job="gone", at_ms=now), 5)
        backend.record("fine", encode_event("sent", run="r2", job="fine", at_ms=now), 5)
        env = dict(app_env, HISTORY_APP_BACKEND=url)
        dry = celery(env, "anarchon", "prune", "--json")
        assert dry.returncode == 0, dry.stderr
        assert json.loads(dry.stdout) == [{"job": "gone", "what": "cursor, run records, history", "deleted": False}]
        assert backend.stored_jobs() == ["fine", "gone"]
        refused = celery(env, "anarchon", "prune", "--yes", "fine")
        assert refused.returncode == 1 and "job 'fine' is configured: its state is never pruned" in refused.stderr
        unknown = celery(env, "anarchon", "prune", "--yes", "never-was")
        assert unknown.returncode == 1 and "no state of job(s) 'never-was'" in unknown.stderr
        done = celery(env, "anarchon", "prune", "--yes")
        assert done.returncode == 0 and "gone" in done.stdout and "deleted" in done.stdout, done.stderr
        assert backend.stored_jobs() == ["fine"]
        assert backend.read_history(["gone"]) == {"gone": []}
        assert len(backend.read_history(["fine"])["fine"]) == 1
    finally:
        if store == "redis":
            delete_redis_keys(url, prefix)
        elif store == "postgres":
            delete_postgres_rows(url, prefix)
        backend.close()


@pytest.mark.processes
@pytest.mark.timeout(180)
def test_a_celery_crontab_is_shown_as_one_where_jobs_are_listed(
    beat_env: dict[str, str], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """An imported django-celery-beat crontab (or any Celery crontab) reads as the crontab it is,
    day of month and day of week both restricting, not as a cron string, whose days are or-ed."""
    env = history_app_on("sqlite", beat_env, tmp_path, request)
    crontab = ["--schedule", '{"crontab": "0 9 1-7 * 1"}', "--tz", "Europe/Paris"]
    added = celery(env, "anarchon", "add", "first-monday", "--task", "history_app.fine", *crontab)
    assert added.returncode == 0, added.stderr
    shown = "crontab(minute='0', hour='9', day_of_week='1', day_of_month='1-7') Europe/Paris"
    listed = celery(env, "anarchon", "jobs", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {job["job"]: job["schedule"] for job in json.loads(listed.stdout)}["first-monday"] == shown
    table = celery(env, "anarchon", "jobs")
    assert shown in table.stdout and "1,2,3,4,5,6,7" not in table.stdout, table.stdout
    log = tmp_path / "web.log"
    web = start_web(env, log, app=APP)
    try:
        port = web_port(log, web)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=60) as answer:
            page = answer.read().decode()
    finally:
        stop(web)
    assert html.escape(shown) in page and "1,2,3,4,5,6,7" not in page
