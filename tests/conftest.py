"""Shared fixtures. Everything that touches the broker uses a real RabbitMQ (this machine's on
127.0.0.1:5672, or the one ANARCHON_TEST_RABBITMQ names: see broker_control.py); every broker
object gets a unique prefix and is deleted afterwards."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import hypothesis
import pytest
from kombu import Connection

ROOT = Path(__file__).resolve().parent.parent

# Property tests are not timed: the suite runs beside beats, workers and browsers on two cores,
# where a draw or an example may wait seconds for the CPU (Hypothesis' too_slow check and its
# 200 ms deadline failed runs that had nothing wrong).
hypothesis.settings.register_profile("suite", deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow])
hypothesis.settings.load_profile("suite")
sys.path.insert(0, str(ROOT / "examples"))

from tests.support.broker_control import BROKER  # noqa: E402
from tests.support.stores import delete_postgres_rows, delete_redis_keys  # noqa: E402

# -- tests in parallel ---------------------------------------------------------------------------
#
# The suite runs in several processes (pytest-xdist). Tests that use this machine's services
# (RabbitMQ, Redis, PostgreSQL) share them, each under a prefix of its own; a test that stops or
# cuts a service for everyone, or runs the demo, which holds its runs to wall-clock bounds (marked
# ``exclusive``), runs alone: it takes the services' lock for
# itself, while every other test that touches a service holds it shared. A test waiting for the
# lock for itself keeps new tests from taking it shared meanwhile, so it is not starved.

LOCKS = Path(tempfile.gettempdir()) / f"anarchon-tests-{os.getuid()}"
#: Tests parametrized over where runs are decided: a value among these is a store, whose tests do
#: not depend on RabbitMQ's version (RabbitMQ only carries their tasks).
STORE_KINDS = {"memory", "sqlite", "redis", "postgres"}
_SERVICE_FIXTURES = {"broker_url", "redis_url", "postgres_url", "connection", "prefix"}


@contextlib.contextmanager
def services_lock(exclusive: bool) -> Iterator[None]:
    """The lock of this machine's services, for this test alone or shared with the others."""
    LOCKS.mkdir(exist_ok=True)
    with open(LOCKS / "services.gate", "a+") as gate, open(LOCKS / "services.lock", "a+") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)  # in line: no shared holder gets past a waiting exclusive one
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if not exclusive:
                fcntl.flock(gate, fcntl.LOCK_UN)
        yield  # (closing the files releases both)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        kinds = {value for value in params.values() if isinstance(value, str)}
        if kinds & STORE_KINDS and "rabbitmq" not in kinds:
            item.add_marker(pytest.mark.stores)
        if item.get_closest_marker("cluster") is not None:
            item.add_marker(pytest.mark.xdist_group("cluster"))  # one cluster, its tests one after the other


@pytest.fixture(autouse=True)
def _services(request: pytest.FixtureRequest) -> Iterator[None]:
    """Hold the services' lock for the test: for itself when it is marked ``exclusive``, shared
    when it touches a service."""
    item = request.node
    exclusive = item.get_closest_marker("exclusive") is not None
    touches = exclusive or any(item.get_closest_marker(name) for name in ("broker", "processes", "cluster"))
    if not (touches or _SERVICE_FIXTURES & set(request.fixturenames)):
        yield
        return
    with contextlib.ExitStack() as held:
        _timer(item, on=False)
        try:
            held.enter_context(services_lock(exclusive))
        finally:
            _timer(item, on=True)
        yield


def _timer(item: pytest.Item, on: bool) -> None:
    """Stop or start again the test's timeout: the minutes it waits for the services' lock,
    behind the tests that run alone, are not its own."""
    import pytest_timeout

    settings = pytest_timeout._get_item_settings(item)  # (the plugin's own reading of the marks)
    if not settings.timeout or settings.func_only:
        return
    hook = item.config.pluginmanager.hook
    if on:
        hook.pytest_timeout_set_timer(item=item, settings=settings)
    else:
        hook.pytest_timeout_cancel_timer(item=item)


def _broker_up() -> bool:
    try:
        with Connection(BROKER, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
        return True
    except Exception:  # noqa: BLE001 - any failure means "not reachable"
        return False


#: How long a process's first look at a service waits for it to answer. The session's fixtures
#: are made before a test takes the services' lock, so they may look while a test of another
#: process, running alone, has the service stopped for a few seconds (a restart); failed, the
#: fixture would fail every later test of this process.
SERVICE_WAIT_S = 60.0 if os.environ.get("CI") else 10.0


def _answers(probe: Callable[[], bool]) -> bool:
    """Whether ``probe`` says the service answers, within :data:`SERVICE_WAIT_S`."""
    deadline = time.monotonic() + SERVICE_WAIT_S
    while not probe():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)
    return True


@pytest.fixture(scope="session")
def broker_url() -> str:
    """The RabbitMQ URL. Skips locally when it is down; fails under CI."""
    if not _answers(_broker_up):
        if os.environ.get("CI"):
            pytest.fail(f"RabbitMQ is not reachable at {BROKER}, and CI needs it")
        pytest.skip(f"RabbitMQ is not reachable at {BROKER}")
    return BROKER


@pytest.fixture
def prefix(broker_url: str) -> Iterator[str]:
    """A unique name prefix; every queue and exchange under it is deleted after the test."""
    from tests.support.processes import delete_prefixed

    value = f"t-{uuid.uuid4().hex[:10]}."
    yield value
    delete_prefixed(value, broker_url)


@pytest.fixture
def beat_env(prefix: str, broker_url: str) -> Iterator[dict[str, str]]:
    """The environment of a beat of tests.apps.history_app under this test's prefix (a job every 2 s),
    with its task queue declared as a worker would."""
    from kombu import Exchange, Queue

    with Connection(broker_url) as conn:
        Queue(f"{prefix}tasks", Exchange(f"{prefix}tasks"), f"{prefix}tasks")(conn.default_channel).declare()
    yield dict(os.environ, PYTHONPATH=str(ROOT), HISTORY_APP_PREFIX=prefix, HISTORY_APP_EVERY="2")


@pytest.fixture
def connection(broker_url: str) -> Iterator[Connection]:
    with Connection(broker_url) as conn:
        conn.ensure_connection(max_retries=1)
        yield conn


REDIS = os.environ.get("ANARCHON_TEST_REDIS", "redis://127.0.0.1:6379/5")


def _redis_up() -> bool:
    try:
        import redis

        redis.Redis.from_url(REDIS, socket_connect_timeout=3, socket_timeout=3).ping()
        return True
    except Exception:  # noqa: BLE001 - any failure (redis-py missing too) means "not reachable"
        return False


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The Redis URL (with its database number) for the tests of a Redis task broker. Skips
    locally when it is down; fails under CI."""
    if not _answers(_redis_up):
        if os.environ.get("CI"):
            pytest.fail(f"Redis is not reachable at {REDIS} (or redis-py is missing), and CI needs it")
        pytest.skip(f"Redis is not reachable at {REDIS}")
    return REDIS


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A unique key prefix (use it as kombu's ``global_keyprefix``); every key under it in the
    test database is deleted after the test."""
    value = f"t-{uuid.uuid4().hex[:10]}."
    yield value
    delete_redis_keys(redis_url, value)


POSTGRES = os.environ.get("ANARCHON_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


def _postgres_up() -> bool:
    try:
        import psycopg

        psycopg.connect(POSTGRES, connect_timeout=3).close()
        return True
    except Exception:  # noqa: BLE001 - any failure (psycopg missing too) means "not reachable"
        return False


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The PostgreSQL URL for the tests of the PostgreSQL backend. Skips locally when it is down;
    fails under CI."""
    if not _answers(_postgres_up):
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL is not reachable at {POSTGRES} (or psycopg is missing), and CI needs it")
        pytest.skip(f"PostgreSQL is not reachable at {POSTGRES}")
    return POSTGRES


@pytest.fixture
def postgres_prefix(postgres_url: str) -> Iterator[str]:
    """A unique prefix; every row under it in anarchon's tables is deleted after the test."""
    value = f"t-{uuid.uuid4().hex[:10]}."
    yield value
    delete_postgres_rows(postgres_url, value)
