"""The RabbitMQ the suite runs against, in one setting, and its control commands.

``ANARCHON_TEST_RABBITMQ`` picks the node:

* ``system`` (the default): this machine's RabbitMQ on 127.0.0.1:5672, controlled with
  ``rabbitmqctl`` and started again with ``rabbitmq-server -detached``;
* ``4``: the RabbitMQ 4 node of ``scripts/rabbitmq4`` (Debian forky's package, in a chroot),
  controlled and started through that script.

The choice is exported to the processes the tests start (``ANARCHON_TEST_BROKER`` for the test
apps, ``ANARCHON_DEMO_BROKER`` and ``ANARCHON_RABBITMQCTL`` for the demo and ``celery anarchon
prune``)."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
RABBITMQ = os.environ.get("ANARCHON_TEST_RABBITMQ", "system")

if RABBITMQ == "system":
    BROKER = "amqp://guest:guest@127.0.0.1:5672//"
    RABBITMQCTL = ["rabbitmqctl"]
    START_NODE = ["rabbitmq-server", "-detached"]
elif RABBITMQ == "4":
    _SCRIPT = str(ROOT / "scripts" / "rabbitmq4")
    BROKER = "amqp://guest:guest@127.0.0.1:5682//"
    RABBITMQCTL = [_SCRIPT, "ctl"]
    START_NODE = [_SCRIPT, "start"]
else:
    raise pytest.UsageError(f"ANARCHON_TEST_RABBITMQ={RABBITMQ!r}: give system (the default) or 4")

HOST = urlsplit(BROKER).hostname or "127.0.0.1"
PORT = urlsplit(BROKER).port or 5672

os.environ["ANARCHON_TEST_BROKER"] = BROKER
os.environ["ANARCHON_RABBITMQCTL"] = shlex.join(RABBITMQCTL)
os.environ.setdefault("ANARCHON_DEMO_BROKER", BROKER)


def url_with(*, user: str = "guest", password: str = "guest", vhost: str = "/") -> str:
    """The suite's broker with other credentials or vhost (``/`` is written ``//``)."""
    return f"amqp://{user}:{password}@{HOST}:{PORT}/{vhost}"


def run_rabbitmqctl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RABBITMQCTL, *args], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout, check=False
    )


def rabbitmqctl(*args: str, timeout: float = 120) -> bool:
    try:
        return run_rabbitmqctl(*args, timeout=timeout).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def need_rabbitmqctl() -> None:
    """Skip (fail under CI) when the broker cannot be controlled from here."""
    if shutil.which(RABBITMQCTL[0]) is None or not rabbitmqctl("status", timeout=60):
        if os.environ.get("CI"):
            pytest.fail(f"{shlex.join(RABBITMQCTL)} cannot control the suite's RabbitMQ, and CI needs it")
        pytest.skip(f"{shlex.join(RABBITMQCTL)} cannot control the suite's RabbitMQ")


def start_broker() -> None:
    """Start the RabbitMQ application; if it will not start, restart the whole node."""
    if rabbitmqctl("start_app", timeout=120) and rabbitmqctl("await_startup", timeout=120):
        return
    rabbitmqctl("stop", timeout=60)
    subprocess.run(START_NODE, capture_output=True, stdin=subprocess.DEVNULL, check=False, timeout=300)
    if not rabbitmqctl("await_startup", "--timeout", "170", timeout=180):
        raise RuntimeError("RabbitMQ did not start again after the test stopped it: start it by hand")


@contextlib.contextmanager
def broker_stopped() -> Iterator[None]:
    """The broker application is stopped for the block, and started again after it, even when
    the block fails."""
    try:
        assert rabbitmqctl("stop_app"), "rabbitmqctl stop_app failed"
        yield
    finally:
        start_broker()


def close_all_connections() -> None:
    """Close every client connection, as a network fault or an operator would."""
    assert rabbitmqctl("close_all_connections", "anarchon_celery tests: cut"), "close_all_connections failed"
