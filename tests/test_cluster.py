"""Claims on a real 3-node RabbitMQ cluster (scripts/rabbitmq-cluster, on ports of its own): the
backend given every node moves to another by itself when its node is killed, and says so."""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from anarchon_celery import Claim, ConfigError, Outcome, RabbitMQBackend

from .support.broker_control import BROKER, ROOT
from .support.cluster_control import (
    SCRIPT,
    VERSION,
    check,
    cluster,
    cut_off_node_1,
    decided,
    heal,
    rabbit_running,
    started_cluster,
    wait_for,
)

pytestmark = [pytest.mark.broker, pytest.mark.cluster]


@pytest.fixture(scope="module")
def urls() -> Iterator[list[str]]:
    """A fresh 3-node cluster for the module's tests, stopped after them."""
    with started_cluster() as started:
        yield started


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
def test_a_gate_on_a_killed_node_is_away_and_costs_no_other_run(
    urls: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Gates made on node 1, then node 1 killed: a batch mixing their runs with runs whose gates
    are new wins the new ones (RabbitMQ 4 holds the declare of a dead node's gate for about a
    minute; 3.10 answers 404 at once) and answers AWAY for the others, whether they are declared
    by the claim or were declared ahead. Back, node 1's gates hold what they held: a claimed one
    is never won again, an unclaimed one is won once."""
    caplog.set_level(logging.INFO, logger="anarchon_celery")
    prefix = f"t-{uuid.uuid4().hex[:10]}."
    mover = RabbitMQBackend(urls, prefix=prefix, slot_ttl_ms=60_000, confirm_timeout=2)  # on node 1 first
    rival = RabbitMQBackend(list(reversed(urls)), prefix=prefix, slot_ttl_ms=60_000, confirm_timeout=2)
    dead = [Claim("dead", slot) for slot in (1, 2, 3)]
    fresh = [Claim("fresh", slot) for slot in (1, 2, 3, 4)]
    try:
        assert mover.claim([dead[0]], "a") == [Outcome.WON]  # claimed before the kill
        mover.prepare([dead[1], dead[2]])  # declared ahead, not claimed
        mover.await_prepared(10)
        cluster("kill", "1")
        try:
            outcomes = rival.claim([dead[0], fresh[0], dead[1], fresh[1], dead[2], fresh[2]], "b")
            assert outcomes[1::2] == [Outcome.WON] * 3
            assert outcomes[0::2] == [Outcome.AWAY] * 3
            assert "down or cut off" in caplog.text
            assert "permissions" not in caplog.text
            assert mover.claim([fresh[3]], "a") == [Outcome.WON]  # it moved to a node left
            # Its gates declared ahead turn its claims down (nack on 4, return on 3.10): not lost, away.
            assert mover.claim([dead[1], dead[2]], "a") == [Outcome.AWAY] * 2
        finally:
            cluster("start-node", "1")
        assert decided(rival, [dead[0], dead[1]], "b") == [Outcome.LOST, Outcome.WON]
        assert decided(mover, [dead[1], dead[2]], "a") == [Outcome.LOST, Outcome.WON]
    finally:
        mover.close()
        rival.close()


class _StopsNode1AfterDeclaring(RabbitMQBackend):
    """Stops node 1 cleanly between its gates' declare-ok and its claims."""

    def _declare_gates(self, gates: list[str]) -> list[Outcome | None]:
        verdicts = super()._declare_gates(gates)
        cluster("stop-node", "1")
        return verdicts


@pytest.mark.timeout(300)
def test_a_gate_whose_node_stops_between_its_declare_and_its_claim_is_away(urls: list[str]) -> None:
    """A gate made on node 1 (declared ahead by another instance), declared again by a claim from
    node 2, then node 1 stopped before the claim is published: the claim comes back as if the
    run were lost (3.10 returns it, RabbitMQ 4 nacks it), but the gate's node is down, so the run
    is AWAY and is won once node 1 is back."""
    prefix = f"t-{uuid.uuid4().hex[:10]}."
    ahead = RabbitMQBackend(urls, prefix=prefix, slot_ttl_ms=60_000, confirm_timeout=2)  # on node 1
    claimer = _StopsNode1AfterDeclaring(urls[1:], prefix=prefix, slot_ttl_ms=60_000, confirm_timeout=2)
    late = RabbitMQBackend(urls[1:], prefix=prefix, slot_ttl_ms=60_000, confirm_timeout=2)
    run = Claim("job", 1)
    try:
        ahead.prepare([run])
        ahead.await_prepared(10)
        claimer.open()
        try:
            assert claimer.claim([run], "a") == [Outcome.AWAY]
        finally:
            cluster("start-node", "1")
        assert decided(late, [run], "a") == [Outcome.WON]
    finally:
        for backend in (ahead, claimer, late):
            backend.close()


@pytest.mark.timeout(300)
def test_check_reads_every_node_and_the_partition_handling(urls: list[str]) -> None:
    done = check(urls, "--rabbitmqctl", f"{SCRIPT} --version {VERSION} ctl 2")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    nodes = [line for line in lines if line.startswith("ok    node")]
    assert len(nodes) == 3 and all(f"cluster 'anarchon-{'a' if VERSION == '3.10' else 'b'}'" in n for n in nodes)
    assert any(line.startswith("ok    partition") and "pause_minority" in line for line in lines), lines
    # Without a way to read it, the partition handling is a warning, not a failure.
    done = check(urls)
    assert done.returncode == 0 and "warn  partition not read" in done.stdout, done.stdout


@pytest.mark.timeout(300)
def test_bad_nodes_are_named_without_passwords_and_the_others_still_claim(
    urls: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="anarchon_celery")
    wrong = urls[1].replace("guest:guest@", "guest:s3cr3t@")
    bad = [urls[0], wrong, "amqp://guest:s3cr3t@127.0.0.1:1//", urls[2]]
    done = check(bad)
    assert done.returncode == 1
    out = done.stdout + done.stderr
    assert "s3cr3t" not in out and "Traceback" not in out, out
    assert "FAIL  node     amqp://guest:**@127.0.0.1:1//: does not answer" in done.stdout, done.stdout
    assert f"FAIL  node     {wrong.replace('s3cr3t', '**')}: refused the login of user 'guest'" in done.stdout
    # The scheduler's backend runs on the nodes that work, and says which do not.
    prefix = f"t-{uuid.uuid4().hex[:10]}."
    backend = RabbitMQBackend(bad, prefix=prefix, slot_ttl_ms=60_000)
    try:
        backend.open()
        assert backend.claim([Claim("job", 1)], "a") == [Outcome.WON]
    finally:
        backend.close()
    assert "127.0.0.1:1// does not answer" in caplog.text and "s3cr3t" not in caplog.text


@pytest.mark.timeout(300)
def test_a_node_of_another_cluster_is_refused_by_name(urls: list[str]) -> None:
    other = BROKER  # the suite's own RabbitMQ: a cluster of its own
    done = check([*urls, other])
    assert done.returncode == 1
    assert "FAIL  nodes    RabbitMQ node amqp://guest:**@" in done.stdout and "is of cluster" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    backend = RabbitMQBackend([*urls, other], prefix="t-other.", slot_ttl_ms=60_000)
    with pytest.raises(ConfigError, match="a run could be won twice"):
        backend.open()
    backend.close()


@pytest.mark.timeout(300)
def test_with_pause_minority_only_the_majority_wins_across_a_partition(urls: list[str]) -> None:
    """The cluster's partition handling is pause_minority (scripts/rabbitmq-cluster's default):
    node 1, cut off from the others, stops taking clients on 3.10 (on 4, Khepri already keeps it
    from making gates), and a run is won once, on the majority. Last in the module: the cluster is
    healed after it, but was partitioned."""
    prefix = f"t-{uuid.uuid4().hex[:10]}."
    minority = RabbitMQBackend(urls[0], prefix=prefix, slot_ttl_ms=60_000, confirm_timeout=2)
    majority = RabbitMQBackend(urls[1], prefix=prefix, slot_ttl_ms=60_000, confirm_timeout=2)
    try:
        assert majority.claim([Claim("before", 1)], "b") == [Outcome.WON]
        cut_off_node_1()
        try:
            if VERSION == "3.10":
                assert wait_for(lambda: not rabbit_running(1)), "node 1 did not pause"
            assert minority.claim([Claim("cut", 1)], "a") != [Outcome.WON]
            assert majority.claim([Claim("cut", 1)], "b") == [Outcome.WON]
        finally:
            heal()
        assert wait_for(lambda: rabbit_running(1), timeout=120), "node 1 did not come back"
        assert decided(minority, [Claim("cut", 1), Claim("after", 1)], "a") == [Outcome.LOST, Outcome.WON]
    finally:
        minority.close()
        majority.close()


@pytest.mark.timeout(400)
def test_with_the_documented_settings_a_worker_executes_every_run_through_a_node_lost(
    urls: list[str], tmp_path: Path
) -> None:
    """Two beats and a real worker on the cluster, with quorum task queues and no remote control
    (docs/operations.md#the-task-side-of-a-cluster); node 1, which every one of them reaches first, is
    SIGKILLed and started again: every run is executed, once."""
    from anarchon_celery import task_id_for

    from .test_backup_runners import _worker
    from .test_faults import Fleet, kill

    prefix = f"t-{uuid.uuid4().hex[:10]}."
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        HISTORY_APP_PREFIX=prefix,
        HISTORY_APP_BROKER=";".join(urls),
        HISTORY_APP_EVERY="2",
        HISTORY_APP_MAX_LATE_MS="40000",
        HISTORY_APP_SLOT_TTL_MS="120000",
        HISTORY_APP_HISTORY_SIZE="0",
        HISTORY_APP_TASK_QUEUE_TYPE="quorum",
        HISTORY_APP_CLUSTER_WORKER="1",
    )
    worker_log = tmp_path / "worker.log"
    worker = _worker(env, worker_log)
    fleet = Fleet(tmp_path, [env, env])
    try:
        fleet.wait_ready()
        fleet.wait_any("won, sent", fleet.offsets())
        time.sleep(6)
        cluster("kill", "1")
        time.sleep(10)
        cluster("start-node", "1")
        time.sleep(10)
        fleet.stop()
        sent = sorted(
            {int(s) for i in range(2) for s in re.findall(r"job 'every' slot (\d+): won, sent", fleet.text(i))}
        )
        expected = {task_id_for(prefix, "every", slot) for slot in range(sent[0], sent[-1] + 1, 2000)}
        deadline = time.monotonic() + 120
        while not expected <= set(re.findall(r"history_app\.fine\[([^\]]+)\] succeeded", worker_log.read_text())):
            assert worker.poll() is None, f"the worker exited:\n{worker_log.read_text()[-3000:]}"  # type: ignore[attr-defined]
            assert time.monotonic() < deadline, worker_log.read_text()[-3000:]
            time.sleep(0.5)
        time.sleep(2)
    finally:
        fleet.kill()
        kill(worker)  # type: ignore[arg-type]
    executed = Counter(re.findall(r"history_app\.fine\[([^\]]+)\] succeeded", worker_log.read_text()))
    assert set(executed) >= expected and max(executed.values()) == 1, executed
    assert len(expected) >= 12  # the runs before, during and after the node's loss
