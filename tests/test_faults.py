"""Faults around real `celery beat` processes: a stop signal in the middle of a claim, a broker
that is not there yet at start. The broker side goes through a TCP proxy the test controls."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from demo import start_celery
from kombu import Connection, Exchange, Queue

from .proxy import Proxy, free_port

ROOT = Path(__file__).resolve().parent.parent
APP = "tests.history_app"

pytestmark = [pytest.mark.broker, pytest.mark.processes]


@pytest.fixture
def beat_env(prefix: str, broker_url: str) -> Iterator[dict[str, str]]:
    with Connection(broker_url) as conn:  # the task queue, as a worker would declare it
        Queue(f"{prefix}tasks", Exchange(f"{prefix}tasks"), f"{prefix}tasks")(conn.default_channel).declare()
    yield dict(os.environ, PYTHONPATH=str(ROOT), HISTORY_APP_PREFIX=prefix, HISTORY_APP_EVERY="2")


def start_beat(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    args = ["beat", "-S", "anarchon_celery.Scheduler", "-l", "debug", "--pidfile="]
    return start_celery(args, log, env, app=APP, cwd=ROOT)


def kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_for(log: Path, needle: str, proc: subprocess.Popen[bytes], timeout: float = 60, after: int = 0) -> int:
    """Wait until `needle` appears in the log after offset `after`; return the offset past it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        found = text.find(needle, after)
        if found >= 0:
            return found + len(needle)
        assert proc.poll() is None, f"beat exited early:\n{text[-3000:]}"
        time.sleep(0.05)
    raise AssertionError(f"no {needle!r} within {timeout}s:\n{log.read_text(errors='replace')[-3000:]}")


def sent_slots(broker_url: str, queue: str) -> list[int]:
    slots = []
    with Connection(broker_url) as conn:
        while (message := conn.default_channel.basic_get(queue, no_ack=True)) is not None:
            slots.append(message.headers["anarchon_slot"])
    return slots


@pytest.mark.timeout(120)
def test_sigterm_during_a_claim_finishes_it_and_sends_the_task(
    beat_env: dict[str, str], broker_url: str, prefix: str, tmp_path: Path
) -> None:
    proxy = Proxy()
    log = tmp_path / "beat.log"
    beat = start_beat(dict(beat_env, HISTORY_APP_BACKEND=proxy.url()), log)
    try:
        seen = wait_for(log, "anarchon: ready as", beat)
        seen = wait_for(log, "won, sent", beat, after=seen)  # claims work through the proxy
        proxy.stall()  # the next claim waits for the broker's answer...
        wait_for(log, "anarchon: claiming", beat, after=seen)
        beat.send_signal(signal.SIGTERM)  # ...while the stop signal arrives
        time.sleep(1)
        assert beat.poll() is None, "beat stopped in the middle of a claim"
        proxy.resume()
        assert beat.wait(30) == 0
        text = log.read_text(errors="replace")
        assert "anarchon: stopping, the runs in progress are done" in text
        last_won = int(text.rsplit("anarchon: job 'every' slot ", 1)[1].split(":", 1)[0])
        assert "won, sent" in text.rsplit("anarchon: job 'every' slot ", 1)[1]
        assert last_won in sent_slots(broker_url, f"{prefix}tasks")  # the run in progress was sent
    finally:
        kill(beat)
        proxy.close()


@pytest.mark.timeout(120)
def test_a_broker_missing_at_start_is_waited_for(
    beat_env: dict[str, str], broker_url: str, prefix: str, tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "beat.log"
    beat = start_beat(dict(beat_env, HISTORY_APP_BACKEND=f"amqp://guest:guest@127.0.0.1:{port}//"), log)
    proxy = None
    try:
        seen = wait_for(log, "runs are not claimed until it answers", beat)
        assert "guest:guest@" not in log.read_text()
        proxy = Proxy(port=port)  # the broker "comes back"
        wait_for(log, "won, sent", beat, after=seen)
        assert beat.poll() is None  # it never exited
        assert sent_slots(broker_url, f"{prefix}tasks")
    finally:
        kill(beat)
        if proxy is not None:
            proxy.close()
