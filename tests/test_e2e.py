"""End to end: real `celery beat` processes and real workers on the real RabbitMQ.

The runs are counted by their deterministic task ids, as executed by the worker; see
examples/demo.py, which these tests drive.
"""

from __future__ import annotations

import subprocess
import sys

import demo
import pytest

pytestmark = [pytest.mark.broker, pytest.mark.processes]


def assert_exactly_once(result: dict) -> None:
    assert result["expected"] >= 10, result
    assert result["missed"] == 0, [r for r in result["runs"] if r["executed"] == 0]
    assert result["duplicates"] == 0, [r for r in result["runs"] if r["executed"] > 1]
    assert result["duplicate_executions_total"] == 0
    assert result["executed"] == result["expected"]
    assert not result["password_in_logs"]
    for run in result["runs"]:
        assert len(run["winners"]) == 1, run  # one instance won each run, and said so


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
        ["ok", "streams"],
    ]
    assert "fails" in result["cli"]["jobs"] and "failed" in result["cli"]["jobs"]
    assert "RuntimeError: this job fails on purpose" in result["cli"]["history"]


@pytest.mark.timeout(240)
def test_schedulers_embedded_in_two_workers(broker_url: str) -> None:
    assert_exactly_once(demo.run(beats=2, duration=20, embedded=True))


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
    assert "0 duplicated, 0 missed" in done.stdout
