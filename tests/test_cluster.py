"""Claims on a real 3-node RabbitMQ cluster (scripts/rabbitmq-cluster, on ports of its own): the
backend given every node moves to another by itself when its node is killed, and says so."""

from __future__ import annotations

import logging
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from anarchon_celery import Claim, Outcome, RabbitMQBackend

from .broker_control import RABBITMQ, ROOT

pytestmark = [pytest.mark.broker, pytest.mark.cluster]

SCRIPT = str(ROOT / "scripts" / "rabbitmq-cluster")
VERSION = "4" if RABBITMQ == "4" else "3.10"


def cluster(*args: str, timeout: float = 300) -> str:
    done = subprocess.run(
        [SCRIPT, "--version", VERSION, *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"rabbitmq-cluster {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


@pytest.fixture(scope="module")
def urls() -> Iterator[list[str]]:
    """A fresh 3-node cluster for the module's tests, stopped after them."""
    try:
        yield cluster("start").split(";")
    finally:
        cluster("stop")


@pytest.mark.timeout(300)
def test_claims_move_to_another_node_when_theirs_is_killed(urls: list[str], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="anarchon_celery")
    prefix = f"t-{uuid.uuid4().hex[:10]}."
    backend = RabbitMQBackend(urls, prefix=prefix, slot_ttl_ms=60_000, confirm_timeout=3)
    rival = RabbitMQBackend(list(reversed(urls)), prefix=prefix, slot_ttl_ms=60_000, confirm_timeout=3)
    try:
        backend.open()
        rival.open()
        assert f"claims on RabbitMQ at {urls[0].replace('guest:guest', 'guest:**')}" in caplog.text
        assert backend.claim([Claim("job", 1)], "a") == [Outcome.WON]
        assert rival.claim([Claim("job", 1)], "b") == [Outcome.LOST]  # through node 3: one cluster
        cluster("kill", "1")
        try:
            # A later run's gate is made on a node left, and won there, by the first to claim it.
            assert backend.claim([Claim("job", 2)], "a") == [Outcome.WON]
            assert rival.claim([Claim("job", 2)], "b") == [Outcome.LOST]
            assert "claims moved from RabbitMQ at amqp://guest:**@127.0.0.1:" in caplog.text
            assert "guest:guest@" not in caplog.text
            # The run whose gate lived on the lost node is never won again.
            assert rival.claim([Claim("job", 1)], "b") != [Outcome.WON]
        finally:
            cluster("start-node", "1")
    finally:
        backend.close()
        rival.close()


@pytest.mark.timeout(300)
def test_a_gate_on_a_killed_node_costs_its_own_run_only(urls: list[str], caplog: pytest.LogCaptureFixture) -> None:
    """Gates declared ahead from node 1, then node 1 killed: a batch mixing their runs with runs
    whose gates are new wins the new ones (RabbitMQ 4 holds the declare of a dead node's gate for
    about a minute; 3.10 answers 404 at once) and never the dead node's. Back, node 1's gates
    hold what they held: a claimed one is never won again, an unclaimed one is won once."""
    caplog.set_level(logging.INFO, logger="anarchon_celery")
    prefix = f"t-{uuid.uuid4().hex[:10]}."
    on_node_1 = RabbitMQBackend(urls[0], prefix=prefix, slot_ttl_ms=60_000, confirm_timeout=2)
    rival = RabbitMQBackend(list(reversed(urls)), prefix=prefix, slot_ttl_ms=60_000, confirm_timeout=2)
    dead = [Claim("dead", slot) for slot in (1, 2, 3)]
    fresh = [Claim("fresh", slot) for slot in (1, 2, 3)]
    try:
        assert on_node_1.claim([dead[0]], "a") == [Outcome.WON]  # claimed before the kill
        on_node_1.prepare([dead[1], dead[2]])  # declared ahead, not claimed
        on_node_1.await_prepared(10)
        on_node_1.close()
        cluster("kill", "1")
        try:
            batch = [dead[0], fresh[0], dead[1], fresh[1], dead[2], fresh[2]]
            outcomes = rival.claim(batch, "b")
            assert outcomes[1::2] == [Outcome.WON] * 3
            assert Outcome.WON not in outcomes[0::2]
            assert "down or cut off" in caplog.text
            assert "permissions" not in caplog.text
        finally:
            cluster("start-node", "1")
        assert rival.claim([dead[0], dead[1]], "b") == [Outcome.LOST, Outcome.WON]
        assert rival.claim([dead[1]], "b") == [Outcome.LOST]
    finally:
        on_node_1.close()
        rival.close()
