"""Sending won runs' tasks, many at once, against the real RabbitMQ (through a TCP proxy where
the connection must fail at a chosen point)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from amqp.exceptions import MessageNacked
from celery import Celery
from celery.signals import before_task_publish
from kombu import Connection, Exchange, Queue

from anarchon_celery import clock
from anarchon_celery.jobs import make_job
from anarchon_celery.sending import Outgoing, TaskSender, task_connection
from anarchon_celery.settings import Settings

from .support.proxy import Proxy

pytestmark = pytest.mark.broker


@pytest.fixture
def proxy(broker_url: str) -> Iterator[Proxy]:
    p = Proxy()
    yield p
    p.close()


def make_app(url: str, prefix: str) -> Celery:
    app = Celery(f"send{uuid.uuid4().hex[:6]}", broker=url, set_as_current=False)
    # The prefix also names the history an eager run writes to from the worker signals.
    app.conf.update(task_default_queue=f"{prefix}tasks", anarchon_prefix=prefix)

    @app.task(name="tasks.work", shared=False)
    def work(*args: Any) -> None: ...

    return app


def runs(app: Celery, count: int, deadline_ms: int) -> list[Outgoing]:
    job = make_job("job", {"task": "tasks.work", "schedule": 60.0}, Settings(), app.timezone)
    return [Outgoing(job, n, f"task-{n:03d}", f"task-{n:03d}", "schedule", deadline_ms) for n in range(count)]


def queued(broker_url: str, queue: str) -> list[str]:
    ids = []
    with Connection(broker_url) as conn:
        while (message := conn.default_channel.basic_get(queue, no_ack=True)) is not None:
            ids.append(message.headers["id"])
    return ids


@contextlib.contextmanager
def publishing() -> Iterator[list[str]]:
    """The task ids Celery publishes meanwhile, in order."""
    ids: list[str] = []

    def note(headers: Any = None, **_: Any) -> None:
        ids.append(headers["id"])

    before_task_publish.connect(note, weak=False)
    try:
        yield ids
    finally:
        before_task_publish.disconnect(note)


def full_task_queue(app: Celery, broker_url: str, prefix: str) -> str:
    """A task queue that holds one message and refuses the next (reject-publish), declared with the
    same arguments as the app's, since Celery declares it before publishing."""
    name = f"{prefix}tasks"
    full = Queue(name, Exchange(name), name, queue_arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    app.conf.task_queues = [full]
    with Connection(broker_url) as conn:
        full(conn.default_channel).declare()
    return name


@pytest.fixture
def task_queue(broker_url: str, prefix: str) -> str:
    name = f"{prefix}tasks"
    with Connection(broker_url) as conn:
        Queue(name, Exchange(name), name)(conn.default_channel).declare()
    return name


def test_many_runs_are_sent_at_once_and_confirmed(broker_url: str, prefix: str, task_queue: str) -> None:
    app = make_app(broker_url, prefix)
    with task_connection(app) as connection:
        sender = TaskSender(app, connection)
        assert sender.send(runs(app, 300, clock.now_ms() + 10_000)) == [None] * 300
        assert sender.send(runs(app, 3, clock.now_ms() + 10_000)) == [None] * 3  # the channel is kept
    assert sorted(queued(broker_url, task_queue)) == sorted(
        [f"task-{n:03d}" for n in range(300)] + ["task-000", "task-001", "task-002"]
    )


def test_runs_written_as_they_are_won_are_confirmed_by_send(broker_url: str, prefix: str, task_queue: str) -> None:
    app = make_app(broker_url, prefix)
    with publishing() as written, task_connection(app) as connection:
        sender = TaskSender(app, connection)
        first = runs(app, 5, clock.now_ms() + 10_000)
        for run in first:
            sender.write(run)  # not connected yet: nothing written, send() does it
        assert written == []
        assert sender.send(first) == [None] * 5
        later = [run._replace(task_id=f"later-{n}") for n, run in enumerate(first)]
        for run in later[:3]:
            sender.write(run)  # connected now: written at once
        assert written[5:] == ["later-0", "later-1", "later-2"]
        assert sender.send(later) == [None] * 5  # the first three confirmed, the other two sent
        assert written[5:] == [f"later-{n}" for n in range(5)]  # each written once
        sender.write(first[0])
        with pytest.raises(ValueError, match="the runs written, in the order written"):
            sender.send(later)
    assert sorted(queued(broker_url, task_queue)) == sorted(
        [f"task-{n:03d}" for n in range(5)] + [f"later-{n}" for n in range(5)] + ["task-000"]
    )


def test_a_run_written_early_and_refused_is_sent_again_then_fails(broker_url: str, prefix: str) -> None:
    app = make_app(broker_url, prefix)
    name = full_task_queue(app, broker_url, prefix)
    with publishing() as published, task_connection(app) as connection:
        sender = TaskSender(app, connection)
        connection.ensure_connection()
        two = runs(app, 2, clock.now_ms() + 1_200)
        for run in two:
            sender.write(run)
        results = sender.send(two)
    assert results[0] is None
    assert isinstance(results[1], MessageNacked), results[1]
    assert published.count("task-001") >= 2  # refused: certainly not queued, so tried again
    assert queued(broker_url, name) == ["task-000"]


def test_a_connection_lost_in_the_middle_never_sends_a_task_twice(
    proxy: Proxy, broker_url: str, prefix: str, task_queue: str
) -> None:
    app = make_app(proxy.url(), prefix)
    published = []

    def cut_at_the_fortieth(sender: Any = None, headers: Any = None, **kwargs: Any) -> None:
        published.append(headers["id"])
        if len(published) == 40:
            proxy.cut()  # before this task's message is written
            time.sleep(0.3)  # the close reaches the client: py-amqp notices it before writing

    before_task_publish.connect(cut_at_the_fortieth, weak=False)
    try:
        with task_connection(app) as connection:
            results = TaskSender(app, connection).send(runs(app, 100, clock.now_ms() + 20_000))
    finally:
        before_task_publish.disconnect(cut_at_the_fortieth)
    # Written before the cut was noticed and not confirmed: their fate is unknown, so they are
    # reported failed and never sent again (py-amqp notices the close before the next write, unless
    # it reads a pending confirm first). Not written yet: sent on a new connection.
    failed = [n for n, error in enumerate(results) if error is not None]
    assert failed == list(range(failed[0], failed[-1] + 1)) if failed else True
    assert results[80:] == [None] * 20
    counted = Counter(queued(broker_url, task_queue))
    assert max(counted.values()) == 1, "a task was sent twice"
    assert {f"task-{n:03d}" for n, error in enumerate(results) if error is None} <= set(counted)


def test_confirms_are_matched_to_runs_when_celery_publishes_more_than_the_tasks(broker_url: str, prefix: str) -> None:
    # With task_send_sent_event, every task is followed by a task-sent event on the same channel:
    # each message takes a delivery tag, and the answer of a run is its own message's. The task
    # queue holds one message and refuses the next, so the second run's task is nacked while the
    # event written after the first is acked.
    app = make_app(broker_url, prefix)
    app.conf.task_send_sent_event = True
    app.conf.event_exchange = f"{prefix}events"
    name = full_task_queue(app, broker_url, prefix)
    with task_connection(app) as connection:
        results = TaskSender(app, connection).send(runs(app, 2, clock.now_ms() + 1_500))
    assert results[0] is None
    assert isinstance(results[1], MessageNacked), results[1]
    assert queued(broker_url, name) == ["task-000"]


def test_eager_tasks_run_here_and_count_as_sent(broker_url: str, prefix: str) -> None:
    app = make_app(broker_url, prefix)
    app.conf.task_always_eager = True
    done = []

    @app.task(name="tasks.eager", shared=False)
    def eager(*args: Any) -> None:
        done.append(args)

    job = make_job("job", {"task": "tasks.eager", "schedule": 60.0, "args": [7]}, Settings(), app.timezone)
    with task_connection(app) as connection:
        results = TaskSender(app, connection).send([Outgoing(job, 1, "t-1", "t-1", "schedule", clock.now_ms() + 5_000)])
    assert results == [None]
    assert done == [(7,)]


def test_a_run_whose_queue_the_broker_refuses_fails_with_that_error_and_the_others_are_sent(
    broker_url: str, prefix: str, task_queue: str
) -> None:
    # Celery declares a task's queue before publishing; here the broker refuses that declare every
    # time (the queue exists with another x-max-priority): that run fails with the broker's error,
    # after one more try, and the runs after it go out on a new channel.
    app = make_app(broker_url, prefix)
    bad = f"{prefix}bad"
    with Connection(broker_url) as conn:
        Queue(bad, Exchange(bad), bad, queue_arguments={"x-max-priority": 5})(conn.default_channel).declare()
    app.conf.task_queues = [
        Queue(task_queue, Exchange(task_queue), task_queue),
        Queue(bad, Exchange(bad), bad, queue_arguments={"x-max-priority": 10}),
    ]
    good = runs(app, 3, clock.now_ms() + 20_000)
    job = dataclasses.replace(good[0].job, options={"queue": bad})
    refused = good[0]._replace(job=job, task_id="bad-0", run_id="bad-0")
    with task_connection(app) as connection:
        results = TaskSender(app, connection).send([refused, *good])
    assert "PRECONDITION_FAILED" in str(results[0]), results[0]
    assert results[1:] == [None] * 3
    assert sorted(queued(broker_url, task_queue)) == ["task-000", "task-001", "task-002"]
