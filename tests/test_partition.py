"""A network partition on a cluster left with RabbitMQ's default partition handling (ignore):
on 3.10 both sides of the partition accept the claim of one run, two winners, so `check` refuses
that setting; RabbitMQ 4 keeps its metadata in Khepri (Raft), and its minority side fails closed.
A cluster of its own, stopped after the test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from anarchon_celery import Claim, Outcome, RabbitMQBackend

from .support.cluster_control import SCRIPT, VERSION, check, cut_off_node_1, heal, started_cluster

pytestmark = [pytest.mark.broker, pytest.mark.cluster]


@pytest.fixture(scope="module")
def urls() -> Iterator[list[str]]:
    with started_cluster("--partition-handling", "ignore") as started:
        yield started


@pytest.mark.timeout(300)
def test_partition_handling_ignore(urls: list[str]) -> None:
    done = check(urls, "--rabbitmqctl", f"{SCRIPT} --version {VERSION} ctl 2")
    partition = [line for line in done.stdout.splitlines() if "partition" in line]
    prefix = f"t-{uuid.uuid4().hex[:10]}."
    cut_side = RabbitMQBackend(urls[0], prefix=prefix, slot_ttl_ms=60_000, confirm_timeout=2)
    majority = RabbitMQBackend(urls[1], prefix=prefix, slot_ttl_ms=60_000, confirm_timeout=2)
    try:
        assert majority.claim([Claim("before", 1)], "b") == [Outcome.WON]
        cut_off_node_1()
        try:
            outcomes = [cut_side.claim([Claim("cut", 1)], "a")[0], majority.claim([Claim("cut", 1)], "b")[0]]
        finally:
            heal()
    finally:
        cut_side.close()
        majority.close()
    if VERSION == "3.10":
        # What RabbitMQ itself does: one run, won on each side. So check refuses the setting.
        assert outcomes == [Outcome.WON, Outcome.WON]
        assert done.returncode == 1 and partition and partition[0].startswith("FAIL  partition ignore: both sides")
    else:
        assert outcomes == [Outcome.AWAY, Outcome.WON]  # the minority cannot make the gate
        assert done.returncode == 0 and partition and "Khepri" in partition[0], done.stdout
