"""The worker's check of a run's lease (anarchon_celery.worker.start_check), on a SQLite file, with Celery's
own request objects: which task messages start, and how a refused one is stopped."""

from __future__ import annotations

import os
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import Ignore

from anarchon_celery import Claim, Outcome, SQLiteBackend
from anarchon_celery.backends.base import Start
from anarchon_celery.worker import start_check as fencing


@pytest.fixture
def app(tmp_path: Path) -> Celery:
    app = Celery(f"fencing-{uuid.uuid4().hex[:6]}", broker="memory://", set_as_current=False)
    app.conf.update(anarchon_backend=f"sqlite:///{tmp_path / 'runs.db'}", anarchon_prefix="f.")

    @app.task(name="fencing.work", shared=False)
    def work() -> str:
        return "done"

    return app


def request(token: Any, *, slot: int = 1000, redelivered: bool = False, retries: int = 0) -> dict[str, Any]:
    """A task request as a worker gives it: a message's own headers are attributes of it."""
    fields: dict[str, Any] = {"anarchon_job": "j", "anarchon_slot": slot, "anarchon_run": "r"}
    if token is not None:
        fields["anarchon_token"] = token
    return {"id": str(uuid.uuid4()), "delivery_info": {"redelivered": redelivered}, "retries": retries, **fields}


def checked(app: Celery, req: dict[str, Any]) -> bool:
    task = app.tasks["fencing.work"]
    task.push_request(req)
    try:
        return fencing.check(task)
    finally:
        task.pop_request()


def test_a_run_starts_once_with_its_current_token(app: Celery, tmp_path: Path) -> None:
    store = SQLiteBackend(tmp_path / "runs.db", prefix="f.", lease_ms=100)
    assert store.claim([Claim("j", 1000)], "a") == [Outcome.WON]
    assert checked(app, request(1)) is True
    assert checked(app, request(1)) is False  # a second message of the same token
    assert checked(app, request(1, redelivered=True)) is True  # its worker died: delivered again
    assert checked(app, request(1, retries=1)) is True  # the task's own retry
    assert checked(app, request(1, slot=2000)) is True  # a run the store does not know
    assert checked(app, request(None)) is True  # not sent on a backend with leases
    store.close()


def test_a_refused_task_is_ignored_before_it_runs(app: Celery, tmp_path: Path) -> None:
    store = SQLiteBackend(tmp_path / "runs.db", prefix="f.", lease_ms=100)
    store.claim([Claim("j", 1000)], "a")
    time.sleep(0.15)  # its lease runs out
    assert store.take_over([Claim("j", 1000)], "b")[0].value == 2
    task = app.tasks["fencing.work"]
    fencing.install(app)
    assert getattr(type(task).before_start, "__anarchon_gate__", False)
    assert fencing.install(app) == 0  # once
    late = request(1)  # the first winner's message, after the takeover
    task.push_request(late)
    try:
        assert fencing.check(task) is False
        with pytest.raises(Ignore):
            task.before_start(late["id"], (), {})
    finally:
        task.pop_request()
    current = request(2)
    task.push_request(current)
    try:
        assert fencing.check(task) is True
        assert task.before_start(current["id"], (), {}) is None
    finally:
        task.pop_request()
    store.close()


def test_a_backend_without_leases_checks_nothing(tmp_path: Path) -> None:
    app = Celery(f"fencing-{uuid.uuid4().hex[:6]}", broker="memory://", set_as_current=False)
    app.conf.update(anarchon_backend="memory://", anarchon_prefix="f.")

    @app.task(name="fencing.work", shared=False)
    def work() -> str:
        return "done"

    assert checked(app, request(1)) is True
    assert checked(app, request(1)) is True


def test_a_start_whose_answer_was_lost_is_run(app: Celery, tmp_path: Path) -> None:
    """The store marked the run started, and the answer was lost: asked again, it is this very
    message's start, and the task runs (at least once, never lost)."""

    class LosesTheFirstAnswer(SQLiteBackend):
        lost = False

        def _start(self, job: str, slot: int, token: int, redelivered: bool, *args: Any) -> Start:
            allowed = super()._start(job, slot, token, redelivered, *args)
            if not self.lost:
                self.lost = True
                raise sqlite3.OperationalError("the answer was lost")
            return allowed

    store = LosesTheFirstAnswer(tmp_path / "runs.db", prefix="f.")
    store.claim([Claim("j", 1000)], "a")
    fencing._backends[os.getpid(), id(app)] = store
    assert checked(app, request(1)) is True
    assert store.run_record("j", 1000).state == "started"  # type: ignore[union-attr]
    assert checked(app, request(1)) is False  # a second message: not run
    store.close()


def test_a_worker_that_lacks_some_jobs_tasks_still_checks(app: Celery, tmp_path: Path) -> None:
    """Workers often import only their own tasks: the check needs the backend, not every job."""
    app.conf.beat_schedule = {"elsewhere": {"task": "other.service.task", "schedule": 60}}
    store = SQLiteBackend(tmp_path / "runs.db", prefix="f.")
    store.claim([Claim("j", 1000)], "a")
    assert checked(app, request(1)) is True
    assert checked(app, request(1)) is False
    store.close()


def test_a_worker_that_lacks_some_jobs_tasks_still_keeps_history(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """History needs the backend and the settings only: a job whose task this worker does not
    have is said once, and the events are written with the deployment's history_size."""
    from anarchon_celery.history import encode_event
    from anarchon_celery.worker import history as signals

    app = Celery(f"fencing-{uuid.uuid4().hex[:6]}", broker="memory://", set_as_current=False)
    app.conf.update(
        anarchon_backend=f"sqlite:///{tmp_path / 'runs.db'}",
        anarchon_prefix="f.",
        anarchon_history_size=3,
        beat_schedule={"elsewhere": {"task": "other.service.task", "schedule": 60}},
    )
    writer = signals._Writer(app)
    try:
        assert "cannot all be read in this worker" in caplog.text
        assert writer.history_size("elsewhere") == 3
        writer.put("elsewhere", encode_event("running", run="r", job="elsewhere", at_ms=1, worker="w"), 3)
        assert writer.flush(10) == 0
    finally:
        writer.close(10)
    store = SQLiteBackend(tmp_path / "runs.db", prefix="f.")
    assert [event["event"] for event in store.read_history(["elsewhere"])["elsewhere"]] == ["running"]
    store.close()
