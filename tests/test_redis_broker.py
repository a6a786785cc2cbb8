"""Tasks sent over a Redis broker while the runs are claimed in RabbitMQ: real beat and worker
processes, then TaskSender and keep_alive in process, against the real Redis and RabbitMQ.

Redis has no publisher confirms: a task counts as sent once its publish call returned."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from celery import Celery
from celery.exceptions import QueueNotFound
from kombu import Connection, Consumer, Exchange, Queue
from kombu.exceptions import EncodeError

from anarchon_celery import clock, run_now
from anarchon_celery.connections import keep_alive, negotiated_heartbeat
from anarchon_celery.jobs import make_job
from anarchon_celery.sending import Outgoing, TaskSender, has_publisher_confirms, task_connection
from anarchon_celery.settings import Settings

from .support.processes import start_celery
from .support.proxy import Proxy, free_port
from .support.stores import delete_redis_keys
from .test_faults import Fleet, kill, wait_for

ROOT = Path(__file__).resolve().parent.parent
APP = "tests.apps.redis_app"
SENT = re.compile(r"job 'every' slot (\d+): won, sent redis_app\.record\[([0-9a-f-]+)\]")

pytestmark = pytest.mark.broker


def redis_messages(redis_url: str, key: str) -> list[dict[str, Any]]:
    """The messages kombu queued in the Redis list ``key``, oldest first, left in place."""
    import redis  # here: without redis-py the redis_url fixture skips (or fails under CI)

    client = redis.Redis.from_url(redis_url)
    try:
        return [json.loads(raw) for raw in reversed(client.lrange(key, 0, -1))]
    finally:
        client.close()


# -- real processes -----------------------------------------------------------------------------


@pytest.mark.processes
@pytest.mark.timeout(90)
@pytest.mark.parametrize("claims", ["rabbitmq", "redis"])
def test_beats_on_a_redis_broker_send_each_run_once_and_the_worker_runs_it(
    claims: str, redis_url: str, redis_prefix: str, broker_url: str, prefix: str, tmp_path: Path
) -> None:
    """The runs claimed in RabbitMQ, or, with no anarchon_backend set, in the app's broker: Redis."""
    executed = tmp_path / "executed.jsonl"
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        REDIS_APP_BROKER=redis_url,
        REDIS_APP_KEYPREFIX=redis_prefix,
        REDIS_APP_PREFIX=prefix,
        REDIS_APP_BACKEND=broker_url if claims == "rabbitmq" else "app-broker",
        REDIS_APP_LOG=str(executed),
    )
    worker_log = tmp_path / "worker.log"
    worker_args = ["worker", "-P", "solo", "-l", "info", "--without-gossip", "--without-mingle", "--without-heartbeat"]
    worker = start_celery([*worker_args, "-n", f"{prefix}w@%h"], worker_log, env, app=APP, cwd=ROOT)
    fleet = None
    try:
        wait_for(worker_log, " ready.", worker)
        fleet = Fleet(tmp_path, [env, env], app=APP)  # two beats race for every run
        fleet.wait_ready()
        fleet.wait_any(": won")
        time.sleep(5)
        fleet.stop()
        logs = [fleet.text(n) for n in range(2)]
        for text in logs:
            assert "won, but sending" not in text, text[text.find("won, but sending") - 200 :][:3000]
            assert [line for line in text.splitlines() if "anarchon" in line and "failed" in line] == []
        sent = [match.groups() for text in logs for match in SENT.finditer(text)]
        assert len(sent) >= 4, logs[0][-3000:]
        slots = Counter(slot for slot, _ in sent)
        assert [slot for slot, n in slots.items() if n > 1] == [], "a run sent by two beats"
        deadline = time.monotonic() + 30  # the worker runs what is still queued
        while time.monotonic() < deadline:
            lines = executed.read_text().splitlines() if executed.exists() else []
            if len(lines) >= len(sent):
                break
            assert worker.poll() is None, worker_log.read_text()[-3000:]
            time.sleep(0.2)
        time.sleep(0.5)  # nothing more comes: each run once
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker_log.read_text()[-3000:]
    finally:
        if fleet is not None:
            fleet.kill()
        kill(worker)
        delete_redis_keys(redis_url, prefix)  # the claims' keys, when they were in Redis
    if claims == "redis":
        assert "anarchon: ready as" in fleet.text(0) and "Redis at redis://127.0.0.1:6379/5" in fleet.text(0)
    runs = [json.loads(line) for line in executed.read_text().splitlines()]
    assert sorted(run["task_id"] for run in runs) == sorted(task_id for _, task_id in sent), "each run executed once"
    by_id = {task_id: int(slot) for slot, task_id in sent}
    for run in runs:
        assert run["args"] == ["x"]
        assert run["anarchon_job"] == "every"
        assert run["anarchon_slot"] == by_id[run["task_id"]]
        assert run["anarchon_run"] == run["task_id"]
        assert run["anarchon_trigger"] == "schedule"
    assert redis_messages(redis_url, f"{redis_prefix}{prefix}tasks") == []


# -- in process ---------------------------------------------------------------------------------


def make_app(url: str, keyprefix: str, queue: str = "tasks") -> Celery:
    app = Celery(f"redis{keyprefix}", broker=url, set_as_current=False)
    app.conf.update(
        broker_transport_options={"global_keyprefix": keyprefix},
        task_default_queue=f"{keyprefix}{queue}",
        anarchon_prefix=keyprefix,
    )

    @app.task(name="tasks.work", shared=False)
    def work(*args: Any) -> None: ...

    return app


def through(proxy_port: int, redis_url: str) -> str:
    """``redis_url`` (its database) through a proxy listening on ``proxy_port``."""
    return f"redis://127.0.0.1:{proxy_port}{urlsplit(redis_url).path}"


def redis_address(redis_url: str) -> tuple[str, int]:
    parts = urlsplit(redis_url)
    return parts.hostname or "127.0.0.1", parts.port or 6379


def queue_key(keyprefix: str) -> str:
    return f"{keyprefix}{keyprefix}tasks"  # kombu's global prefix, then the queue's name


def runs(app: Celery, count: int, deadline_ms: int, **entry: Any) -> list[Outgoing]:
    job = make_job("job", {"task": "tasks.work", "schedule": 60.0, **entry}, Settings(), app.timezone)
    return [Outgoing(job, n, f"task-{n:03d}", f"task-{n:03d}", "schedule", deadline_ms) for n in range(count)]


@pytest.fixture
def app(redis_url: str, redis_prefix: str) -> Celery:
    return make_app(redis_url, redis_prefix)


@pytest.mark.parametrize(
    "url, confirms",
    [
        ("amqp://guest:guest@127.0.0.1//", True),
        ("amqps://guest:guest@127.0.0.1//", True),
        ("pyamqp://guest:guest@127.0.0.1//", True),
        ("redis://127.0.0.1:6379/5", False),
        ("rediss://127.0.0.1:6379/5", False),
        ("sentinel://127.0.0.1:26379", False),
        ("memory://", False),
        ("filesystem://", False),
    ],
)
def test_publisher_confirms_are_used_on_py_amqp_transports_only(url: str, confirms: bool) -> None:
    with Connection(url) as connection:  # no I/O: only the transport is looked at
        assert has_publisher_confirms(connection) is confirms


def test_a_run_is_sent_over_redis_with_its_id_and_headers(app: Celery, redis_url: str, redis_prefix: str) -> None:
    with task_connection(app) as connection:
        results = TaskSender(app, connection).send(runs(app, 1, clock.now_ms() + 10_000, args=[7]))
    assert results == [None]
    [message] = redis_messages(redis_url, queue_key(redis_prefix))
    headers = message["headers"]
    assert headers["id"] == "task-000" and headers["task"] == "tasks.work"
    assert (headers["anarchon_job"], headers["anarchon_slot"]) == ("job", 0)
    assert (headers["anarchon_run"], headers["anarchon_trigger"]) == ("task-000", "schedule")


def test_many_runs_written_and_sent_over_redis_are_each_queued_once(
    app: Celery, redis_url: str, redis_prefix: str
) -> None:
    with task_connection(app) as connection:
        sender = TaskSender(app, connection)
        first = runs(app, 50, clock.now_ms() + 10_000)
        assert sender.send(first) == [None] * 50
        later = [run._replace(task_id=f"later-{n}") for n, run in enumerate(first[:5])]
        sender.open()
        for run in later[:3]:
            sender.write(run)  # as the scheduler does while claims are answered: published at once
        assert [m["headers"]["id"] for m in redis_messages(redis_url, queue_key(redis_prefix))][50:] == [
            "later-0",
            "later-1",
            "later-2",
        ]
        assert sender.send(later) == [None] * 5
    ids = [m["headers"]["id"] for m in redis_messages(redis_url, queue_key(redis_prefix))]
    assert ids == [run.task_id for run in first] + [run.task_id for run in later]


def test_a_run_whose_arguments_cannot_be_encoded_fails_and_the_others_are_sent(
    app: Celery, redis_url: str, redis_prefix: str
) -> None:
    good = runs(app, 3, clock.now_ms() + 10_000)
    job = dataclasses.replace(good[0].job, args=(object(),))
    bad = good[0]._replace(job=job, task_id="bad", run_id="bad")
    with task_connection(app) as connection:
        results = TaskSender(app, connection).send([good[0], bad, *good[1:]])
    assert results[0] is None and results[2:] == [None, None]
    assert isinstance(results[1], EncodeError), results[1]
    ids = [m["headers"]["id"] for m in redis_messages(redis_url, queue_key(redis_prefix))]
    assert ids == ["task-000", "task-001", "task-002"]


def test_a_redis_that_refuses_the_connection_gives_each_run_an_error(redis_prefix: str) -> None:
    app = make_app(f"redis://127.0.0.1:{free_port()}/5", redis_prefix)
    three = runs(app, 3, clock.now_ms() + 1_000)
    with task_connection(app) as connection:
        sender = TaskSender(app, connection)
        with pytest.raises(Exception):  # noqa: B017 - whatever the transport raises
            sender.open()
        sender.write(three[0])  # never raises
        results = sender.send(three)
    assert all(isinstance(error, Exception) for error in results), results
    assert "refused" in str(results[0]).lower(), results[0]


def test_a_redis_connection_cut_while_idle_is_replaced_and_nothing_is_sent_twice(
    redis_url: str, redis_prefix: str
) -> None:
    proxy = Proxy(target=redis_address(redis_url))
    try:
        app = make_app(through(proxy.port, redis_url), redis_prefix)
        with task_connection(app) as connection:
            sender = TaskSender(app, connection)
            assert sender.send(runs(app, 2, clock.now_ms() + 10_000)) == [None, None]
            proxy.cut()  # as a Redis restart does to its clients
            time.sleep(0.2)
            again = [run._replace(task_id=f"again-{run.slot}") for run in runs(app, 2, clock.now_ms() + 10_000)]
            assert sender.send(again) == [None, None]
    finally:
        proxy.close()
    ids = [m["headers"]["id"] for m in redis_messages(redis_url, queue_key(redis_prefix))]
    assert ids == ["task-000", "task-001", "again-0", "again-1"]


def test_a_redis_gone_between_sends_fails_those_runs_and_the_next_send_reconnects(
    redis_url: str, redis_prefix: str
) -> None:
    proxy = Proxy(target=redis_address(redis_url))
    port = proxy.port
    try:
        app = make_app(through(port, redis_url), redis_prefix)
        with task_connection(app) as connection:
            sender = TaskSender(app, connection)
            assert sender.send(runs(app, 1, clock.now_ms() + 10_000)) == [None]
            proxy.close()  # Redis goes away, while kombu holds the connection it made
            gone = [run._replace(task_id=f"gone-{run.slot}") for run in runs(app, 2, clock.now_ms() + 1_000)]
            sender.write(gone[0])  # never raises
            results = sender.send(gone)
            assert all(isinstance(error, Exception) for error in results), results
            proxy = Proxy(target=redis_address(redis_url), port=port)  # it is back
            back = [run._replace(task_id=f"back-{run.slot}") for run in runs(app, 2, clock.now_ms() + 10_000)]
            assert sender.send(back) == [None, None]
    finally:
        proxy.close()
    ids = [m["headers"]["id"] for m in redis_messages(redis_url, queue_key(redis_prefix))]
    assert ids == ["task-000", "back-0", "back-1"]


def test_a_run_for_a_queue_celery_does_not_know_fails_alone_and_the_connection_is_kept(
    app: Celery, redis_url: str, redis_prefix: str
) -> None:
    # kombu's Redis transport counts KeyError, which Celery's QueueNotFound is, as a connection error.
    app.conf.task_create_missing_queues = False
    good = runs(app, 2, clock.now_ms() + 10_000)
    job = dataclasses.replace(good[0].job, options={"queue": "nope"})
    unknown = good[0]._replace(job=job, task_id="unknown", run_id="unknown")
    with task_connection(app) as connection:
        sender = TaskSender(app, connection)
        sender.open()
        raw = connection.connection
        results = sender.send([unknown, *good])
        assert connection.connection is raw  # not dropped and made again: the run's own error
    assert isinstance(results[0], QueueNotFound), results[0]
    assert results[1:] == [None, None]
    ids = [m["headers"]["id"] for m in redis_messages(redis_url, queue_key(redis_prefix))]
    assert ids == ["task-000", "task-001"]


def test_run_now_sends_over_redis(redis_url: str, redis_prefix: str, broker_url: str, prefix: str) -> None:
    app = make_app(redis_url, redis_prefix)
    app.conf.update(
        anarchon_backend=broker_url,
        anarchon_prefix=prefix,
        anarchon_history_size=0,
        beat_schedule={"job": {"task": "tasks.work", "schedule": 3600, "args": [1]}},
    )
    manual = run_now(app, "job")
    [message] = redis_messages(redis_url, queue_key(redis_prefix))
    headers = message["headers"]
    assert headers["id"] == manual.task_id
    assert (headers["anarchon_job"], headers["anarchon_run"], headers["anarchon_trigger"]) == (
        "job",
        manual.run_id,
        "manual",
    )


def test_the_task_connection_to_redis_has_timeouts_and_never_sends_a_command_twice() -> None:
    app = Celery("options", broker="redis://127.0.0.1:6379/5", set_as_current=False)
    app.conf.broker_transport_options = {"socket_timeout": 3, "retry_on_timeout": True}
    with task_connection(app) as connection:  # no I/O
        options = connection.transport_options
    assert (options["socket_timeout"], options["socket_connect_timeout"], options["retry_on_timeout"]) == (3, 10, False)


@pytest.mark.parametrize("transport", ["memory", "filesystem"])
def test_runs_are_sent_over_other_virtual_transports(transport: str, tmp_path: Path) -> None:
    app = Celery(f"virtual{transport}", broker=f"{transport}://", set_as_current=False)
    if transport == "filesystem":
        app.conf.broker_transport_options = {  # everything in tmp_path: its control folder too
            "data_folder_in": str(tmp_path),
            "data_folder_out": str(tmp_path),
            "control_folder": str(tmp_path / "control"),
        }
    app.conf.task_default_queue = "tasks"

    @app.task(name="tasks.work", shared=False)
    def work(*args: Any) -> None: ...

    got: list[str] = []
    with task_connection(app) as connection:
        assert TaskSender(app, connection).send(runs(app, 3, clock.now_ms() + 10_000)) == [None] * 3
        queue = Queue("tasks", Exchange("tasks"), "tasks")
        with Consumer(connection, [queue], callbacks=[lambda body, message: got.append(message.headers["id"])]):
            for _ in range(3):
                connection.drain_events(timeout=5)
    assert sorted(got) == ["task-000", "task-001", "task-002"]  # the filesystem transport keeps no order


def test_keep_alive_on_a_redis_connection_neither_fails_nor_consumes(
    app: Celery, redis_url: str, redis_prefix: str
) -> None:
    with task_connection(app, heartbeat=60) as connection:
        assert TaskSender(app, connection).send(runs(app, 1, clock.now_ms() + 10_000)) == [None]
        queue = Queue(f"{redis_prefix}tasks", Exchange(f"{redis_prefix}tasks"), f"{redis_prefix}tasks")
        got: list[Any] = []
        with Consumer(connection, [queue], callbacks=[lambda body, message: got.append(message)]):
            for _ in range(3):
                keep_alive(connection)
        assert got == []
        assert negotiated_heartbeat(connection) == 0  # nothing to keep up on Redis: no wake-ups for it
    assert [m["headers"]["id"] for m in redis_messages(redis_url, queue_key(redis_prefix))] == ["task-000"]


@pytest.fixture
def amqp_connection(broker_url: str) -> Iterator[Connection]:
    with Connection(broker_url, heartbeat=30) as connection:
        connection.ensure_connection(max_retries=1)
        yield connection


def test_keep_alive_and_the_heartbeat_on_rabbitmq_are_unchanged(amqp_connection: Connection) -> None:
    keep_alive(amqp_connection)
    assert negotiated_heartbeat(amqp_connection) == 30
