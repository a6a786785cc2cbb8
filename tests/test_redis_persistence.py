"""A Redis store that keeps nothing on disk (``appendonly no``, ``save ''``) forgets every cursor,
run record and lease when it restarts: `celery anarchon check` warns of it (and still exits 0),
and so does each beat at start, in one WARNING line; a Redis with an append-only file or a
``save`` rule gets neither. Each case on a redis-server of the test's own."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from .support.redis_servers import OwnRedisServer
from .test_cli import celery
from .test_faults import kill, start_beat, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.processes, pytest.mark.stores]

NOTHING_ON_DISK = "keeps nothing on disk (appendonly no, save ''): when it restarts, every job's cursor"
FIX = "Turn persistence on: CONFIG SET appendonly yes, and appendonly yes in redis.conf"

#: How each case configures its server (started with an append-only file), and whether it keeps nothing.
PERSISTENCE = {
    "nothing": ({"appendonly": "no", "save": ""}, True),
    "append-only": ({}, False),
    "snapshots": ({"appendonly": "no", "save": "3600 1"}, False),
}


@pytest.fixture(params=sorted(PERSISTENCE))
def redis_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[OwnRedisServer, bool]]:
    """A redis-server of the test's own, persisted as the case says; and whether it keeps nothing."""
    if shutil.which("redis-server") is None:
        pytest.skip("no redis-server here")
    import redis

    config, keeps_nothing = PERSISTENCE[request.param]
    server = OwnRedisServer(tmp_path / "redis")  # (stops itself when it fails to start)
    try:
        with redis.Redis(port=server.port) as admin:
            for name, value in config.items():
                admin.config_set(name, value)
        yield server, keeps_nothing
    finally:
        server.kill()


def test_check_and_beat_warn_of_a_redis_that_keeps_nothing_on_disk(
    redis_server: tuple[OwnRedisServer, bool], beat_env: dict[str, str], tmp_path: Path
) -> None:
    server, keeps_nothing = redis_server
    env = dict(beat_env, HISTORY_APP_BACKEND=server.url)
    done = celery(env, "anarchon", "check")
    assert done.returncode == 0, done.stdout + done.stderr  # a warning does not fail the check
    [store] = [line for line in done.stdout.splitlines() if line.split()[1:2] == ["store"]]
    if keeps_nothing:
        assert store.startswith(f"warn  store    Redis at {server.url}"), store
        assert NOTHING_ON_DISK in store and FIX in store and "see docs/backends.md#redis" in store, store
    else:
        assert store.startswith("ok    store") and "on disk" not in store, store
    assert done.stderr == ""  # said once, on the store's line

    log = tmp_path / "beat.log"
    beat = start_beat(env, log)
    try:
        wait_for(log, "anarchon: ready as", beat)
    finally:
        kill(beat)
    warned = [line for line in log.read_text().splitlines() if "on disk" in line]
    if keeps_nothing:
        assert len(warned) == 1 and "WARNING/" in warned[0], warned
        assert f"anarchon: Redis at {server.url}" in warned[0] and NOTHING_ON_DISK in warned[0] and FIX in warned[0]
    else:
        assert warned == []
