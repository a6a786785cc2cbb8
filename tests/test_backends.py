"""The claim, against the real RabbitMQ (and the in-memory backend through the same contract)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection

from anarchon_celery import (
    BrokerError,
    Claim,
    ConfigError,
    MemoryBackend,
    Outcome,
    PostgresBackend,
    RabbitMQBackend,
    RedisBackend,
    SQLiteBackend,
    clock,
)
from anarchon_celery.backends import Backend, TakeoverKind
from anarchon_celery.backends.base import CATCH_UP
from anarchon_celery.backends.rabbitmq import (
    ahead,
    check_server,
    gate_arguments,
    gate_name,
    gates,
    history_arguments,
    history_name,
)
from anarchon_celery.history import encode_event, fold

from .support import broker_control as control
from .support import postgres_servers, races
from .support.proxy import Proxy
from .support.races import open_kind
from .support.redis_servers import OwnRedisServer

pytestmark = pytest.mark.broker


def rabbit(broker_url: str, prefix: str, **kwargs: Any) -> RabbitMQBackend:
    backend = RabbitMQBackend(broker_url, prefix=prefix, slot_ttl_ms=kwargs.pop("slot_ttl_ms", 60_000), **kwargs)
    backend.open()
    return backend


@pytest.fixture(params=["rabbitmq", "memory", "sqlite", "redis", "postgres"])
def make_backend(request: pytest.FixtureRequest, prefix: str, tmp_path: Path) -> Iterator[Any]:
    """Factory of backends that share their claims (as instances of one deployment would)."""
    made: list[Backend] = []
    shared_memory = MemoryBackend(prefix=prefix)
    if request.param == "rabbitmq":
        broker_url = request.getfixturevalue("broker_url")
    if request.param == "redis":
        redis_url = request.getfixturevalue("redis_url")
        prefix = request.getfixturevalue("redis_prefix")  # its keys deleted after the test
    if request.param == "postgres":
        postgres_url = request.getfixturevalue("postgres_url")
        prefix = request.getfixturevalue("postgres_prefix")  # its rows deleted after the test

    def make(lease_ms: int = 5_000) -> Backend:
        backend: Backend
        if request.param == "rabbitmq":
            backend = rabbit(broker_url, prefix)
        elif request.param == "redis":
            backend = RedisBackend(redis_url, prefix=prefix, lease_ms=lease_ms)
            backend.open()
        elif request.param == "postgres":
            backend = PostgresBackend(postgres_url, prefix=prefix, lease_ms=lease_ms)
            backend.open()
        elif request.param == "sqlite":
            backend = SQLiteBackend(tmp_path / "anarchon.db", prefix=prefix, lease_ms=lease_ms)
            backend.open()
        else:
            backend = shared_memory
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


# -- the contract, on every backend ---------------------------------------------------------------


def test_first_claim_wins_and_the_others_lose(make_backend: Any) -> None:
    a, b = make_backend(), make_backend()
    assert a.claim([Claim("job", 1000)], "a") == [Outcome.WON]
    assert b.claim([Claim("job", 1000)], "b") == [Outcome.LOST]
    assert a.claim([Claim("job", 1000)], "a") == [Outcome.LOST]  # even for the winner: once only


def test_batches_answer_each_claim_in_order(make_backend: Any) -> None:
    a, b = make_backend(), make_backend()
    assert a.claim([Claim("x", 1), Claim("y", 1)], "a") == [Outcome.WON, Outcome.WON]
    claims = [Claim("x", 1), Claim("x", 2), Claim("y", 1), Claim("z", 1)]
    assert b.claim(claims, "b") == [Outcome.LOST, Outcome.WON, Outcome.LOST, Outcome.WON]
    assert a.claim([], "a") == []


def test_runs_claimed_in_any_order_are_each_won_once(make_backend: Any) -> None:
    """Instances back from an outage claim the runs due meanwhile each in its own order (a later
    run first): every run is still won, once."""
    a, b, c = make_backend(), make_backend(), make_backend()
    first, second, third = (clock.now_ms() - 3_000 + 1_000 * n for n in range(3))
    assert a.claim([Claim("job", third)], "a") == [Outcome.WON]
    assert b.claim([Claim("job", first)], "b") == [Outcome.WON]
    claims = [Claim("job", second), Claim("job", first), Claim("job", third)]
    assert c.claim(claims, "c") == [Outcome.WON, Outcome.LOST, Outcome.LOST]
    assert a.claim(claims, "a") == [Outcome.LOST] * 3


def test_instances_of_one_deployment_name_one_place(make_backend: Any) -> None:
    a, b = make_backend(), make_backend()
    for backend in (a, b):
        backend.claim([Claim("job", clock.now_ms())], "x")  # connected, the store made
    assert a.place() is not None and a.place() == b.place()
    assert repr(a.prefix) in a.place()


def test_a_rabbitmq_place_is_its_cluster_not_the_url_spelling(broker_url: str, prefix: str) -> None:
    a, b = rabbit(broker_url, prefix), rabbit(broker_url.replace("127.0.0.1", "localhost"), prefix)
    other = rabbit(broker_url, f"{prefix}other.")
    try:
        for backend in (a, b, other):
            backend.open()
        assert a.place() == b.place() and a.place() != other.place()
        assert a.place().startswith("RabbitMQ cluster '")  # type: ignore[union-attr]
    finally:
        for backend in (a, b, other):
            backend.close()


def test_jobs_with_state_under_a_prefix_are_found(make_backend: Any) -> None:
    # How a deployment of an earlier release, whose default prefix was another, is found.
    a = make_backend()
    now = clock.now_ms()
    assert a.claim([Claim("job", now)], "a") == [Outcome.WON]
    a.ensure_history("job", 5)
    a.record("job", encode_event("sent", run="r", job="job", at_ms=now), 5)
    expected = [] if isinstance(a, MemoryBackend) else ["job"]
    assert a.jobs_with_state(a.prefix, ["job", "other"]) == expected
    assert a.jobs_with_state(f"{a.prefix}elsewhere.", ["job"]) == []


def test_a_job_came_to_be_when_an_instance_first_knew_it(make_backend: Any) -> None:
    """Each instance tells, at its start, when it first knew each job; the backend keeps the
    earliest (two instances started together), and every instance reads the same back."""
    a, b = make_backend(), make_backend()
    assert a.introduce({"new": 5_000, "old": 2_000}) == {"new": 5_000, "old": 2_000}
    assert b.introduce({"new": 7_000, "old": 1_000, "other": 9_000}) == {"new": 5_000, "old": 1_000, "other": 9_000}
    assert a.introduce({"new": 8_000}) == {"new": 5_000}


def test_a_job_kept_from_before_births_existed_at_its_cursor(make_backend: Any) -> None:
    """A job whose store keeps its cursor but no birth (kept by an earlier release) existed at its
    cursor's slot at the latest."""
    backend = make_backend()
    if backend.lease_store is None:
        pytest.skip("a claim-only backend keeps no cursor")
    now = clock.now_ms()
    assert backend.claim([Claim("kept", now - 10_000)], "a") == [Outcome.WON]
    assert backend.introduce({"kept": now}) == {"kept": now - 10_000}


def test_each_win_is_reported_once_as_it_is_known(make_backend: Any) -> None:
    a, b = make_backend(), make_backend()
    assert a.claim([Claim("x", 1)], "a") == [Outcome.WON]
    heard: list[Claim] = []
    claims = [Claim("x", 1), Claim("x", 2), Claim("y", 1), Claim("z", 1, deadline_ms=clock.now_ms() - 1)]
    assert b.claim(claims, "b", on_won=heard.append) == [Outcome.LOST, Outcome.WON, Outcome.WON, Outcome.UNDECIDED]
    assert sorted(heard, key=lambda c: (c.job, c.slot)) == [claims[1], claims[2]]  # only the wins, once each

    def broken(claim: Claim) -> None:
        raise RuntimeError("a listener's bug")

    if isinstance(b, RabbitMQBackend):  # a listener that raises changes no outcome
        assert b.claim([Claim("w", 1), Claim("w", 2)], "b", on_won=broken) == [Outcome.WON] * 2
        assert b.claim([Claim("w", 3)], "b") == [Outcome.WON]  # and the connection goes on


def test_a_slow_listener_does_not_turn_wins_into_timeouts(broker_url: str, prefix: str) -> None:
    # Writing the tasks of the wins read so far takes our time, not the broker's: answers that
    # arrive meanwhile are still read, however long the listener took in all.
    backend = rabbit(broker_url, prefix, confirm_timeout=1.0)
    claims = [Claim("slow", n) for n in range(40)]

    def slow(claim: Claim) -> None:
        time.sleep(0.05)  # 40 of them: 2 s, twice the confirm timeout

    assert backend.claim(claims, "me", on_won=slow) == [Outcome.WON] * 40
    backend.close()


def test_a_claim_past_its_deadline_is_never_made(make_backend: Any) -> None:
    backend = make_backend()
    now = clock.now_ms()
    claims = [Claim("late", 1, deadline_ms=now - 1), Claim("job", 2, deadline_ms=now + 60_000), Claim("job", 3)]
    assert backend.claim(claims, "a") == [Outcome.UNDECIDED, Outcome.WON, Outcome.WON]
    assert make_backend().claim([Claim("late", 1)], "b") == [Outcome.WON]  # nobody holds it


def test_a_run_decided_is_never_won_again_however_late(make_backend: Any) -> None:
    a, b = make_backend(), make_backend()
    assert a.claim([Claim("job", 5_000)], "a") == [Outcome.WON]
    assert b.claim([Claim("job", 5_000)], "b") == [Outcome.LOST]
    if not a.forgets_runs:  # decided in slot order: an earlier slot never claimed is passed over
        assert b.claim([Claim("job", 4_000), Claim("job", 6_000)], "b") == [Outcome.LOST, Outcome.WON]


def test_slots_and_jobs_are_independent(make_backend: Any) -> None:
    backend = make_backend()
    claims = [Claim(job, slot) for job in ("a", "b", "a-b", "a_b") for slot in (0, 1, clock.now_ms() - 1)]
    assert backend.claim(claims, "i") == [Outcome.WON] * len(claims)


# -- leases: backup runners and fencing tokens, on every backend ------------------------------------


def _due_run(backend: Backend, job: str = "job", backups: int = 2) -> Claim:
    """A run due now on the store's clock (or this host's), with a minute to its deadline."""
    now = backend.store_now_ms() if hasattr(backend, "store_now_ms") else clock.now_ms()
    return Claim(job, now - 10, deadline_ms=now + 60_000, backups=backups)


def test_a_claim_only_backend_holds_no_lease(make_backend: Any) -> None:
    backend = make_backend()
    if backend.leases:
        pytest.skip("a backend with leases")
    run = _due_run(backend)
    assert backend.claim([run], "a") == [Outcome.WON]
    assert backend.claim([run], "b") == [Outcome.LOST]
    assert backend.lease_store is None  # nobody is a backup, nothing to take over
    assert not any(hasattr(backend, name) for name in ("armed", "take_over", "mark_sent", "start_run", "hand_back"))


def test_losers_are_armed_as_backups_up_to_the_number_wanted(make_backend: Any) -> None:
    backend = make_backend()
    if not backend.leases:
        pytest.skip("claim only")
    run = _due_run(backend, backups=2)
    assert backend.claim([run], "a") == [Outcome.WON]
    assert backend.armed() == []  # the winner is nobody's backup
    ranks = []
    for loser in ("b", "c", "d"):
        assert backend.claim([run], loser) == [Outcome.LOST]
        ranks.append([(armed.claim, armed.rank) for armed in backend.armed()])
    assert ranks == [[(run, 1)], [(run, 2)], []]
    assert backend.armed() == []  # each told once
    untended = _due_run(backend, job="untended", backups=0)
    backend.claim([untended], "a")
    assert backend.claim([untended], "b") == [Outcome.LOST] and backend.armed() == []


def test_a_backup_takes_a_run_over_only_once_the_lease_has_run_out(make_backend: Any) -> None:
    backend = make_backend(lease_ms=400)
    if not backend.leases:
        pytest.skip("claim only")
    run = _due_run(backend)
    backend.claim([run], "a")
    backend.claim([run], "b")
    (armed,) = backend.armed()
    assert 0 < armed.lease_left_ms <= 400
    (early,) = backend.take_over([run], "b")
    assert early.kind is TakeoverKind.HELD and 0 < early.value <= 400
    time.sleep(armed.lease_left_ms / 1000 + 0.05)
    assert [t.kind for t in backend.take_over([run], "b")] == [TakeoverKind.WON]
    assert backend.take_over([run], "b")[0].value == 2  # asked again (an answer lost): still its own
    assert backend.take_over([run], "c")[0].kind is TakeoverKind.HELD  # the new holder's lease
    assert backend.mark_sent([("job", run.slot, 1)], "a") == [False]  # the first winner, too late
    assert backend.mark_sent([("job", run.slot, 2)], "b") == [True]
    assert backend.take_over([run], "c")[0].kind is TakeoverKind.DONE


def test_a_run_sent_in_time_is_never_taken_over(make_backend: Any) -> None:
    backend = make_backend(lease_ms=100)
    if not backend.leases:
        pytest.skip("claim only")
    run = _due_run(backend)
    backend.claim([run], "a")
    assert backend.mark_sent([("job", run.slot, 1)], "a") == [True]
    backend.claim([run], "b")
    assert backend.armed() == []  # sent: no backup needed
    time.sleep(0.15)
    assert backend.take_over([run], "c")[0].kind is TakeoverKind.DONE


def test_no_takeover_past_the_runs_deadline(make_backend: Any) -> None:
    backend = make_backend(lease_ms=100)
    if not backend.leases:
        pytest.skip("claim only")
    now = backend.store_now_ms()
    run = Claim("job", now - 10, deadline_ms=now + 150, backups=1)
    backend.claim([run], "a")
    time.sleep(0.3)
    (late,) = backend.take_over([run], "b")
    assert late.kind is TakeoverKind.LATE and late.value > 0


def test_the_worker_starts_a_run_once_and_only_with_its_current_token(make_backend: Any) -> None:
    backend = make_backend(lease_ms=100)
    if not backend.leases:
        pytest.skip("claim only")
    run = _due_run(backend)
    backend.claim([run], "a")
    time.sleep(0.15)
    assert backend.take_over([run], "b")[0].value == 2
    assert backend.start_run("job", run.slot, 1, False).allowed is False  # the first winner's late message
    assert backend.start_run("job", run.slot, 2, False).allowed is True
    assert backend.start_run("job", run.slot, 2, False).allowed is False  # a second message of the same token
    assert backend.start_run("job", run.slot, 2, True).allowed is True  # delivered again: its worker died
    assert backend.start_run("job", run.slot + 1, 1, False).allowed is None  # a run it does not know
    assert backend.take_over([run], "c")[0].kind is TakeoverKind.DONE  # started: nothing to take over


def test_a_lease_handed_back_is_taken_over_at_once(make_backend: Any) -> None:
    backend = make_backend(lease_ms=60_000)
    if not backend.leases:
        pytest.skip("claim only")
    run = _due_run(backend)
    backend.claim([run], "a")
    assert backend.hand_back([("job", run.slot, 1)], "b") == 0  # not its lease
    assert backend.hand_back([("job", run.slot, 1)], "a") == 1
    (taken,) = backend.take_over([run], "b")
    assert (taken.kind, taken.value) == (TakeoverKind.WON, 2)
    assert backend.hand_back([("job", run.slot, 1)], "a") == 0  # its token is not current any more


def test_a_lease_handed_back_is_heard_by_the_other_instances(make_backend: Any) -> None:
    a, b = make_backend(lease_ms=60_000), make_backend(lease_ms=60_000)
    if not a.leases:
        assert a.lease_store is None and not hasattr(a, "hand_back") and not hasattr(b, "handed_back")
        return
    assert b.handed_back() == []  # listening from now on
    run = _due_run(a)
    a.claim([run], "a")
    assert a.hand_back([("job", run.slot, 1)], "a") == 1
    heard: list[tuple[str, int]] = []
    deadline = time.monotonic() + 10
    while not heard and time.monotonic() < deadline:
        heard += b.handed_back()
        time.sleep(0.05)
    assert heard == [("job", run.slot)]
    assert b.handed_back() == []  # told once


@pytest.mark.exclusive  # restarts the suite's PostgreSQL
@pytest.mark.parametrize("kind", ["redis", "postgres"])
def test_a_store_restart_keeps_every_decision_and_lease(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The store restarts between a run's claims: the instances reconnect by themselves, a claim
    made while it is down is away (never won, and won when made again once it is back), and every
    run decided before is still decided, with its lease; a job's catch-up key is kept."""
    if kind == "redis":
        if shutil.which("redis-server") is None:
            pytest.skip("no redis-server here")
        server = OwnRedisServer(tmp_path)
        url, prefix = server.url, "restart."
    else:
        if shutil.which("pg_ctlcluster") is None or os.environ.get("ANARCHON_TEST_POSTGRES"):
            pytest.skip("the PostgreSQL of the tests is not this machine's cluster: not ours to restart")
        url, prefix = request.getfixturevalue("postgres_url"), request.getfixturevalue("postgres_prefix")
    a = open_kind(kind, url, prefix, lease_ms=60_000)
    b = open_kind(kind, url, prefix, lease_ms=60_000)
    try:
        now = a.store_now_ms()  # type: ignore[attr-defined]
        first = Claim("job", now - 10, deadline_ms=now + 120_000, backups=1, key="k")
        assert a.claim([first], "a") == [Outcome.WON]
        if kind == "redis":
            server.kill()
            during = Claim("job", now - 5, deadline_ms=now + 120_000, key="k")
            assert b.claim([during], "b") == [Outcome.AWAY]  # never won while it is gone
            server.start()
            assert b.claim([during], "b") == [Outcome.WON]  # the scheduler's claim made again
        else:
            postgres_servers.system_cluster("restart", "-m", "fast")
        assert b.claim([first], "b") == [Outcome.LOST]  # decided before the restart
        assert [armed.rank for armed in b.armed()] == [1]  # its lease kept: b is a backup
        assert b.take_over([first], "b")[0].kind is TakeoverKind.HELD
        assert a.mark_sent([("job", first.slot, 1)], "a") == [True]
        b.gaps()  # (what the claims above reported)
        # The catch-up key kept with the cursor: a run missed since is caught up.
        caught = Claim("job", now - 2, deadline_ms=now + 120_000, key="k", kind=CATCH_UP)
        assert b.claim([caught], "b") == [Outcome.WON]
        assert [gap.after for gap in b.gaps()] == [now - 5 if kind == "redis" else now - 10]
        later = Claim("job", now, deadline_ms=now + 120_000)
        assert a.claim([later], "a") == [Outcome.WON]
    finally:
        a.close()
        b.close()
        if kind == "redis":
            server.kill()


def _take_over_race(args: tuple[str, str, str, int, Any]) -> list[str]:
    kind, target, prefix, me, start = args
    # The new holder's lease outlasts the race, however busy the machine: the others find it held.
    backend = open_kind(kind, target, prefix, lease_ms=60_000)
    runs = [Claim("race", slot, deadline_ms=None, backups=1) for slot in range(1000, 1040)]
    start.wait()
    try:
        return [f"{t.kind.value}:{t.value}" for t in backend.take_over(runs, f"p{me}")]
    finally:
        backend.close()


@pytest.mark.parametrize("kind", ["sqlite", "redis", "postgres"])
def test_processes_taking_the_same_runs_over_get_one_new_holder_each(
    kind: str, request: pytest.FixtureRequest, prefix: str, tmp_path: Path
) -> None:
    target, prefix = races.place(kind, request, tmp_path, prefix)
    first = open_kind(kind, target, prefix, lease_ms=100)
    try:  # 40 runs won by a winner that then dies: its leases run out
        assert first.claim([Claim("race", slot) for slot in range(1000, 1040)], "dead") == [Outcome.WON] * 40
    finally:
        first.close()
    time.sleep(0.2)
    processes = 4
    results = races.race(_take_over_race, processes, kind, target, prefix)
    for n in range(40):
        answers = Counter(result[n].split(":")[0] for result in results)
        assert answers == {"won": 1, "held": processes - 1}, (n, answers)
        assert [r[n] for r in results if r[n].startswith("won")] == ["won:2"]


def _race(args: tuple[str, str, str, int, int, Any]) -> list[str]:
    kind, target, prefix, rounds, me, start = args
    backend = open_kind(kind, target, prefix)
    start.wait()
    try:
        # Each process claims a batch: its own job's run, and the run every process races for.
        batches = [[Claim(f"own-{me}", 1000 + n), Claim("race", 1000 + n)] for n in range(rounds)]
        return [backend.claim(batch, f"p{me}")[1].value for batch in batches]
    finally:
        backend.close()


@pytest.mark.parametrize("kind", ["rabbitmq", "sqlite", "redis", "postgres"])
def test_processes_racing_for_the_same_runs_get_one_winner_each(
    kind: str, request: pytest.FixtureRequest, prefix: str, tmp_path: Path
) -> None:
    target, prefix = races.place(kind, request, tmp_path, prefix)
    processes, rounds = 6, 100
    results = races.race(_race, processes, kind, target, prefix, rounds)
    for n in range(rounds):
        outcomes = Counter(result[n] for result in results)
        assert outcomes == {"won": 1, "lost": processes - 1}, (n, outcomes)


# -- RabbitMQ specifics ---------------------------------------------------------------------------


def _queue_info(name: str) -> dict[str, Any]:
    fields = ("name", "durable", "auto_delete", "exclusive", "arguments", "type", "messages", "messages_persistent")
    done = control.run_rabbitmqctl("-q", "list_queues", "--formatter", "json", *fields, timeout=60)
    assert done.returncode == 0, done.stderr
    return next(q for q in json.loads(done.stdout) if q["name"] == name)


def test_gate_as_seen_by_the_broker(broker_url: str, prefix: str) -> None:
    backend = rabbit(broker_url, prefix, slot_ttl_ms=45_000)
    assert backend.claim([Claim("job", 1_796_227_653_000)], "me") == [Outcome.WON]
    backend.close()
    info = _queue_info(gate_name(prefix, "job", 1_796_227_653_000))
    assert info["name"] == f"{prefix}job.slot.1796227653000"
    assert (info["durable"], info["auto_delete"], info["exclusive"], info["type"]) == (True, False, False, "classic")
    arguments = {arg[0]: arg[-1] for arg in info["arguments"]}
    assert arguments == {
        "x-max-length": 1,
        "x-overflow": "reject-publish",
        "x-expires": 45_000,
        "x-queue-type": "classic",
    }
    assert (info["messages"], info["messages_persistent"]) == (1, 1)


def test_claim_body_names_the_instance(broker_url: str, prefix: str, connection: Connection) -> None:
    backend = rabbit(broker_url, prefix)
    assert backend.claim([Claim("job", 5)], "host-a:123") == [Outcome.WON]
    backend.close()
    channel = connection.channel()
    message = channel.basic_get(gate_name(prefix, "job", 5), no_ack=False)  # the gate is decided
    body = json.loads(message.body)
    assert (body["job"], body["slot"], body["instance"]) == ("job", 5, "host-a:123")
    assert isinstance(body["claimed_at_ms"], int)
    channel.close()


class _NoDeclare(RabbitMQBackend):
    """Publishes without declaring: as if the gate expired between declare and publish."""

    def _declare_gates(self, gates: list[str]) -> list[Outcome | None]:
        return [None] * len(gates)


def test_an_unroutable_claim_is_not_a_win(broker_url: str, prefix: str) -> None:
    backend = _NoDeclare(broker_url, prefix=prefix, slot_ttl_ms=60_000)
    backend.open()
    assert backend.claim([Claim("gone", 1), Claim("gone", 2)], "me") == [Outcome.UNDECIDED] * 2
    backend.close()
    # The channel was not poisoned: a normal claim on a fresh backend still wins, then loses.
    other = rabbit(broker_url, prefix)
    assert other.claim([Claim("gone", 1)], "me") == [Outcome.WON]
    assert other.claim([Claim("gone", 1)], "me") == [Outcome.LOST]
    other.close()


def test_existing_gates_with_another_ttl_or_durability_are_used(
    broker_url: str, prefix: str, connection: Connection
) -> None:
    channel = connection.channel()
    other_ttl = gate_name(prefix, "job", 1)
    channel.queue_declare(other_ttl, durable=True, auto_delete=False, arguments=gate_arguments(90_000))
    transient = gate_name(prefix, "job", 2)
    channel.queue_declare(transient, durable=False, auto_delete=False, arguments=gate_arguments(60_000))
    both = gate_name(prefix, "job", 3)
    channel.queue_declare(both, durable=False, auto_delete=False, arguments=gate_arguments(120_000))
    no_ttl = gate_name(prefix, "job", 4)
    args = gate_arguments(1)
    del args["x-expires"]
    channel.queue_declare(no_ttl, durable=True, auto_delete=False, arguments=args)
    untyped = gate_name(prefix, "job", 5)  # made without an explicit x-queue-type
    args = gate_arguments(60_000)
    del args["x-queue-type"]
    channel.queue_declare(untyped, durable=True, auto_delete=False, arguments=args)
    a, b = rabbit(broker_url, prefix), rabbit(broker_url, prefix)
    claims = [Claim("job", n) for n in (1, 2, 3, 4, 5)]
    assert a.claim(claims, "a") == [Outcome.WON] * 5
    assert b.claim(claims, "b") == [Outcome.LOST] * 5
    a.close()
    b.close()


@pytest.mark.parametrize(
    "durable, arguments",
    [
        (True, {"x-max-length": 2, "x-overflow": "reject-publish", "x-expires": 60_000}),
        (True, {"x-max-length": 1, "x-overflow": "drop-head", "x-expires": 60_000}),
        (True, {"x-max-length": 1, "x-expires": 60_000}),
        (True, {}),
        (False, {"x-expires": 90_000}),
        (True, {"x-queue-type": "quorum", "x-max-length": 1, "x-overflow": "reject-publish"}),
    ],
)
def test_a_queue_that_is_not_a_gate_never_counts_as_won(
    broker_url: str,
    prefix: str,
    connection: Connection,
    durable: bool,
    arguments: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    name = gate_name(prefix, "job", 7)
    connection.channel().queue_declare(name, durable=durable, auto_delete=False, arguments=arguments)
    backend = rabbit(broker_url, prefix)
    assert backend.claim([Claim("job", 7), Claim("job", 8)], "me") == [Outcome.BAD_GATE, Outcome.WON]
    assert backend.claim([Claim("job", 7)], "me") == [Outcome.BAD_GATE]
    backend.close()
    assert f"queue '{name}' exists but is not a gate" in caplog.text
    assert connection.channel().queue_declare(name, passive=True).message_count == 0


def test_gates_refused_run_after_run_keep_no_channel_open(broker_url: str, prefix: str, connection: Connection) -> None:
    # py-amqp opens a channel the broker closed again at once: each refused declare used to leave
    # one open (two with the adoption's declare), until the connection ran out of channels.
    name = gate_name(prefix, "job", 7)
    connection.channel().queue_declare(name, durable=True, auto_delete=False, arguments={})  # not a gate
    backend = rabbit(broker_url, prefix)
    try:
        for slot in range(1, 11):
            assert backend.claim([Claim("job", 7), Claim("other", slot)], "me") == [Outcome.BAD_GATE, Outcome.WON]
        channels = backend.link.connection.connection.channels  # id 0: the connection itself
        open_channels = [c for n, c in channels.items() if n and c.is_open]
        assert len(open_channels) <= 3, len(open_channels)  # declares, claims, and one closing
    finally:
        backend.close()


def test_a_gate_the_broker_refuses_costs_only_its_own_run(broker_url: str, prefix: str) -> None:
    with Connection(broker_url) as other, Connection(broker_url) as mine:
        # An exclusive queue of another connection, named like job j's gate: 405 RESOURCE_LOCKED.
        other.default_channel.queue_declare(gate_name(prefix, "j", 1), exclusive=True)
        backend = RabbitMQBackend(connection=mine, prefix=prefix, slot_ttl_ms=60_000)
        backend.open()
        raw = mine.connection
        claims = [Claim("j", 1), Claim("k", 1)]
        assert backend.claim(claims, "me") == [Outcome.BAD_GATE, Outcome.WON]
        assert mine.connection is raw  # the caller's connection was neither closed nor replaced
        backend.close()


def test_a_gate_said_to_live_on_a_node_down_is_declared_once_more_before_its_run_is_away(
    broker_url: str, prefix: str
) -> None:
    # RabbitMQ 4.3.6 answered one of six clients racing to declare a new gate, on a single node
    # that was up, with this 404. A first declare that gets it is made once more at once: the gate
    # is used if it answers, and its run is away (claimed again later) only if the 404 holds.
    backend = rabbit(broker_url, prefix)
    gate, missing = gate_name(prefix, "j", 1), gate_name(prefix, "j", 2)
    backend.claim([Claim("j", 1)], "me")  # the gate exists, on the node that answers

    def reply(name: str) -> str:
        where = f"home node 'rabbit@elsewhere' of durable queue '{name}' in vhost '/'"
        return f"NOT_FOUND - {where} is down or inaccessible"

    try:
        backend.link.connect(None)
        assert gates._refused(backend.link, gate, reply(gate), 60_000, logging.WARNING, again=True) is None
        assert gates._refused(backend.link, missing, reply(missing), 60_000, logging.WARNING, again=True) is None
        assert gates._refused(backend.link, gate, reply(gate), 60_000, logging.DEBUG, again=False) is Outcome.AWAY
        stopped = f"NOT_FOUND - queue '{gate}' in vhost '/' process is stopped by supervisor"
        assert gates._refused(backend.link, gate, stopped, 60_000, logging.WARNING, again=True) is Outcome.AWAY
    finally:
        backend.close()


def test_a_batch_of_claims_is_declared_pipelined_with_every_rule_of_one_claim(
    broker_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    with Connection(broker_url) as other:
        channel = other.channel()
        # Mid-batch, queues the broker objects to: each closes the declaring channel, taking the
        # declares written after it along; those are written again.
        channel.queue_declare(gate_name(prefix, "j", 10), durable=True, auto_delete=False, arguments={})
        channel.queue_declare(
            gate_name(prefix, "j", 20), durable=True, auto_delete=False, arguments=gate_arguments(90_000)
        )
        other.default_channel.queue_declare(gate_name(prefix, "j", 30), exclusive=True)
        backend = rabbit(broker_url, prefix)
        claims = [Claim("j", n) for n in range(50)]
        expected = [Outcome.WON] * 50
        expected[10] = expected[30] = Outcome.BAD_GATE  # not a gate; locked by another connection
        assert backend.claim(claims, "me") == expected  # 20: another TTL, adopted
        assert backend.claim(claims, "me") == [Outcome.LOST if o is Outcome.WON else o for o in expected]
        backend.close()
    assert f"queue '{gate_name(prefix, 'j', 10)}' exists but is not a gate" in caplog.text


def test_gates_prepared_ahead_are_claimed_without_declaring_them_again(broker_url: str, prefix: str) -> None:
    a, b = rabbit(broker_url, prefix), rabbit(broker_url, prefix)
    a.prepare([Claim("j", n) for n in range(20)])
    a.await_prepared(10)
    with Connection(broker_url) as conn:
        # The gates exist before their claims, and are empty.
        for n in range(20):
            assert conn.default_channel.queue_declare(gate_name(prefix, "j", n), passive=True).message_count == 0
        # A prepared gate that vanishes before its claim (deleted by hand): the claim is returned
        # as unroutable, never taken for a win.
        conn.default_channel.queue_delete(gate_name(prefix, "j", 7))
    outcomes = a.claim([Claim("j", n) for n in range(20)], "a")
    assert outcomes == [Outcome.UNDECIDED if n == 7 else Outcome.WON for n in range(20)]
    assert b.claim([Claim("j", n) for n in range(20)], "b") == [
        Outcome.WON if n == 7 else Outcome.LOST for n in range(20)
    ]
    a.close()
    b.close()


def test_prepare_does_not_wait_for_the_broker(
    proxy: Proxy, broker_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="anarchon_celery")
    backend = RabbitMQBackend(proxy.url(), prefix=prefix, slot_ttl_ms=60_000, confirm_timeout=1.0)
    backend.open()
    backend.prepare([Claim("j", 1)])
    backend.await_prepared(10)  # its connection is up
    proxy.stall()
    backend.prepare([Claim("j", n) for n in range(2, 6)])  # written; the answers are held
    backend.maintain()  # and not waited for either
    proxy.resume()
    assert "not declared ahead" not in caplog.text
    backend.await_prepared(10)
    with Connection(broker_url) as conn:
        conn.default_channel.queue_delete(gate_name(prefix, "j", 3))  # by hand, after its declare
    # Answered while stalled, taken in afterwards: the claims do not declare those gates again.
    assert backend.claim([Claim("j", n) for n in range(1, 6)], "me") == [
        Outcome.UNDECIDED if n == 3 else Outcome.WON for n in range(1, 6)
    ]
    backend.close()


def test_a_bad_gate_among_prepared_ones_costs_only_its_own_run(broker_url: str, prefix: str) -> None:
    with Connection(broker_url) as conn:
        conn.default_channel.queue_declare(gate_name(prefix, "j", 3), durable=True, auto_delete=False)  # not a gate
    backend = rabbit(broker_url, prefix)
    claims = [Claim("j", n) for n in range(8)]
    # The broker closes the channel at gate 3, dropping the declares after it: they are written again.
    backend.prepare(claims)
    backend.await_prepared(10)
    backend.prepare([Claim("j", 9)])
    backend.await_prepared(10)
    with Connection(broker_url) as conn:
        for n in [4, 5, 6, 7, 9]:
            assert conn.default_channel.queue_declare(gate_name(prefix, "j", n), passive=True).message_count == 0
        conn.default_channel.queue_delete(gate_name(prefix, "j", 6))  # by hand: its claim must not declare it
    assert backend.claim([*claims, Claim("j", 9)], "me") == [
        {3: Outcome.BAD_GATE, 6: Outcome.UNDECIDED}.get(n, Outcome.WON) for n in [*range(8), 9]
    ]
    backend.close()


def test_prepare_recovers_from_a_lost_connection(
    proxy: Proxy, broker_url: str, prefix: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level("INFO", logger="anarchon_celery")
    monkeypatch.setattr(ahead, "PREPARE_BACKOFF", 1.0)
    backend = RabbitMQBackend(proxy.url(), prefix=prefix, slot_ttl_ms=60_000, confirm_timeout=1.0)
    backend.open()
    backend.prepare([Claim("j", 1)])
    backend.await_prepared(10)
    proxy.cut()  # every connection, the backend's and the one of its declares ahead
    backend.prepare([Claim("j", 2)])
    backend.await_prepared(5)
    assert "not declared ahead" in caplog.text
    backend.prepare([Claim("j", 3)])  # not at once (PREPARE_BACKOFF): the claims declare their gates meanwhile
    backend.await_prepared(10)
    with Connection(broker_url) as conn, pytest.raises(Exception, match="NOT_FOUND"):
        conn.default_channel.queue_declare(gate_name(prefix, "j", 3), passive=True)
    assert backend.claim([Claim("j", 1), Claim("j", 2)], "me") == [Outcome.WON, Outcome.WON]
    time.sleep(1.1)
    backend.prepare([Claim("j", 3)])  # after the pause: on a new connection
    backend.await_prepared(10)
    with Connection(broker_url) as conn:
        assert conn.default_channel.queue_declare(gate_name(prefix, "j", 3), passive=True).message_count == 0
    backend.close()


def test_a_claim_past_its_deadline_does_not_even_declare_its_gate(broker_url: str, prefix: str) -> None:
    backend = rabbit(broker_url, prefix)
    assert backend.claim([Claim("j", 1, deadline_ms=clock.now_ms() - 1)], "me") == [Outcome.UNDECIDED]
    backend.close()
    with Connection(broker_url) as conn, pytest.raises(Exception, match="NOT_FOUND"):
        conn.default_channel.queue_declare(gate_name(prefix, "j", 1), passive=True)


def test_history_is_given_up_at_once_when_rabbitmq_goes_away(proxy: Proxy, prefix: str) -> None:
    backend = RabbitMQBackend(proxy.url(), prefix=prefix, slot_ttl_ms=60_000, confirm_timeout=1.0)
    streams = backend._streams
    calls: list[int] = []  # the attempts of each event written one by one
    record = streams.record

    def counting(*args: Any, attempts: int = 3) -> bool:
        calls.append(attempts)
        return record(*args, attempts=attempts)

    streams.record = counting  # type: ignore[method-assign]
    backend.open()
    assert backend.ensure_history("job", 10)
    proxy.close()  # every connection cut, and no new one accepted
    events = [("job", _sent(f"r{n:02d}", 1000 + n), 10) for n in range(40)]
    assert backend.record_many(events) == 0
    # The batch failed on the lost connection; of the forty events written again one by one, the
    # first failure stops the rest (each would retry for seconds while the next claims wait).
    assert calls == [1]  # and that one tried once only
    backend.close()


def test_a_callers_confirm_publish_connection_is_used_as_well(broker_url: str, prefix: str) -> None:
    with Connection(broker_url, transport_options={"confirm_publish": True}) as theirs:
        backend = RabbitMQBackend(connection=theirs, prefix=prefix, slot_ttl_ms=60_000)
        backend.open()
        claims = [Claim("job", 1), Claim("job", 2)]
        assert backend.claim(claims, "a") == [Outcome.WON, Outcome.WON]
        assert backend.claim(claims, "a") == [Outcome.LOST, Outcome.LOST]  # a nack is a loss, not an error
        backend.close()


def test_a_connection_passed_in_is_never_closed(broker_url: str, prefix: str) -> None:
    with Connection(broker_url) as mine:
        backend = RabbitMQBackend(connection=mine, prefix=prefix)
        backend.open()
        assert backend.claim([Claim("job", 1)], "me") == [Outcome.WON]
        backend.close()
        assert mine.connected
        mine.default_channel.queue_declare(gate_name(prefix, "job", 1), passive=True)


def test_the_password_is_never_shown(prefix: str) -> None:
    backend = RabbitMQBackend(control.url_with(password="s3cr3t-pw"), prefix=prefix)
    assert "s3cr3t-pw" not in backend.describe()
    assert "guest:**@127.0.0.1" in backend.describe()


def test_an_unreachable_broker_is_a_clear_error(prefix: str) -> None:
    backend = RabbitMQBackend("amqp://guest:s3cr3t-pw@127.0.0.1:1//", prefix=prefix)
    with pytest.raises(BrokerError, match="cannot reach RabbitMQ at amqp://guest:\\*\\*@127.0.0.1:1//") as info:
        backend.open()
    assert "s3cr3t-pw" not in str(info.value)


@pytest.mark.parametrize(
    "properties, expected",
    [
        ({"product": b"RabbitMQ", "version": b"3.10.8"}, (3, 10, 8)),
        ({"product": "RabbitMQ", "version": "4.1.0"}, (4, 1, 0)),
        ({"product": b"RabbitMQ", "version": b"3.9.0"}, (3, 9, 0)),
        ({"product": b"RabbitMQ", "version": b"3.8.35"}, "needs RabbitMQ 3.9 or newer"),
        ({"product": b"LavinMQ", "version": b"2.0.0"}, "is LavinMQ 2.0.0"),
        ({}, "an unknown broker of unknown version"),
    ],
)
def test_broker_version_check(properties: dict[str, Any], expected: Any) -> None:
    if isinstance(expected, tuple):
        assert check_server(properties, "amqp://x") == expected
    else:
        with pytest.raises(BrokerError, match=expected):
            check_server(properties, "amqp://x")


def test_the_connected_broker_passes_the_version_check(broker_url: str, prefix: str) -> None:
    backend = rabbit(broker_url, prefix)
    assert backend.server_version >= (3, 9)
    backend.close()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"url": "redis://localhost"}, "needs AMQP URLs .*, not redis://localhost"),
        ({"url": "amqp://a;redis://:pw@b//"}, "not redis://:\\*\\*@b//"),
        ({"url": ["amqp://a", 5672]}, "not 5672"),
        ({"url": []}, "needs at least one AMQP URL"),
        ({"prefix": "a b"}, "invalid prefix"),
        ({"prefix": "amq.cron."}, "reserves names starting with 'amq.'"),
        ({"url": "redis://user:s3cr3t@localhost"}, "not redis://user:\\*\\*@localhost"),
        ({"slot_ttl_ms": -1}, "slot_ttl_ms must be a positive integer"),
        ({"confirm_timeout": 0}, "confirm_timeout"),
        ({"connection": "amqp://x"}, "connection must be a kombu Connection"),
    ],
)
def test_bad_backend_options(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RabbitMQBackend(**kwargs)


# -- lost answers ---------------------------------------------------------------------------------


class _Hooked(RabbitMQBackend):
    """Runs `after_declare` once, between a gate's declare and the claim's publish."""

    after_declare: Any = None

    def _declare_gates(self, gates: list[str]) -> list[Outcome | None]:
        usable = super()._declare_gates(gates)
        hook, self.after_declare = self.after_declare, None
        if hook is not None:
            hook()
        return usable


@pytest.fixture
def proxy(broker_url: str) -> Iterator[Proxy]:
    p = Proxy()
    yield p
    p.close()


def stall_for(proxy: Proxy, seconds: float) -> Any:
    """A hook: the broker's answers are held for `seconds`, then let through."""

    def hook() -> None:
        proxy.stall()
        threading.Timer(seconds, proxy.resume).start()

    return hook


def test_a_claim_without_an_answer_is_made_again_and_never_wins_twice(
    proxy: Proxy, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    backend = _Hooked(proxy.url(), prefix=prefix, slot_ttl_ms=60_000, confirm_timeout=1.0)
    backend.open()
    assert backend.claim([Claim("job", 0)], "me") == [Outcome.WON]  # channels are open
    first = backend.connection.connection
    # The publish reaches the broker; its ack is held past confirm_timeout. On a new connection the
    # claim is made again: the gate is held (by our own first claim), so it is lost, never doubled.
    backend.after_declare = stall_for(proxy, 1.5)
    assert backend.claim([Claim("job", 1)], "me") == [Outcome.LOST]
    assert "job 'job' slot 1: no answer to the claim (TimeoutError" in caplog.text
    assert "claiming it again on a new connection" in caplog.text
    assert backend.connection.connection is not first  # never read a late ack on the old one
    backend.close()


def test_a_claim_that_never_reached_the_broker_is_made_again_and_wins(
    proxy: Proxy, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    backend = _Hooked(proxy.url(), prefix=prefix, slot_ttl_ms=60_000, confirm_timeout=2.0)
    backend.open()
    backend.after_declare = proxy.cut  # the publish never reaches the broker: the gate stays empty
    assert backend.claim([Claim("job", 1)], "me") == [Outcome.WON]
    assert "job 'job' slot 1: no answer to the claim" in caplog.text
    assert make_claim(prefix, Claim("job", 1)) == Outcome.LOST  # and it is held, once
    backend.close()


def test_without_retries_an_unanswered_claim_is_not_won(proxy: Proxy, prefix: str) -> None:
    backend = _Hooked(proxy.url(), prefix=prefix, slot_ttl_ms=60_000, confirm_timeout=1.0)
    backend.claim_retries = 0
    backend.open()
    assert backend.claim([Claim("job", 0)], "me") == [Outcome.WON]
    backend.after_declare = stall_for(proxy, 1.5)
    assert backend.claim([Claim("job", 1)], "me") == [Outcome.UNDECIDED]
    time.sleep(1)
    assert backend.claim([Claim("job", 1), Claim("job", 2)], "me") == [Outcome.LOST, Outcome.WON]
    backend.close()


def test_a_callers_connection_survives_a_lost_answer(proxy: Proxy, prefix: str) -> None:
    with Connection(proxy.url()) as theirs:
        backend = _Hooked(connection=theirs, prefix=prefix, slot_ttl_ms=60_000, confirm_timeout=1.0)
        backend.open()
        assert backend.claim([Claim("job", 0)], "me") == [Outcome.WON]  # channels are open
        backend.after_declare = stall_for(proxy, 1.5)
        assert backend.claim([Claim("job", 1)], "me") == [Outcome.LOST]  # made again: held by the first
        assert backend.claim([Claim("job", 2)], "me") == [Outcome.WON]
        backend.close()
        assert theirs.connected


@pytest.mark.timeout(60)  # a claim stuck on the silent broker would hang here
def test_a_broker_silent_at_connect_time_is_not_waited_for_past_the_deadline(
    proxy: Proxy, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The black hole: TCP connects, the broker never answers the handshake, nothing is closed.
    proxy.stall()
    # Each connection attempt gives up after connect_timeout: 2 s keeps open()'s four short.
    backend = RabbitMQBackend(proxy.url(), prefix=prefix, slot_ttl_ms=60_000, confirm_timeout=1.0, connect_timeout=2.0)
    with pytest.raises(BrokerError, match="cannot reach RabbitMQ"):
        backend.open()
    assert backend.claim([Claim("job", 1, deadline_ms=clock.now_ms() + 1000)], "me") == [Outcome.UNDECIDED]
    assert "RabbitMQ at amqp://guest:**@127.0.0.1" in caplog.text and "is unavailable" in caplog.text
    proxy.resume()
    assert backend.claim([Claim("job", 2, deadline_ms=clock.now_ms() + 20_000)], "me") == [Outcome.WON]
    assert backend.server_version >= (3, 9)  # checked on the first connection that worked
    assert "is back after" in caplog.text
    backend.close()


def make_claim(prefix: str, claim: Claim) -> Outcome:
    backend = rabbit(control.BROKER, prefix)
    try:
        return backend.claim([claim], "other")[0]
    finally:
        backend.close()


def test_maintain_keeps_an_idle_connection_alive(broker_url: str, prefix: str) -> None:
    backend = rabbit(broker_url, prefix, heartbeat=2)
    assert backend.claim([Claim("job", 1)], "me") == [Outcome.WON]
    raw = backend.connection.connection
    idle = backend.max_idle_s()
    assert idle is not None
    # Idle for several heartbeat intervals, waking up as the scheduler would: without heartbeats
    # the broker would close the connection after two missed intervals.
    for _ in range(int(8 / idle)):
        time.sleep(idle)
        backend.maintain()
    assert backend.claim([Claim("job", 2)], "me") == [Outcome.WON]
    assert backend.connection.connection is raw  # the same connection, never re-established
    backend.close()


def test_a_connection_dropped_while_idle_is_replaced_before_claiming(proxy: Proxy, prefix: str) -> None:
    backend = RabbitMQBackend(proxy.url(), prefix=prefix, slot_ttl_ms=60_000)
    backend.open()
    assert backend.claim([Claim("job", 1)], "me") == [Outcome.WON]
    proxy.cut()  # as a broker restart or a dropped idle connection would
    assert backend.claim([Claim("job", 2)], "me") == [Outcome.WON]
    backend.close()


# -- history --------------------------------------------------------------------------------------


def _sent(run: str, at: int) -> bytes:
    return encode_event("sent", run=run, job="job", at_ms=at, slot=at, task_id=run, trigger="schedule")


def test_history_is_recorded_and_read_back_in_order(make_backend: Any) -> None:
    backend = make_backend()
    assert backend.read_history(["job", "other"]) == {"job": [], "other": []}
    for n in range(3):
        assert backend.record("job", _sent(f"r{n}", 1000 + n), 10)
    assert backend.record("job", encode_event("running", run="r2", job="job", at_ms=2000, worker="w"), 10)
    events = backend.read_history(["job", "other"])
    assert [(e["run"], e["event"]) for e in events["job"]] == [
        ("r0", "sent"),
        ("r1", "sent"),
        ("r2", "sent"),
        ("r2", "running"),
    ]
    assert events["other"] == []
    assert [run.status for run in fold(events["job"])] == ["running", "sent", "sent"]


def test_many_history_events_are_recorded_at_once(make_backend: Any) -> None:
    backend = make_backend()
    events = [(f"job{n % 3}", _sent(f"r{n:02d}", 1000 + n), 50) for n in range(30)]
    assert backend.record_many(events) == 30
    history = backend.read_history(["job0", "job1", "job2"])
    for j in range(3):
        assert [e["run"] for e in history[f"job{j}"]] == [f"r{n:02d}" for n in range(j, 30, 3)]


def test_a_pause_in_the_deliveries_does_not_cut_a_history_short(broker_url: str, prefix: str, proxy: Proxy) -> None:
    writer = rabbit(broker_url, prefix)
    count = 2000
    assert writer.record_many([("job", _sent(f"r{n:04d}", 1000 + n), count) for n in range(count)]) == count
    writer.close()
    reader = rabbit(proxy.url(), prefix)
    proxy.stall_after(60_000)  # in the middle of the deliveries (about 300 kB of them)...

    def resume() -> None:
        while not proxy.stalled:
            time.sleep(0.01)
        time.sleep(1.5)  # ...for three times as long as the old idle end of 0.5 s
        proxy.resume()

    threading.Thread(target=resume, daemon=True).start()
    events = reader.read_history(["job"])["job"]
    reader.close()
    assert [e["run"] for e in events] == [f"r{n:04d}" for n in range(count)]


@pytest.mark.timeout(90)
def test_a_history_being_written_all_along_is_read_to_a_fixed_end(broker_url: str, prefix: str) -> None:
    """Read while a writer keeps adding events: every read ends, in order, and without the
    deliveries that RabbitMQ 3.10 can send before a stream consumer's consume-ok (py-amqp
    rejected those, and a reject on a stream closes the connection)."""
    writer = rabbit(broker_url, prefix)
    stop = threading.Event()
    written = [0]

    def write() -> None:
        while not stop.is_set():
            n = written[0]
            writer.record_many([("job", _sent(f"r{n + i:07d}", n + i), 200) for i in range(100)])
            written[0] += 100
            time.sleep(0.01)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    reader = rabbit(broker_url, prefix)
    try:
        for _ in range(8):
            runs = [e["run"] for e in reader.read_history(["job"])["job"]]
            assert runs == sorted(runs) and len(set(runs)) == len(runs)
        assert runs, "the reads found nothing written"
    finally:
        stop.set()
        thread.join()
        writer.close()
        reader.close()


def test_history_streams_are_trimmed_by_size(broker_url: str, prefix: str) -> None:
    backend = rabbit(broker_url, prefix)
    history_size = 5
    for n in range(200):  # each run: sent, running, succeeded
        run = f"run-{n:04d}-{'x' * 30}"
        backend.record("job", _sent(run, n * 10), history_size)
        backend.record("job", encode_event("running", run=run, job="job", at_ms=n * 10 + 1, worker="w@h"), history_size)
        backend.record(
            "job", encode_event("succeeded", run=run, job="job", at_ms=n * 10 + 2, worker="w@h"), history_size
        )
    time.sleep(0.5)  # the last publishes are not confirmed: let the broker take them
    retained = fold(backend.read_history(["job"])["job"])
    backend.close()
    # Retention drops whole segments: at least history_size runs stay, and far fewer than written.
    assert history_size <= len(retained) <= 4 * history_size, len(retained)
    assert retained[0].run_id.startswith("run-0199") and retained[0].status == "succeeded"


def test_a_history_stream_keeps_its_first_size(broker_url: str, prefix: str, caplog: pytest.LogCaptureFixture) -> None:
    first = rabbit(broker_url, prefix)
    assert first.record("job", _sent("a", 1), 5)
    first.close()
    later = rabbit(broker_url, prefix)  # configured with another history_size: used as it is
    assert later.record("job", _sent("b", 2), 500)
    time.sleep(0.3)
    assert [e["run"] for e in later.read_history(["job"])["job"]] == ["a", "b"]
    later.close()
    info = _queue_info(history_name(prefix, "job"))
    arguments = {arg[0]: arg[-1] for arg in info["arguments"]}
    assert arguments == history_arguments(5) and info["type"] == "stream"


def test_a_queue_named_like_a_history_that_is_no_stream(
    broker_url: str, prefix: str, connection: Connection, caplog: pytest.LogCaptureFixture
) -> None:
    connection.default_channel.queue_declare(history_name(prefix, "job"), durable=True, auto_delete=False)
    backend = rabbit(broker_url, prefix)
    assert backend.record("job", _sent("a", 1), 5) is False
    assert f"queue '{history_name(prefix, 'job')}' exists but is not a history stream" in caplog.text
    assert backend.claim([Claim("job", 1)], "me") == [Outcome.WON]  # claims are not affected
    backend.close()


def test_streams_are_available(broker_url: str, prefix: str) -> None:
    backend = rabbit(broker_url, prefix)
    backend.check_history()
    backend.close()


# -- instances that disagree ----------------------------------------------------------------------

DAILY = {"task": "t.report", "schedule": "cron '0 3 * * *' Europe/Paris", "args": "()"}


@pytest.mark.parametrize("kind", ["rabbitmq", "memory", "sqlite", "redis", "postgres"])
def test_instances_that_define_a_job_differently_both_say_so(
    kind: str, request: pytest.FixtureRequest, prefix: str, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    shared = MemoryBackend(prefix=prefix)
    a: Backend
    b: Backend
    if kind == "rabbitmq":
        broker_url = request.getfixturevalue("broker_url")
        a, b = rabbit(broker_url, prefix), rabbit(broker_url, prefix)
    elif kind == "sqlite":
        a, b = SQLiteBackend(tmp_path / "a.db", prefix=prefix), SQLiteBackend(tmp_path / "a.db", prefix=prefix)
    elif kind == "redis":
        redis_url, prefix = request.getfixturevalue("redis_url"), request.getfixturevalue("redis_prefix")
        a, b = RedisBackend(redis_url, prefix=prefix), RedisBackend(redis_url, prefix=prefix)
    elif kind == "postgres":
        postgres_url, prefix = request.getfixturevalue("postgres_url"), request.getfixturevalue("postgres_prefix")
        a, b = PostgresBackend(postgres_url, prefix=prefix), PostgresBackend(postgres_url, prefix=prefix)
    else:
        a, b = shared, shared
    tokyo = dict(DAILY, schedule="cron '0 3 * * *' Asia/Tokyo")
    with caplog.at_level(logging.WARNING, logger="anarchon_celery"):
        a.share_definitions("old:1", {"report": DAILY, "same": DAILY, "gone": DAILY})
        b.share_definitions("new:2", {"report": tokyo, "same": DAILY})
        for _ in range(20):  # the announcements are read when each instance next wakes
            a.maintain()
            b.maintain()
            if len(caplog.records) >= 4:
                break
            time.sleep(0.1)
        for backend in (a, b):
            backend.maintain()
    lines = sorted(record.getMessage() for record in caplog.records)
    assert len(lines) == 4, lines  # each side, once per job that differs: never for "same"
    assert sum("job 'report' is defined differently by instance new:2" in line for line in lines) == 1
    assert sum("job 'report' is defined differently by instance old:1" in line for line in lines) == 1
    assert any(
        "schedule cron '0 3 * * *' Europe/Paris here, cron '0 3 * * *' Asia/Tokyo there" in line for line in lines
    )
    assert any("job 'gone' is defined differently by instance old:1: it runs it, and this" in line for line in lines)
    a.close()
    b.close()
