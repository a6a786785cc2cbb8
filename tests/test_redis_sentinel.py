"""Redis behind Sentinel: ``sentinel://`` URLs (no server needed), and a real failover under
running `celery beat` processes: the master killed, a replica promoted, every run sent once."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from anarchon_celery import ConfigError, RedisBackend
from anarchon_celery.backends import backend_for
from anarchon_celery.settings import Settings

from .support.redis_servers import SentinelGroup
from .test_backup_runners import _tokens
from .test_faults import Fleet, assert_each_run_once

SENTINELS = "sentinel://:s3cret@10.0.0.1:26379/2;sentinel://:s3cret@10.0.0.2:26380/2"


def test_a_sentinel_url_names_the_master_and_every_sentinel_never_the_password() -> None:
    backend = RedisBackend(f"{SENTINELS}?master_name=billing", prefix="p.")  # nothing is reached here
    shown = backend.describe()
    assert shown == "Redis master 'billing' through Sentinel 10.0.0.1:26379,10.0.0.2:26380, database 2 (prefix 'p.')"
    pool = backend.client.connection_pool
    assert pool.connection_kwargs["password"] == "s3cret"  # the master's
    assert pool.connection_kwargs["socket_timeout"] == backend.timeout
    assert backend.client.get_retry().get_retries() == 0  # a claim is never sent again behind our back
    assert backend.wait_replicas == 0


def test_a_sentinel_client_of_yours_is_named_as_such() -> None:
    from redis.sentinel import Sentinel

    client = Sentinel([("10.0.0.1", 26379), ("10.0.0.2", 26379)]).master_for("billing", password="s3cret", db=3)
    shown = RedisBackend(client=client, prefix="p.").describe()  # nothing is reached here
    assert shown == "Redis master 'billing' through Sentinel 10.0.0.1:26379,10.0.0.2:26379, database 3 (prefix 'p.')"


def test_a_sentinel_url_without_a_master_name_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"names no master: add \?master_name=NAME") as raised:
        RedisBackend(SENTINELS)
    assert "s3cret" not in str(raised.value)
    with pytest.raises(ConfigError, match="is not a sentinel://host:port URL"):
        RedisBackend("sentinel://10.0.0.1:26379;redis://10.0.0.2?master_name=m")


@pytest.mark.parametrize(
    "url, given, expected",
    [
        ("redis://10.0.0.1/0?wait_replicas=1", {}, (1, 1_000)),
        ("redis://10.0.0.1/0?wait_replicas=2&wait_timeout_ms=250", {}, (2, 250)),
        (f"{SENTINELS}?master_name=m&wait_replicas=1", {"wait_timeout_ms": 50}, (1, 50)),
        ("redis://10.0.0.1/0", {"wait_replicas": 1}, (1, 1_000)),
    ],
)
def test_waiting_for_replicas_is_set_in_the_url_or_as_arguments(
    url: str, given: dict[str, int], expected: tuple[int, int]
) -> None:
    backend = RedisBackend(url, **given)
    assert (backend.wait_replicas, backend.wait_timeout_ms) == expected
    assert "wait_" not in str(backend.client.connection_pool.connection_kwargs)  # not given to redis-py


@pytest.mark.parametrize(
    "url, given, message",
    [
        ("redis://h/0?wait_replicas=one", {}, "wait_replicas in the Redis URL must be an integer >= 0, not 'one'"),
        ("redis://h/0?wait_replicas=1", {"wait_replicas": 2}, "wait_replicas is 2 but the Redis URL says 1"),
        ("redis://h/0", {"wait_timeout_ms": -1}, "wait_timeout_ms must be an integer >= 0, not -1"),
    ],
)
def test_bad_replica_waits_are_refused(url: str, given: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RedisBackend(url, **given)


def test_an_apps_sentinel_broker_decides_the_runs_on_its_master() -> None:
    app = Celery("proj", broker=SENTINELS, set_as_current=False)
    app.conf.broker_transport_options = {"master_name": "tasks-master"}
    backend = backend_for(app, Settings.from_app(app))
    assert isinstance(backend, RedisBackend)
    assert backend.describe().startswith("Redis master 'tasks-master' through Sentinel 10.0.0.1:26379,10.0.0.2:26380")


@pytest.mark.broker
@pytest.mark.stores
@pytest.mark.processes
@pytest.mark.timeout(240)
def test_a_sentinel_failover_under_running_beats_loses_and_doubles_no_run(
    beat_env: dict[str, str],
    broker_url: str,
    prefix: str,
    tmp_path: Path,
) -> None:
    """The master is killed; the sentinels promote a replica (about 2 s); the beats, waiting for a
    replica's acknowledgement of each win (wait_replicas=1), claim the runs due meanwhile on the
    new master: each is sent once, none twice."""
    if shutil.which("redis-server") is None:
        pytest.skip("no redis-server here")
    group = SentinelGroup(tmp_path / "redis")
    env = dict(
        beat_env,
        HISTORY_APP_BACKEND=group.url("wait_replicas=1"),
        HISTORY_APP_EVERY="1",
        HISTORY_APP_MAX_LATE_MS="30000",
        HISTORY_APP_LEASE_MS="12000",
        HISTORY_APP_SLOT_TTL_MS="120000",
        HISTORY_APP_JITTER_MS="800",
    )
    fleet = None
    try:
        fleet = Fleet(tmp_path, [env] * 3)
        fleet.wait_ready()
        fleet.wait_any("won, sent", fleet.offsets())
        time.sleep(2)
        before = fleet.offsets()
        old = group.master_port()
        group.server_on(old).kill()
        new = group.wait_failover(old)
        fleet.wait_any("is back after", before, timeout=60)
        fleet.wait_any(f"Redis master 'main' (now 127.0.0.1:{new})", before, timeout=30)
        time.sleep(6)
        fleet.stop()
    finally:
        if fleet is not None:
            fleet.kill()
        group.kill()
    tokens = _tokens(broker_url, prefix)
    assert all(sent == [1] for sent in tokens.values()), {s: t for s, t in tokens.items() if t != [1]}
    assert_each_run_once(list(tokens))
    text = "".join(fleet.text(i) for i in range(3))
    assert "through Sentinel" in text and "Traceback" not in text
    assert "not run by this instance" not in text


def test_a_win_no_replica_acknowledged_is_not_counted_until_one_does(tmp_path: Path) -> None:
    """wait_replicas=1 on a master without a replica: the win is made, but not counted (AWAY, made
    again until its deadline); once a replica has it, the same claim finds it won."""
    if shutil.which("redis-server") is None:
        pytest.skip("no redis-server here")
    from anarchon_celery import Claim, Outcome, clock

    from .support.redis_servers import OwnRedisServer

    master = OwnRedisServer(tmp_path / "master")
    replica = None
    a = RedisBackend(f"{master.url}?wait_replicas=1&wait_timeout_ms=100", prefix="w.")
    b = RedisBackend(master.url, prefix="w.")
    try:
        a.open()
        run = Claim("job", clock.now_ms() - 10, deadline_ms=clock.now_ms() + 60_000)
        assert a.claim([run], "a") == [Outcome.AWAY]
        assert b.claim([run], "b") == [Outcome.LOST]  # decided all the same: by a, on the master
        replica = OwnRedisServer(tmp_path / "replica", replica_of=master.port)
        deadline = time.monotonic() + 30
        while int(master_info(master.url)["connected_slaves"]) < 1:
            assert time.monotonic() < deadline, "the replica did not connect"
            time.sleep(0.1)
        assert a.claim([run], "a") == [Outcome.WON]  # its win, now on a replica too
    finally:
        a.close()
        b.close()
        if replica is not None:
            replica.kill()
        master.kill()


def master_info(url: str) -> dict[str, Any]:
    import redis

    client = redis.Redis.from_url(url)
    try:
        return dict(client.info("replication"))
    finally:
        client.close()
