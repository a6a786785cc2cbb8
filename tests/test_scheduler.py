"""The Scheduler in-process, on the real RabbitMQ, with a simulated clock (no sleeping, no timing)."""

from __future__ import annotations

import logging
import sqlite3
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from kombu import Connection, Exchange, Queue

import anarchon_celery
from anarchon_celery import (
    ConfigError,
    MemoryBackend,
    RabbitMQBackend,
    Scheduler,
    SQLiteBackend,
    live_jobs,
    task_id_for,
)
from anarchon_celery import clock as clock_module
from anarchon_celery.backends.rabbitmq import gate_name
from anarchon_celery.connections import negotiated_heartbeat
from anarchon_celery.sending import TaskLink

pytestmark = pytest.mark.broker

T0 = 1_796_227_200_000  # 2026-12-02 16:00:00 UTC, a multiple of every interval used here
#: When the simulated clock starts. A scheduler started then also claims the runs due before it
#: that are still within their lateness (test_a_start_claims_the_runs_still_within_their_lateness);
#: the other tests look at the runs due from the start on.
START = T0 - 500


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock(START)
    monkeypatch.setattr(clock_module, "now_ms", fake)
    return fake


@pytest.fixture
def no_change_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler looks for changes of runtime jobs once, at its first wake-up: the sleeps the
    test looks at are those its runs, gates and connections ask for (a beat otherwise wakes up
    at least every live_jobs.CHANGES_POLL_S)."""
    monkeypatch.setattr(live_jobs, "CHANGES_POLL_S", 86_400.0)


@pytest.fixture
def app(broker_url: str, prefix: str) -> Iterator[Celery]:
    app = Celery(f"app{uuid.uuid4().hex[:6]}", broker=broker_url, set_as_current=False)
    app.conf.update(
        task_default_queue=f"{prefix}tasks",
        anarchon_prefix=prefix,
        anarchon_slot_ttl_ms=60_000,
        anarchon_max_late_ms=5_000,
        anarchon_jitter_ms=300,
    )

    @app.task(name="tasks.work", shared=False)
    def work(*args: Any, **kwargs: Any) -> None: ...

    with Connection(broker_url) as conn:  # the worker would declare it; here nobody else does
        Queue(f"{prefix}tasks", Exchange(f"{prefix}tasks"), f"{prefix}tasks")(conn.default_channel).declare()
    yield app
    app.close()


def sent(broker_url: str, queue: str, since: int = START) -> list[Any]:
    """Every task message waiting in `queue` (drained), but those of runs due before ``since``."""
    messages = []
    with Connection(broker_url) as conn:
        channel = conn.default_channel
        while (message := channel.basic_get(queue, no_ack=True)) is not None:
            if message.headers["anarchon_slot"] >= since:
                messages.append(message)
    return messages


def existed(broker_url: str, prefix: str, *jobs: str) -> None:
    """Say that ``jobs`` existed long before the simulated clock's start (a deployment restarted):
    a start then claims their runs still within their lateness."""
    backend = RabbitMQBackend(broker_url, prefix=prefix, slot_ttl_ms=60_000)
    try:
        backend.introduce({job: START - 3_600_000 for job in jobs})
    finally:
        backend.close()


def run_until(clock: Clock, schedulers: list[Scheduler], end: int) -> None:
    """Advance the simulated clock from wake-up to wake-up, as `celery beat` would sleep."""
    while clock.now < end:
        wake = min(clock.now + round(s.tick() * 1000) for s in schedulers)
        clock.now = max(wake, clock.now + 1)


def test_two_schedulers_send_each_run_once(app: Celery, clock: Clock, broker_url: str, prefix: str) -> None:
    app.conf.beat_schedule = {
        "every-second": {"task": "tasks.work", "schedule": 1.0, "args": (1,), "options": {"priority": 3}},
        "cron": {"task": "tasks.work", "schedule": "*/2 * * * * *", "kwargs": {"k": "v"}},
    }
    schedulers = [Scheduler(app), Scheduler(app)]
    schedulers[1].instance = "other-instance"
    run_until(clock, schedulers, T0 + 10_000)
    for s in schedulers:
        s.close()

    messages = sent(broker_url, f"{prefix}tasks")
    expected = {("every-second", T0 + n * 1000) for n in range(10)} | {("cron", T0 + n * 2000) for n in range(5)}
    seen = [(m.headers["anarchon_job"], m.headers["anarchon_slot"]) for m in messages]
    assert sorted(seen) == sorted(expected)  # every run, each once
    for message in messages:
        job, slot = message.headers["anarchon_job"], message.headers["anarchon_slot"]
        assert message.headers["id"] == task_id_for(prefix, job, slot)
        assert message.headers["anarchon_run"] == message.headers["id"]
        assert message.headers["task"] == "tasks.work"
        if job == "every-second":
            assert message.properties["priority"] == 3
            assert message.headers["argsrepr"] == "(1,)"
        else:
            assert message.headers["kwargsrepr"] == "{'k': 'v'}"


def test_cron_decorated_tasks_are_scheduled(app: Celery, clock: Clock, broker_url: str, prefix: str) -> None:
    @anarchon_celery.cron("*/5 * * * * *", name="decorated", jitter_ms=0)
    @app.task(name="tasks.decorated", shared=False)
    def decorated() -> None: ...

    scheduler = Scheduler(app)
    run_until(clock, [scheduler], T0 + 10_001)
    scheduler.close()
    slots = sorted(m.headers["anarchon_slot"] for m in sent(broker_url, f"{prefix}tasks"))
    assert slots == [T0, T0 + 5000, T0 + 10_000]


def test_a_start_claims_the_runs_still_within_their_lateness(
    app: Celery, clock: Clock, broker_url: str, prefix: str
) -> None:
    # Started at T0 - 500 with max_late_ms 5 s: the runs due from T0 - 5.5 s are still on time,
    # for a job that existed then; a new job's runs start with it.
    app.conf.beat_schedule = {
        "job": {"task": "tasks.work", "schedule": 1.0, "jitter_ms": 0},
        "new": {"task": "tasks.work", "schedule": 1.0, "jitter_ms": 0},
    }
    existed(broker_url, prefix, "job")
    scheduler = Scheduler(app)
    scheduler.tick()
    scheduler.close()
    slots = sorted(
        m.headers["anarchon_slot"]
        for m in sent(broker_url, f"{prefix}tasks", since=0)
        if m.headers["anarchon_job"] == "job"
    )
    assert slots == [T0 - 5000, T0 - 4000, T0 - 3000, T0 - 2000, T0 - 1000]
    assert [m for m in sent(broker_url, f"{prefix}tasks", since=0) if m.headers["anarchon_job"] == "new"] == []


def test_a_late_run_is_skipped_not_caught_up(
    app: Celery, clock: Clock, broker_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    app.conf.beat_schedule = {"job": {"task": "tasks.work", "schedule": 1.0, "jitter_ms": 0, "max_late_ms": 2000}}
    scheduler = Scheduler(app)
    scheduler.tick()  # the runs due before the start, within their lateness
    clock.now = T0 + 2001  # the run of slot T0 is found 2001 ms late; those of T0+1s and T0+2s are not
    scheduler.tick()
    assert "job 'job' slot 1796227200000: found 2001 ms late (max_late_ms 2000); skipped" in caplog.text
    # A long pause: everything more than max_late_ms late is skipped at once, with one line.
    clock.now = T0 + 60_000
    scheduler.tick()
    assert "job 'job' slot 1796227203000: found 57000 ms late" in caplog.text
    assert "runs from slot 1796227204000 up to slot 1796227258000 are more than max_late_ms" in caplog.text
    run_until(clock, [scheduler], T0 + 60_500)
    scheduler.close()
    slots = sorted(m.headers["anarchon_slot"] for m in sent(broker_url, f"{prefix}tasks"))
    # late, but within max_late_ms
    assert slots == [T0 + 1000, T0 + 2000, T0 + 58_000, T0 + 59_000, T0 + 60_000]


def test_jobs_due_together_each_get_their_own_next_run(app: Celery, clock: Clock, broker_url: str, prefix: str) -> None:
    # All due at T0 in one wake-up; the next runs are worked out once per schedule and slot.
    app.conf.beat_schedule = {
        "a": {"task": "tasks.work", "schedule": "*/2 * * * * *", "jitter_ms": 0},
        "b": {"task": "tasks.work", "schedule": 1.0, "jitter_ms": 0},
        "c": {"task": "tasks.work", "schedule": "*/2 * * * * *", "jitter_ms": 0},
        "d": {"task": "tasks.work", "schedule": "*/3 * * * * *", "jitter_ms": 0},
    }
    scheduler = Scheduler(app)
    run_until(clock, [scheduler], T0 + 6500)
    scheduler.close()
    slots: dict[str, list[int]] = {}
    for message in sent(broker_url, f"{prefix}tasks"):
        slots.setdefault(message.headers["anarchon_job"], []).append(message.headers["anarchon_slot"] - T0)
    assert {job: sorted(found) for job, found in slots.items()} == {
        "a": [0, 2000, 4000, 6000],
        "b": [0, 1000, 2000, 3000, 4000, 5000, 6000],
        "c": [0, 2000, 4000, 6000],
        "d": [0, 3000, 6000],
    }


def test_runs_won_are_written_at_once_from_the_first(app: Celery, clock: Clock, broker_url: str, prefix: str) -> None:
    # The task connection is opened before the first run, and again after it is lost: a run
    # won with no connection open waits until every claim of its batch is answered.
    app.conf.beat_schedule = {"job": {"task": "tasks.work", "schedule": 1.0, "jitter_ms": 0}}
    existed(broker_url, prefix, "job")
    scheduler = Scheduler(app)
    connected_at_write: list[bool] = []
    write = scheduler.sender.write

    def watched(run: Any) -> None:
        connected_at_write.append(scheduler.connection.connected)
        write(run)

    scheduler.sender.write = watched  # type: ignore[method-assign]
    scheduler.tick()  # at the start: the runs due before it, within their lateness
    clock.now = T0
    scheduler.tick()
    scheduler.connection.collect()  # lost while asleep
    clock.now = T0 + 1000
    scheduler.tick()
    scheduler.close()
    assert len(connected_at_write) > 2 and all(connected_at_write)
    assert sorted(m.headers["anarchon_slot"] for m in sent(broker_url, f"{prefix}tasks")) == [T0, T0 + 1000]


@pytest.mark.usefixtures("no_change_polls")
def test_sleeps_until_the_next_due_run(app: Celery, clock: Clock) -> None:
    app.conf.beat_schedule = {"job": {"task": "tasks.work", "schedule": 3600.0, "jitter_ms": 0}}
    scheduler = Scheduler(app)
    clock.now = T0 + 1000
    # The next run is an hour away: sleep no longer than the backend's heartbeat allows.
    assert scheduler.tick() == pytest.approx(scheduler.backend.max_idle_s())
    clock.now = T0 + 3600_000 - 1500
    assert scheduler.tick() == pytest.approx(1.5)
    scheduler.close()


@pytest.mark.usefixtures("no_change_polls")
def test_sleeps_no_longer_than_the_task_connection_heartbeat_allows(app: Celery, clock: Clock, prefix: str) -> None:
    # The task connection is open from the start; a backend with no heartbeat of its own (here
    # the memory one) must not let beat sleep past it, or the broker drops it while we sleep.
    app.conf.anarchon_backend = MemoryBackend(prefix=prefix, slot_ttl_ms=60_000)
    app.conf.beat_schedule = {"job": {"task": "tasks.work", "schedule": 3600.0, "jitter_ms": 0}}
    scheduler = Scheduler(app)
    clock.now = T0 + 1000
    assert scheduler.backend.max_idle_s() is None
    heartbeat = negotiated_heartbeat(scheduler.connection)
    assert heartbeat > 0
    assert scheduler.tick() == pytest.approx(heartbeat / 3)
    scheduler.close()


def test_a_task_broker_away_is_tried_after_the_claims_only(
    app: Celery, clock: Clock, broker_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Claims on the RabbitMQ of anarchon_backend, tasks on a broker that refuses connections:
    # connecting ahead for the tasks is tried once per wake-up, after the claims (not before
    # them as well), and logged once.
    app.conf.anarchon_backend = broker_url
    app.conf.broker_url = "amqp://guest:guest@127.0.0.1:1//"
    app.conf.beat_schedule = {"job": {"task": "tasks.work", "schedule": 1.0, "jitter_ms": 0, "max_late_ms": 100}}
    monkeypatch.setattr(TaskLink, "connect_backoff_s", 0.0)
    caplog.set_level(logging.INFO, logger="anarchon_celery")
    scheduler = Scheduler(app)
    tries = 0
    open_ = scheduler.sender.open

    def counted() -> None:
        nonlocal tries
        tries += 1
        open_()

    scheduler.sender.open = counted  # type: ignore[method-assign]
    for n in range(3):
        clock.now = T0 + n * 1000
        scheduler.tick()
    scheduler.close()
    assert tries == 3
    assert caplog.text.count("could not connect for sending tasks ahead of the runs") == 1


def test_a_burst_of_runs_due_together_is_sent_once_each(
    app: Celery, clock: Clock, broker_url: str, prefix: str
) -> None:
    # 200 gates, and one history stream only: each live queue holds files on the broker, whose
    # handles are few here (a 300-job version of this test, each job with its stream, ran the
    # broker out of them).
    app.conf.beat_schedule = {
        f"job-{n:03d}": {"task": "tasks.work", "schedule": "0 * * * *", "jitter_ms": 0, "args": (n,)}
        for n in range(200)
    }
    app.conf.beat_schedule["job-123"]["history_size"] = 1
    app.conf.anarchon_history_size = 0
    schedulers = [Scheduler(app), Scheduler(app)]
    schedulers[0].batch_size = 64  # several batches in one wake-up
    clock.now = T0 - 10_000
    for scheduler in schedulers:
        scheduler.tick()  # gates declared ahead
    clock.now = T0
    for scheduler in schedulers:
        scheduler.tick()
        scheduler.close()
    messages = sent(broker_url, f"{prefix}tasks")
    assert sorted(m.headers["anarchon_job"] for m in messages) == [f"job-{n:03d}" for n in range(200)]
    assert {m.headers["anarchon_slot"] for m in messages} == {T0}
    assert all(m.headers["id"] == task_id_for(prefix, m.headers["anarchon_job"], T0) for m in messages)
    history = anarchon_celery.history(app, "job-123")
    assert [(run.slot, run.status) for run in history] == [(T0, "sent")]


@pytest.mark.usefixtures("no_change_polls")
def test_gates_are_declared_lead_ms_before_their_runs(app: Celery, clock: Clock, broker_url: str, prefix: str) -> None:
    app.conf.anarchon_lead_ms = 10_000
    app.conf.beat_schedule = {"minute": {"task": "tasks.work", "schedule": 60.0, "jitter_ms": 0}}
    clock.now = T0 + 1
    scheduler = Scheduler(app)
    gate = gate_name(prefix, "minute", T0 + 60_000)
    phase = scheduler.plan.prepare_phase_ms  # declares come between runs aligned on whole seconds
    assert 250 <= phase <= 750
    clock.now = T0 + 49_000
    assert scheduler.tick() * 1000 == pytest.approx(1000 + phase)  # wakes up for the gate, ~10 s before the run
    clock.now = T0 + 50_000 + phase - 1
    scheduler.tick()
    assert not gate_exists(broker_url, gate)
    clock.now = T0 + 50_000 + phase
    assert scheduler.tick() * 1000 == pytest.approx(10_000 - phase)  # declared; next: the claim
    scheduler.backend.await_prepared(10)  # the declare is written, its answer read later
    assert gate_exists(broker_url, gate)
    clock.now = T0 + 60_000
    scheduler.tick()
    scheduler.close()
    assert [m.headers["anarchon_slot"] for m in sent(broker_url, f"{prefix}tasks")] == [T0 + 60_000]


def gate_exists(broker_url: str, name: str) -> bool:
    with Connection(broker_url) as conn:
        try:
            conn.channel().queue_declare(name, passive=True)
            return True
        except Exception:  # noqa: BLE001 - 404: no such queue
            return False


def test_a_refused_send_is_logged_with_job_and_slot(
    app: Celery, clock: Clock, caplog: pytest.LogCaptureFixture, prefix: str
) -> None:
    full = f"{prefix}full"  # a queue that refuses every message: the broker nacks the task
    refusing = Queue(
        full,
        Exchange(full),
        full,
        durable=True,
        auto_delete=False,
        queue_arguments={"x-max-length": 0, "x-overflow": "reject-publish"},
    )
    app.conf.beat_schedule = {
        "refused": {
            "task": "tasks.work",
            "schedule": 1.0,
            "jitter_ms": 0,
            "max_late_ms": 1000,
            "options": {"queue": refusing},
        },
        "fine": {"task": "tasks.work", "schedule": 1.0, "jitter_ms": 0},
    }
    caplog.set_level(logging.INFO, logger="anarchon_celery")
    scheduler = Scheduler(app)
    clock.now = T0
    scheduler.tick()
    scheduler.close()
    assert f"job 'refused' slot {T0}: won, but sending task tasks.work" in caplog.text
    assert "MessageNacked" in caplog.text
    assert f"job 'fine' slot {T0}: won, sent tasks.work" in caplog.text
    # The run that could not be sent shows in its history, with why.
    [refused] = [run for run in anarchon_celery.history(app, "refused") if run.slot >= T0]
    assert (refused.status, refused.slot, refused.error_type) == ("unsent", T0, "MessageNacked")
    assert refused.task_id == task_id_for(prefix, "refused", T0) and refused.instance == scheduler.instance
    assert anarchon_celery.last_run(app, "fine").status == "sent"  # type: ignore[union-attr]


def test_banner_names_backend_prefix_and_jobs_without_the_password(app: Celery, prefix: str) -> None:
    app.conf.broker_url = "amqp://guest:guest@rabbit.internal:5672//"
    app.conf.beat_schedule = {"a": {"task": "tasks.work", "schedule": 5.0}, "b": {"task": "tasks.work", "schedule": 7}}
    info = Scheduler(app, lazy=True).info
    assert "rabbitmq amqp://guest:**@rabbit.internal:5672//" in info
    assert f"prefix '{prefix}'" in info and "anarchon jobs -> 2" in info
    assert ":guest@" not in info


def test_configuration_errors_fail_at_start_with_the_job_named(app: Celery) -> None:
    app.conf.beat_schedule = {"bad": {"task": "tasks.work", "schedule": "99 * * * *"}}
    with pytest.raises(SystemExit) as exited:  # as beat runs it: one line logged, exit status 1
        Scheduler(app)
    assert exited.value.code == 1
    assert isinstance(exited.value.__cause__, ConfigError)
    assert "job 'bad': invalid cron spec" in str(exited.value.__cause__)

    class Embedded(Scheduler):
        exit_on_error = False

    with pytest.raises(ConfigError, match="job 'bad': invalid cron spec"):
        Embedded(app)
    assert "configuration error: job 'bad'" in Scheduler(app, lazy=True).info


def test_memory_backend_for_testing_schedules(app: Celery, clock: Clock, broker_url: str, prefix: str) -> None:
    backend = MemoryBackend(prefix=prefix, slot_ttl_ms=60_000)
    app.conf.anarchon_backend = backend
    app.conf.beat_schedule = {"job": {"task": "tasks.work", "schedule": 2.0}}
    schedulers = [Scheduler(app) for _ in range(3)]
    for n, s in enumerate(schedulers):
        s.instance = f"i{n}"
    run_until(clock, schedulers, T0 + 6000)
    assert backend.holder("job", T0 + 2000) in {"i0", "i1", "i2"}
    slots = sorted(m.headers["anarchon_slot"] for m in sent(broker_url, f"{prefix}tasks"))
    assert slots == [T0, T0 + 2000, T0 + 4000]


def test_a_job_with_history_size_0_keeps_no_history(app: Celery, clock: Clock, broker_url: str, prefix: str) -> None:
    app.conf.beat_schedule = {
        "quiet": {"task": "tasks.work", "schedule": 1.0, "jitter_ms": 0, "history_size": 0},
        "kept": {"task": "tasks.work", "schedule": 1.0, "jitter_ms": 0},
    }
    scheduler = Scheduler(app)
    run_until(clock, [scheduler], T0 + 2001)
    scheduler.close()
    jobs = sorted((m.headers["anarchon_job"], m.headers["anarchon_slot"]) for m in sent(broker_url, f"{prefix}tasks"))
    assert jobs == [(job, T0 + n * 1000) for job in ("kept", "quiet") for n in range(3)]
    manual = anarchon_celery.run_now(app, "quiet")  # sent, and not recorded either
    assert [m.headers["id"] for m in sent(broker_url, f"{prefix}tasks")] == [manual.task_id]
    assert anarchon_celery.history(app, "quiet") == []
    assert anarchon_celery.last_run(app, "quiet") is None
    assert len([run for run in anarchon_celery.history(app, "kept") if run.slot >= START]) == 3
    with Connection(broker_url) as conn, pytest.raises(Exception, match="NOT_FOUND"):
        conn.default_channel.queue_declare(f"{prefix}quiet.history", passive=True)  # no stream was made


@pytest.mark.parametrize(
    "jobs, history_size, warned",
    [
        (8, 0, False),  # every second, jitter 300 ms: 61 gates each within slot_ttl_ms 60 s; 488
        (9, 0, True),  # 549
        (8, 5, True),  # 488 + two files per history stream: 504
    ],
)
def test_more_live_queues_than_a_broker_holds_files_for_is_warned_at_start(
    app: Celery, clock: Clock, caplog: pytest.LogCaptureFixture, jobs: int, history_size: int, warned: bool
) -> None:
    app.conf.anarchon_history_size = history_size
    app.conf.beat_schedule = {f"j{n}": {"task": "tasks.work", "schedule": 1.0} for n in range(jobs)}
    caplog.set_level(logging.INFO, logger="anarchon_celery")
    Scheduler(app).close()
    warning = f"these jobs keep up to about {jobs * 61} gate queues (slot_ttl_ms 60000) and "
    assert (warning in caplog.text) is warned
    assert "anarchon: ready as" in caplog.text


@pytest.mark.parametrize("backend", ["app", "url"])
def test_broker_heartbeat_and_connection_timeout_are_honoured(app: Celery, broker_url: str, backend: str) -> None:
    app.conf.broker_heartbeat = 30
    app.conf.broker_connection_timeout = 2.5
    if backend == "url":  # claims through a URL of their own, tasks through the app's broker
        app.conf.anarchon_backend = broker_url
    app.conf.beat_schedule = {"job": {"task": "tasks.work", "schedule": 60.0}}
    scheduler = Scheduler(app)
    try:
        assert isinstance(scheduler.backend, RabbitMQBackend)
        claims = scheduler.backend.connection
        assert (claims.heartbeat, claims.connect_timeout) == (30, 2.5)
        assert scheduler.connection.heartbeat == 30  # the task connection
        assert negotiated_heartbeat(claims) == 30  # agreed with the broker
    finally:
        scheduler.close()


class _AwayFor(MemoryBackend):
    """Answers AWAY for every claim until the clock passes `back_ms`, as a RabbitMQ backend does
    while the node holding the runs' gates is down (or EARLY, as a lease store does while its
    clock is behind the instance's)."""

    back_ms = 0
    answer = anarchon_celery.Outcome.AWAY
    calls: list[tuple[int, int]]  # (clock, slot) of each claim made

    def claim(self, claims: Any, instance: str, *, on_won: Any = None) -> list[anarchon_celery.Outcome]:
        self.calls += [(clock_module.now_ms(), claim.slot) for claim in claims]
        if clock_module.now_ms() < self.back_ms:
            return [self.answer] * len(claims)
        return super().claim(claims, instance, on_won=on_won)


def _sent_slots_with(backend: _AwayFor, app: Celery, clock: Clock, broker_url: str, prefix: str) -> list[int]:
    """The slots sent by a scheduler on ``backend`` running a job every 10 s (jitter 0, 5 s of
    lateness) from before T0 to T0 + 12 s."""
    app.conf.anarchon_backend = backend
    app.conf.beat_schedule = {"job": {"task": "tasks.work", "schedule": 10.0, "jitter_ms": 0, "max_late_ms": 5_000}}
    scheduler = Scheduler(app)
    run_until(clock, [scheduler], T0 + 12_000)
    scheduler.close()
    return [m.headers["anarchon_slot"] for m in sent(broker_url, f"{prefix}tasks")]


@pytest.mark.parametrize("answer", [anarchon_celery.Outcome.AWAY, anarchon_celery.Outcome.EARLY])
@pytest.mark.parametrize(("back_after_ms", "sent_slots"), [(2_500, [T0, T0 + 10_000]), (6_000, [T0 + 10_000])])
def test_a_run_away_or_early_is_claimed_again_until_its_deadline(
    app: Celery,
    clock: Clock,
    broker_url: str,
    prefix: str,
    back_after_ms: int,
    sent_slots: list[int],
    answer: anarchon_celery.Outcome,
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = _AwayFor(prefix=prefix, slot_ttl_ms=60_000)
    backend.back_ms, backend.calls, backend.answer = T0 + back_after_ms, [], answer
    assert _sent_slots_with(backend, app, clock, broker_url, prefix) == sent_slots
    first = [at for at, slot in backend.calls if slot == T0]
    # Claimed at the slot, then about every AWAY_RETRY_MS, never after its deadline (max_late_ms).
    assert first[0] == T0 and all(at <= T0 + 5_000 for at in first)
    assert len(first) == (4 if back_after_ms == 2_500 else 6)
    assert [slot for _, slot in backend.calls].count(T0 + 10_000) == 1  # the next run queued once
    if back_after_ms > 5_000:  # given up at its deadline, saying why
        why = "its gate stayed away" if answer is anarchon_celery.Outcome.AWAY else "this host's clock is ahead"
        assert f"job 'job' slot {T0}: " in caplog.text and why in caplog.text


class _StoreDownFor(_AwayFor):
    """A store backend whose store cannot be reached until `back_ms`: its claims are AWAY, and it
    is in an outage, which counts the runs given up meanwhile for the line that ends it."""

    away_text = ("the store cannot be reached", "the store could not be reached")

    def in_outage(self) -> bool:
        return clock_module.now_ms() < self.back_ms

    given_up: list[tuple[str, int]]

    def missed(self, job: str, slots: Sequence[int]) -> None:
        self.given_up += [(job, slot) for slot in slots]


@pytest.mark.parametrize(("back_after_ms", "sent_slots"), [(2_500, [T0, T0 + 10_000]), (6_000, [T0 + 10_000])])
def test_a_run_whose_store_is_down_is_claimed_again_and_counted_when_given_up(
    app: Celery,
    clock: Clock,
    broker_url: str,
    prefix: str,
    back_after_ms: int,
    sent_slots: list[int],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="anarchon_celery")
    backend = _StoreDownFor(prefix=prefix, slot_ttl_ms=60_000)
    backend.back_ms, backend.calls, backend.given_up = T0 + back_after_ms, [], []
    assert _sent_slots_with(backend, app, clock, broker_url, prefix) == sent_slots
    assert "the store cannot be reached; claiming it again" in caplog.text
    given_up = [r for r in caplog.records if "the store could not be reached until" in r.getMessage()]
    if back_after_ms > 5_000:  # given up in the outage: named in its closing line, not warned of
        assert backend.given_up == [("job", T0)] and [r.levelno for r in given_up] == [logging.DEBUG]
    else:
        assert backend.given_up == [] and not given_up


class _DeafToMarks(SQLiteBackend):
    """A SQLite backend whose first marks of runs sent fail, as when the store is restarting."""

    fails = 2  # the mark, and its try on a new connection

    def _mark_sent(self, runs: Any) -> list[bool]:
        self.marks = getattr(self, "marks", 0) + 1
        if self.marks <= self.fails:
            raise sqlite3.OperationalError("disk I/O error")
        return super()._mark_sent(runs)


def test_a_run_sent_that_the_store_could_not_be_told_of_is_marked_sent_when_it_answers(
    app: Celery, broker_url: str, prefix: str, tmp_path: Path
) -> None:
    """Told again until the store answers: a store back within the lease keeps the run's backups
    quiet, instead of letting them send it again."""
    backend = _DeafToMarks(tmp_path / "runs.db", prefix=prefix, slot_ttl_ms=60_000, lease_ms=30_000)
    app.conf.anarchon_backend = backend
    app.conf.beat_schedule = {"job": {"task": "tasks.work", "schedule": 10.0, "jitter_ms": 0, "max_late_ms": 5_000}}
    # Started where no run is due within the lateness before it (one would be sent at once, and
    # its deadline passes before the store answers: no need to tell it then).
    while not 5_500 <= time.time() * 1000 % 10_000 <= 9_000:
        time.sleep(0.05)
    scheduler = Scheduler(app)
    try:
        deadline = time.monotonic() + 30
        while getattr(backend, "marks", 0) <= backend.fails + 1 and time.monotonic() < deadline:
            time.sleep(min(scheduler.tick(), 0.2))
    finally:
        scheduler.close()
    first = sent(broker_url, f"{prefix}tasks")[0].headers["anarchon_slot"]
    record = backend.run_record("job", first)
    assert record is not None and record.state == "sent" and record.token == 1
    backend.close()


def test_a_send_refused_for_a_lost_home_node_says_to_use_quorum_queues() -> None:
    import amqp

    from anarchon_celery.sending import _hint_for

    lost = amqp.exceptions.NotFound(
        "NOT_FOUND - home node 'rabbit@node1' of durable queue 'proj.tasks' in vhost '/' is down or inaccessible"
    )
    assert "task_default_queue_type = 'quorum'" in _hint_for(lost)
    assert _hint_for(amqp.exceptions.NotFound("NOT_FOUND - no exchange 'x' in vhost '/'")) == ""
