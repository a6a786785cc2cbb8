"""Stopping the real RabbitMQ in tests, and always starting it again."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest


def rabbitmqctl(*args: str, timeout: float = 120) -> bool:
    try:
        done = subprocess.run(["rabbitmqctl", *args], capture_output=True, stdin=subprocess.DEVNULL, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def need_rabbitmqctl() -> None:
    """Skip (fail under CI) when the broker cannot be controlled from here."""
    if shutil.which("rabbitmqctl") is None or not rabbitmqctl("status", timeout=60):
        if os.environ.get("CI"):
            pytest.fail("rabbitmqctl cannot control the local RabbitMQ, and CI needs it")
        pytest.skip("rabbitmqctl cannot control the local RabbitMQ")


def start_broker() -> None:
    """Start the RabbitMQ application; if it will not start, restart the whole node."""
    if rabbitmqctl("start_app", timeout=120) and rabbitmqctl("await_startup", timeout=120):
        return
    rabbitmqctl("stop", timeout=60)
    subprocess.run(["rabbitmq-server", "-detached"], capture_output=True, stdin=subprocess.DEVNULL, check=False)
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
