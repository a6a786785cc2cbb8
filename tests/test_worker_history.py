"""The worker side of history, with real worker processes and the real RabbitMQ: revoked and
expired tasks, and the buffered writer (every event delivered, flushed at a clean stop, kept
through a connection cut and an outage of the history connection)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

import anarchon_celery
from anarchon_celery import RabbitMQBackend, Run
from anarchon_celery.history import encode_event, fold

from .apps import worker_app
from .support.proxy import Proxy

pytestmark = [pytest.mark.broker, pytest.mark.processes]

ROOT = Path(__file__).resolve().parent.parent
FINAL = ("succeeded", "failed", "revoked", "abandoned")


class Worker:
    """A ``celery worker`` of tests.apps.worker_app, started and ready."""

    def __init__(self, prefix: str, log: Path, *args: str, backend: str | None = None) -> None:
        self.node = f"{prefix}w@{uuid.uuid4().hex[:6]}"
        self.log = log
        env = dict(os.environ, WORKER_APP_PREFIX=prefix, WORKER_APP_BROKER=worker_app.BROKER)
        if backend:
            env["WORKER_APP_BACKEND"] = backend
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.apps.worker_app",
            "worker",
            "-l",
            "info",
            "-n",
            self.node,
        ]
        command += ["--without-mingle", "--without-gossip", "--without-heartbeat", *args]
        self.proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.wait_for_line("ready.")

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for_line(self, needle: str, timeout: float = 60) -> None:
        wait_until(lambda: needle in self.text() or self.proc.poll() is not None, timeout, f"{needle!r} in the log")
        assert self.proc.poll() is None or needle in self.text(), f"the worker exited:\n{self.text()[-3000:]}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@contextlib.contextmanager
def worker(prefix: str, tmp_path: Path, *args: str, backend: str | None = None) -> Iterator[Worker]:
    w = Worker(prefix, tmp_path / f"worker-{uuid.uuid4().hex[:6]}.log", *args, backend=backend)
    try:
        yield w
    finally:
        w.kill()


def wait_until(done: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``done`` until it returns something true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (result := done()):
        assert time.monotonic() < deadline, f"no {what} within {timeout}s"
        time.sleep(0.3)
    return result


def send_runs(
    app: Celery,
    broker_url: str,
    prefix: str,
    job: str,
    count: int = 0,
    args: Sequence[Any] = (),
    ids: Sequence[str] = (),
    **send_options: Any,
) -> list[str]:
    """Runs of ``job`` (``count`` new ones, or those of run ids ``ids``) sent as the scheduler sends
    them (run id as task id, the run headers), each with its ``sent`` event; their run ids."""
    spec = app.conf.beat_schedule[job]
    runs = list(ids) or [str(uuid.uuid4()) for _ in range(count)]
    sent = []
    with app.producer_or_acquire() as producer:
        for n, run in enumerate(runs):
            headers = {"anarchon_job": job, "anarchon_slot": n, "anarchon_run": run, "anarchon_trigger": "manual"}
            options = dict(spec.get("options", {}), **send_options, task_id=run, headers=headers, producer=producer)
            app.send_task(spec["task"], args=list(args), **options)
            event = encode_event(
                "sent", run=run, job=job, at_ms=int(time.time() * 1000), slot=n, task_id=run, task=spec["task"]
            )
            sent.append((job, event, 2000))
    backend = RabbitMQBackend(broker_url, prefix=prefix)
    try:
        assert backend.record_many(sent) == len(sent)
    finally:
        backend.close()
    return runs


def read_events(broker_url: str, prefix: str, job: str) -> list[dict[str, Any]]:
    backend = RabbitMQBackend(broker_url, prefix=prefix)
    try:
        return backend.read_history([job])[job]
    finally:
        backend.close()


def wait_for_events(
    broker_url: str, prefix: str, job: str, expected: set[tuple[str, str]], timeout: float = 120
) -> list[dict[str, Any]]:
    """The job's events once every ``(run, event)`` expected is among them."""

    def complete() -> list[dict[str, Any]] | None:
        events = read_events(broker_url, prefix, job)
        return events if expected <= {(e["run"], e["event"]) for e in events} else None

    return wait_until(complete, timeout, f"{len(expected)} events of job {job!r}")  # type: ignore[no-any-return]


def wait_for_run(app: Celery, job: str, run_id: str, statuses: Sequence[str] = FINAL, timeout: float = 60) -> Run:
    """The run, read back with anarchon_celery.history(), once its status is one of ``statuses``."""

    def reached() -> Run | None:
        runs = {run.run_id: run for run in anarchon_celery.history(app, job)}
        run = runs.get(run_id)
        return run if run is not None and run.status in statuses else None

    return wait_until(reached, timeout, f"run {run_id} of {job!r} in {statuses}")  # type: ignore[no-any-return]


def all_events(runs: Sequence[str], kinds: Sequence[str] = ("sent", "running", "succeeded")) -> set[tuple[str, str]]:
    return {(run, kind) for run in runs for kind in kinds}


# -- revoked and expired ---------------------------------------------------------------------------


def test_a_task_revoked_before_a_worker_ran_it_is_a_revoked_run(broker_url: str, prefix: str, tmp_path: Path) -> None:
    app = worker_app.make_app(prefix)
    with worker(prefix, tmp_path, "--pool=threads", "--concurrency=2") as w:
        run_id = str(uuid.uuid4())
        # Revoked by id before it is sent: the worker knows it when the task arrives.
        replies = app.control.revoke(run_id, reply=True, timeout=10, destination=[w.node])
        assert replies and w.node in replies[0], replies
        send_runs(app, broker_url, prefix, "quick", ids=[run_id])
        (other,) = send_runs(app, broker_url, prefix, "quick", 1)  # not revoked: it runs
        run = wait_for_run(app, "quick", run_id)
        assert wait_for_run(app, "quick", other).status == "succeeded"
    assert (run.status, run.reason, run.worker, run.error) == ("revoked", "revoked", w.node, None), run
    assert run.finished_at_ms is not None and run.started_at_ms is None


def test_a_task_expired_when_a_worker_got_it_is_a_revoked_run_with_reason_expired(
    broker_url: str, prefix: str, tmp_path: Path
) -> None:
    app = worker_app.make_app(prefix)
    with worker(prefix, tmp_path, "--pool=solo") as w:
        manual = anarchon_celery.run_now(app, "expiring")  # its task's expires is in the past
        run = wait_for_run(app, "expiring", manual.run_id)
    assert (run.status, run.reason, run.worker, run.trigger) == ("revoked", "expired", w.node, "manual"), run
    assert run.sent_at_ms is not None and run.started_at_ms is None


def test_a_task_terminated_while_running_is_a_revoked_run_with_reason_terminated(
    broker_url: str, prefix: str, tmp_path: Path
) -> None:
    app = worker_app.make_app(prefix)
    with worker(prefix, tmp_path, "--pool=prefork", "--concurrency=1") as w:
        (run_id,) = send_runs(app, broker_url, prefix, "waiting", 1, args=[str(tmp_path / "never")])
        wait_for_run(app, "waiting", run_id, ["running"])
        replies = app.control.revoke(run_id, terminate=True, reply=True, timeout=10, destination=[w.node])
        assert replies and w.node in replies[0], replies
        run = wait_for_run(app, "waiting", run_id)  # written by the worker's main process
    assert (run.status, run.reason, run.error) == ("revoked", "terminated", "signal 15"), run
    assert run.started_at_ms is not None and run.finished_at_ms is not None


def _pool_processes(parent: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True, check=False).stdout
    return [int(pid) for pid in found.split()]


def test_a_run_whose_pool_process_died_is_abandoned_with_the_worker_named(
    broker_url: str, prefix: str, tmp_path: Path
) -> None:
    """The pool process running a run's task is SIGKILLed: the worker's main process records the
    run abandoned (it stayed running before), naming the worker, and the worker goes on."""
    app = worker_app.make_app(prefix)
    with worker(prefix, tmp_path, "--pool=prefork", "--concurrency=1") as w:
        (run_id,) = send_runs(app, broker_url, prefix, "waiting", 1, args=[str(tmp_path / "never")])
        wait_for_run(app, "waiting", run_id, ["running"])
        (child,) = _pool_processes(w.proc.pid)
        os.kill(child, signal.SIGKILL)
        run = wait_for_run(app, "waiting", run_id)
        (after,) = send_runs(app, broker_url, prefix, "quick", 1)  # a new pool process runs the next
        assert wait_for_run(app, "quick", after).status == "succeeded"
    assert (run.status, run.error_type, run.worker) == ("abandoned", "WorkerLostError", w.node), run
    assert "signal 9" in (run.error or ""), run.error
    assert run.started_at_ms is not None and run.finished_at_ms is not None


def test_a_run_killed_at_its_hard_time_limit_failed(broker_url: str, prefix: str, tmp_path: Path) -> None:
    """Killed by the worker at its time limit, a task's pool process cannot say so: the main process
    records the run failed (it stayed running before)."""
    app = worker_app.make_app(prefix)
    with worker(prefix, tmp_path, "--pool=prefork", "--concurrency=1"):
        (run_id,) = send_runs(app, broker_url, prefix, "waiting", 1, args=[str(tmp_path / "never")], time_limit=2)
        run = wait_for_run(app, "waiting", run_id)
    assert (run.status, run.error_type) == ("failed", "TimeLimitExceeded"), run


# -- the buffered writer ---------------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_every_event_of_many_tasks_on_a_threads_pool_is_written(broker_url: str, prefix: str, tmp_path: Path) -> None:
    app = worker_app.make_app(prefix)
    with worker(prefix, tmp_path, "--pool=threads", "--concurrency=16") as w:
        runs = send_runs(app, broker_url, prefix, "quick", 1000)
        events = wait_for_events(broker_url, prefix, "quick", all_events(runs))
        log = w.text()
    kinds = Counter((e["run"], e["event"]) for e in events)
    assert set(kinds) == all_events(runs)  # nothing else
    assert Counter(run.status for run in fold(events)) == {"succeeded": 1000}
    assert {run.worker for run in fold(events)} == {w.node}
    assert [line for line in log.splitlines() if "anarchon" in line and ("WARNING" in line or "ERROR" in line)] == []


@pytest.mark.parametrize("pool, concurrency, processes", [("threads", 16, 1), ("prefork", 3, 3)])
def test_a_clean_stop_writes_the_events_still_waiting(
    broker_url: str, prefix: str, tmp_path: Path, pool: str, concurrency: int, processes: int
) -> None:
    # History goes through a proxy, closed while the tasks finish: their events can only be
    # written by the flush at the stop (of each prefork child), once the proxy is back.
    proxy = Proxy()
    port = proxy.port
    app = worker_app.make_app(prefix)
    release = tmp_path / "release"
    args = [f"--pool={pool}", f"--concurrency={concurrency}"]
    try:
        with worker(prefix, tmp_path, *args, backend=proxy.url()) as w:
            runs = send_runs(app, broker_url, prefix, "waiting", concurrency, args=[str(release)])
            wait_for_events(broker_url, prefix, "waiting", all_events(runs, ("sent", "running")))
            proxy.close()
            w.proc.send_signal(signal.SIGTERM)  # a warm shutdown: the running tasks finish first
            w.wait_for_line("Warm shutdown")
            release.touch()  # now they end, and their succeeded events wait in the buffer
            # Every process that ran a task (the worker, or each prefork child) stops with one
            # event waiting; RabbitMQ comes back once they all wait on it.
            wait_until(lambda: w.text().count("history event(s) to write before stopping") == processes, 60, "flushes")
            proxy = Proxy(port=port)
            assert w.proc.wait(60) == 0
    finally:
        proxy.close()
    events = read_events(broker_url, prefix, "waiting")  # once the worker is gone
    assert {(e["run"], e["event"]) for e in events} == all_events(runs)
    written = re.findall(r"anarchon: (\d+) history event\(s\) written at shutdown", w.text())
    assert sum(map(int, written)) == concurrency, written
    assert "not written at shutdown" not in w.text()


@pytest.mark.timeout(300)
def test_no_event_is_lost_through_connection_cuts_and_an_outage(broker_url: str, prefix: str, tmp_path: Path) -> None:
    # The worker writes its history through a proxy (its tasks come straight from RabbitMQ), so
    # that only that connection is cut, then refused for a while.
    proxy = Proxy()
    port = proxy.port
    app = worker_app.make_app(prefix)
    runs: list[str] = []
    try:
        with worker(prefix, tmp_path, "--pool=threads", "--concurrency=8", backend=proxy.url()) as w:
            runs += send_runs(app, broker_url, prefix, "quick", 50)
            wait_for_events(broker_url, prefix, "quick", all_events(runs))  # connected, and writing
            for _ in range(3):  # cuts while events are being written
                runs += send_runs(app, broker_url, prefix, "quick", 100)
                proxy.cut()
                time.sleep(0.2)
                proxy.cut()
            proxy.close()  # RabbitMQ unreachable for the history while tasks go on running
            late = send_runs(app, broker_url, prefix, "quick", 100)
            runs += late
            for run in late:  # each one ran (the worker logs it) while its events could not be written
                w.wait_for_line(f"[{run}] succeeded")
            w.wait_for_line("not written yet; they are kept and tried again")
            proxy = Proxy(port=port)  # back
            events = wait_for_events(broker_url, prefix, "quick", all_events(runs), timeout=180)
            log = w.text()
    finally:
        proxy.close()
    assert {(e["run"], e["event"]) for e in events} == all_events(runs)
    assert Counter(run.status for run in fold(events)) == {"succeeded": len(runs)}
    assert "dropped" not in log and "event of task" not in log, log[-3000:]  # none given up
