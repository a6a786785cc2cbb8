"""End to end: real `celery beat` processes and real workers on the real RabbitMQ.

The runs are counted by their deterministic task ids, as executed by the worker; see
examples/demo.py, which these tests drive.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from typing import Any

import demo
import pytest

from .support.proxy import free_port

pytestmark = [pytest.mark.broker, pytest.mark.processes]

#: A progress line of the 12 s demo below.
TICK = re.compile(r"demo: \d+/12 s: \d+ runs executed so far, 0 duplicates; won by beat-1 \d+, beat-2 \d+")


def assert_exactly_once(result: dict) -> None:
    assert result["expected"] >= 10, result
    assert result["missed"] == 0, [r for r in result["runs"] if r["executed"] == 0]
    assert result["duplicates"] == 0, [r for r in result["runs"] if r["executed"] > 1]
    assert result["duplicate_executions_total"] == 0
    assert result["executed"] == result["expected"]
    assert not result["password_in_logs"]
    for run in result["runs"]:
        assert len(run["winners"]) == 1, run  # one instance won each run, and said so
    # A backup takes a run over only when its winner stalled longer than the lease (2 s) before
    # marking it sent: rare on a loaded machine, never the rule (runs not marked sent would be).
    assert sum(1 for run in result["runs"] if run["taken_over_by"]) <= 1, result["runs"]


@pytest.mark.exclusive  # the demo's runs, held to its wall-clock bounds: not beside other tests
@pytest.mark.timeout(300)
def test_three_beats_and_a_worker_run_every_slot_exactly_once(broker_url: str) -> None:
    result = demo.run(beats=3, duration=30)
    assert_exactly_once(result)
    # The race is real: more than one instance won runs.
    assert len({run["winners"][0] for run in result["runs"]}) > 1

    # History, written by the winning beats and by the worker, read back with the right statuses.
    recorded = {run["run_id"]: run for runs in result["history"].values() for run in runs}
    for run in result["runs"]:
        entry = recorded[run["task_id"]]
        assert entry["status"] == ("failed" if run["job"] == "fails" else "succeeded"), entry
        assert (entry["job"], entry["slot"], entry["trigger"]) == (run["job"], run["slot"], "schedule")
        assert entry["instance"] and entry["worker"] and entry["sent_at_ms"] and entry["finished_at_ms"]
        if run["job"] == "fails":
            assert (entry["error_type"], entry["error"]) == ("RuntimeError", "this job fails on purpose")

    # And what the command line shows of it.
    assert [line.split()[:2] for line in result["cli"]["check"].splitlines()] == [
        ["ok", "config"],
        ["ok", "broker"],
        ["ok", "claims"],
        ["ok", "streams"],
    ]
    assert "fails" in result["cli"]["jobs"] and "failed" in result["cli"]["jobs"]
    assert "RuntimeError: this job fails on purpose" in result["cli"]["history"]


@pytest.mark.exclusive  # the demo's runs, held to its wall-clock bounds: not beside other tests
@pytest.mark.timeout(240)
def test_three_beats_on_sqlite_with_the_tasks_as_files_need_no_broker() -> None:
    """The demo a machine without RabbitMQ runs: claims in a SQLite file, tasks over kombu's
    filesystem:// transport, history in the file, read back by the commands."""
    before = {key: os.environ.get(key) for key in ("ANARCHON_DEMO_BROKER", "ANARCHON_DEMO_PREFIX")}
    result = demo.run(beats=3, duration=20, backend="sqlite")
    assert_exactly_once(result)
    # This process's environment is as it was: a demo started after this one (test_the_demo_command,
    # in the same test process) would otherwise send its tasks to this run's folder.
    assert {key: os.environ.get(key) for key in before} == before
    assert len({run["winners"][0] for run in result["runs"]}) > 1
    recorded = {run["run_id"]: run for runs in result["history"].values() for run in runs}
    for run in result["runs"]:
        assert recorded[run["task_id"]]["status"] == ("failed" if run["job"] == "fails" else "succeeded")
    assert [line.split()[:2] for line in result["cli"]["check"].splitlines()] == [
        ["ok", "config"],
        ["ok", "store"],
        ["ok", "claims"],
        ["ok", "history"],
    ]
    assert "RuntimeError: this job fails on purpose" in result["cli"]["history"]


def test_without_rabbitmq_the_demo_says_so_and_chooses_sqlite(capsys: pytest.CaptureFixture[str]) -> None:
    nowhere = f"amqp://guest:s3cret@127.0.0.1:{free_port()}//"
    assert demo.choose_backend(None, None, default=nowhere) == "sqlite"
    [line] = capsys.readouterr().err.splitlines()
    assert "no RabbitMQ answers at amqp://guest:**@127.0.0.1:" in line and "SQLite backend" in line
    assert "s3cret" not in line
    # Asked for, or named by ANARCHON_DEMO_BROKER, RabbitMQ that does not answer is an error.
    for requested, broker in (("rabbitmq", None), (None, nowhere)):
        with pytest.raises(demo.BrokerUnreachable, match="rabbitmq-server -detached"):
            demo.choose_backend(requested, broker, default=nowhere)
    assert demo.choose_backend("sqlite", nowhere, default=nowhere) == "sqlite"


@pytest.mark.exclusive  # the demo's runs, held to its wall-clock bounds: not beside other tests
@pytest.mark.timeout(240)
def test_schedulers_embedded_in_two_workers(broker_url: str) -> None:
    assert_exactly_once(demo.run(beats=2, duration=20, embedded=True))


@pytest.mark.exclusive  # the demo's runs, held to its wall-clock bounds: not beside other tests
@pytest.mark.timeout(240)
def test_the_demo_command(broker_url: str) -> None:
    done = subprocess.run(
        [sys.executable, str(demo.HERE / "demo.py"), "--beats", "2", "--duration", "12"],
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # stdout: the table and its summary, nothing else.
    assert done.stdout.startswith("job "), done.stdout
    assert "0 duplicated, 0 missed" in done.stdout
    assert "demo:" not in done.stdout
    # stderr: what it is doing, as it does it.
    progress = done.stderr.splitlines()
    for expected in ("demo: worker ready", "demo: beat-1 ready", "demo: beat-2 ready", "demo: stopping the worker"):
        assert expected in progress, done.stderr
    ticks = [line for line in progress if TICK.fullmatch(line)]
    assert len(ticks) == 3, done.stderr  # at 5, 10 and 12 s
    assert "Traceback" not in done.stderr


@pytest.mark.timeout(90)
def test_the_demo_command_without_a_broker_says_so_in_one_line() -> None:
    url = f"amqp://guest:s3cret@127.0.0.1:{free_port()}//"
    done = subprocess.run(
        [sys.executable, str(demo.HERE / "demo.py")],
        env=dict(os.environ, ANARCHON_DEMO_BROKER=url),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert "ANARCHON_DEMO_BROKER" in line and "rabbitmq-server -detached" in line
    assert url.replace("s3cret", "**") in line
    assert "s3cret" not in line and "Traceback" not in line


@pytest.mark.timeout(120)
def test_a_beat_that_does_not_start_is_reported_with_its_kept_log(
    broker_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    start_celery = demo.start_celery

    def start_a_broken_beat(args: list[str], *rest: Any, **options: Any) -> subprocess.Popen[bytes]:
        return start_celery([*args, "--no-such-option"] if args[0] == "beat" else args, *rest, **options)

    monkeypatch.setattr(demo, "start_celery", start_a_broken_beat)
    assert demo.main(["--beats", "1", "--duration", "5"]) == 2
    err = capsys.readouterr().err
    assert "demo: beat-1 exited (status 2) before it was ready" in err, err
    assert "no such option" in err.lower() and "Traceback" not in err
    log = err.split("the end of its log (", 1)[1].split("):", 1)[0]
    assert log.endswith("beat-1.log") and os.path.exists(log), err
    shutil.rmtree(os.path.dirname(log))
