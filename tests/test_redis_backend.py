"""The Redis backend against the real Redis: real processes racing, a claim's answer lost with its
connection, Redis gone and back, its clock deciding, what it warns of. Every key under the test's
prefix is deleted afterwards."""

from __future__ import annotations

import logging
import shutil
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from anarchon_celery import BrokerRefused, Claim, ConfigError, Outcome, RedisBackend
from anarchon_celery.backends.redis_client import describe_client, login_refusal, make_client
from anarchon_celery.errors import clause

from .support.proxy import Proxy, free_port
from .support.redis_servers import OwnRedisServer


def _open(url: str, prefix: str, **kwargs: Any) -> RedisBackend:
    backend = RedisBackend(url, prefix=prefix, **kwargs)
    backend.open()
    return backend


def _through(proxy: Proxy, redis_url: str) -> str:
    parts = urlsplit(redis_url)
    return f"redis://127.0.0.1:{proxy.port}{parts.path}"


@pytest.fixture
def proxy(redis_url: str) -> Any:
    parts = urlsplit(redis_url)
    proxy = Proxy((parts.hostname or "127.0.0.1", parts.port or 6379))
    yield proxy
    proxy.close()


def test_a_claim_whose_answer_was_lost_is_found_won_on_a_new_connection(
    redis_url: str, redis_prefix: str, proxy: Proxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="anarchon_celery")
    backend = _open(_through(proxy, redis_url), redis_prefix, timeout=5)
    rival = _open(redis_url, redis_prefix)
    assert backend.claim([Claim("warm", 1)], "a") == [Outcome.WON]  # the script is loaded
    proxy.stall()  # Redis runs the script; its answer is held, then the connection cut

    def cut() -> None:
        time.sleep(0.5)
        proxy.cut()
        proxy.resume()

    threading.Thread(target=cut).start()
    assert backend.claim([Claim("job", 1), Claim("job", 2)], "a") == [Outcome.WON, Outcome.WON]
    assert "claiming again on a new connection" in caplog.text
    assert rival.claim([Claim("job", 1), Claim("job", 2)], "b") == [Outcome.LOST, Outcome.LOST]
    assert backend.holder("job", 1) == "a"
    backend.close()
    rival.close()


def test_redis_gone_leaves_runs_away_and_says_when_it_is_back(
    redis_url: str, redis_prefix: str, proxy: Proxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="anarchon_celery")
    backend = _open(_through(proxy, redis_url), redis_prefix, timeout=0.5)
    proxy.close()  # Redis's port refuses connections
    assert backend.claim([Claim("job", 1), Claim("job", 2)], "a") == [Outcome.AWAY] * 2
    assert backend.in_outage()
    assert backend.mark_sent([("job", 0, 1)], "a") == [None]  # not told: the caller tells it again
    backend.missed("job", [3])
    back = Proxy(proxy.target, port=proxy.port)
    try:
        assert backend.claim([Claim("job", 1)], "a") == [Outcome.WON]  # never decided: still free
    finally:
        back.close()
    assert not backend.in_outage()
    assert caplog.text.count("cannot decide claims") == 1
    assert (
        "is back after" in caplog.text
        and "1 run(s) were not claimed meanwhile (their deadline passed): job 'job' slot 3" in caplog.text
    )
    backend.close()


def test_an_unreachable_redis_is_a_clear_error(redis_prefix: str) -> None:
    backend = RedisBackend(f"redis://:s3cret@127.0.0.1:{free_port()}/0", prefix=redis_prefix, timeout=1)
    with pytest.raises(Exception, match="does not answer") as info:
        backend.open()
    assert "s3cret" not in str(info.value)
    assert backend.claim([Claim("job", 1)], "a") == [Outcome.AWAY]


def test_runs_are_decided_on_redis_clock(redis_url: str, redis_prefix: str) -> None:
    backend = _open(redis_url, redis_prefix)
    now = backend.store_now_ms()
    claims = [
        Claim("ahead", now + 60_000),  # an instance whose clock is a minute ahead
        Claim("soon", now + 300),  # a little early: waits for its slot
        Claim("behind", now - 5_000, deadline_ms=now - 1_000),  # its deadline is past on Redis's clock
    ]
    assert backend.claim(claims, "a") == [Outcome.EARLY, Outcome.WON, Outcome.UNDECIDED]
    assert backend.holder("ahead", now + 60_000) is None
    assert backend.claim([Claim("ahead", now - 1)], "b") == [Outcome.WON]  # the cursor did not move
    backend.close()


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-ttl"])
def test_an_evicting_redis_is_refused_unless_allowed(
    policy: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("no redis-server here")
    server = OwnRedisServer(tmp_path / "redis")
    try:
        import redis

        with redis.Redis(port=server.port) as admin:
            admin.config_set("maxmemory-policy", policy)
        with pytest.raises(BrokerRefused, match=f"maxmemory-policy {policy}\\): a run .* can be won again"):
            RedisBackend(server.url, prefix="t.").open()
        with caplog.at_level(logging.WARNING, logger="anarchon_celery"):
            allowed = [RedisBackend(f"{server.url}?allow_eviction=1"), RedisBackend(server.url, allow_eviction=True)]
            for backend in allowed:
                backend.open()
                backend.close()
        assert caplog.text.count("allow_eviction is set, so the backend runs on it") == 2
        with pytest.raises(ConfigError, match="allow_eviction in the Redis URL must be 0 or 1"):
            RedisBackend(f"{server.url}?allow_eviction=2")
    finally:
        server.kill()


@pytest.mark.parametrize(
    ("credentials", "expected"),
    [
        ("", "authentication failed, Redis asks for a password and the URL gives none. Give the password in"),
        (
            ":wrong@",
            "authentication failed for the default user (invalid username-password pair or user is disabled). "
            "Give the right password (and user) in",
        ),
    ],
    ids=["no-password", "wrong-password"],
)
def test_a_refused_redis_login_says_what_to_fix(credentials: str, expected: str, tmp_path: Path) -> None:
    """Not Redis's answer to redis-py's HELLO, which speaks of HELLO AUTH and RESP versions, nor a
    reason's own full stop before the fix ("disabled.. Give")."""
    if shutil.which("redis-server") is None:
        pytest.skip("no redis-server here")
    import redis

    server = OwnRedisServer(tmp_path / "redis")
    try:
        with redis.Redis(port=server.port) as admin:
            admin.config_set("requirepass", "s3cret")
        client = make_client(redis, server.url.replace("//", f"//{credentials}", 1), 5).client
        with pytest.raises(redis.AuthenticationError) as refused:
            client.info("server")
        message = login_refusal(describe_client(client), client, refused.value)
        client.close()
    finally:
        server.kill()
    assert message.startswith(f"Redis at {server.url} refused the login: "), message
    assert expected in message and message.endswith("redis://[USER]:PASSWORD@host:port/db"), message
    assert "HELLO" not in message and ".." not in message and "wrong" not in message


@pytest.mark.parametrize(
    ("reason", "quoted"),
    [
        ("invalid username-password pair or user is disabled.", "invalid username-password pair or user is disabled"),
        ("Connection refused", "Connection refused"),
        (ValueError("no such file. "), "no such file"),
        ("version 1.2", "version 1.2"),
    ],
)
def test_a_reason_quoted_in_a_sentence_loses_its_full_stop(reason: object, quoted: str) -> None:
    assert clause(reason) == quoted


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"url": "amqp://localhost"}, "needs a redis://, rediss:// or sentinel:// URL"),
        ({"url": None}, "needs a redis://, rediss:// or sentinel:// URL"),
        ({"client": object()}, "client must be a redis.Redis"),
        ({"timeout": 0}, "timeout must be a positive number"),
        ({"prefix": "bad prefix"}, "invalid prefix"),
        ({"lease_ms": 0}, "lease_ms must be an integer from 100"),
        ({"lease_ms": "5000"}, "lease_ms must be an integer from 100"),
    ],
)
def test_bad_options_are_clear_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RedisBackend(**kwargs)


def test_a_callers_client_is_used_and_never_closed(redis_url: str, redis_prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    backend = RedisBackend(client=client, prefix=redis_prefix)
    backend.open()
    assert backend.claim([Claim("job", 1)], "a") == [Outcome.WON]
    backend.close()
    assert client.ping()
    client.close()
