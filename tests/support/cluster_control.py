"""The suite's 3-node clusters (scripts/rabbitmq-cluster, of the version ANARCHON_TEST_RABBITMQ
chooses), and network partitions made on them.

A partition is made in Erlang's distribution itself: node 1 is given a cookie of its own for the
other two nodes, and its links to them are dropped; each side then refuses the other's handshake
until the cookie is given back. Nothing else of the machine (its network, its firewall) is
touched, and the other clusters on it are not affected.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from anarchon_celery import Claim, Outcome, RabbitMQBackend

from .broker_control import RABBITMQ, ROOT

SCRIPT = str(ROOT / "scripts" / "rabbitmq-cluster")
VERSION = "4" if RABBITMQ == "4" else "3.10"
NODES = [f"anarchon-{'a' if VERSION == '3.10' else 'b'}{n}@localhost" for n in (1, 2, 3)]


#: `rabbitmq-cluster start`'s status when the cluster or its ports are in use (nothing started).
BUSY = 3


class ClusterBusy(AssertionError):
    """The cluster's nodes or ports are in use by something else: its fixture must not stop them."""


@contextlib.contextmanager
def started_cluster(*options: str) -> Iterator[list[str]]:
    """A fresh cluster (its URLs), stopped afterwards whatever happened, but one this run did not
    start (another run holds it): that one is left alone."""
    try:
        urls = cluster(*options, "start").split(";")
    except ClusterBusy as exc:
        pytest.fail(str(exc))
    except BaseException:
        cluster("stop")  # a start that failed half way: what it started
        raise
    try:
        yield urls
    finally:
        cluster("stop")


def cluster(*args: str, timeout: float = 300) -> str:
    done = subprocess.run(
        [SCRIPT, "--version", VERSION, *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=timeout,
        check=False,
    )
    if done.returncode == BUSY and "start" in args:
        raise ClusterBusy(f"rabbitmq-cluster {' '.join(args)}: {done.stderr}")
    assert done.returncode == 0, f"rabbitmq-cluster {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


def evaluate(node: int, expression: str) -> str:
    """An Erlang expression evaluated on node ``node`` (1 to 3)."""
    return cluster("ctl", str(node), "eval", expression)


def cut_off_node_1() -> None:
    """Cut node 1 off from nodes 2 and 3 (see the module's text)."""
    others = ", ".join(f"'{name}'" for name in NODES[1:])
    evaluate(1, f"[begin erlang:set_cookie(N, anarchon_cut_off), erlang:disconnect_node(N) end || N <- [{others}]].")


def heal() -> None:
    """Give node 1 its cookie back and connect it to the others again."""
    others = ", ".join(f"'{name}'" for name in NODES[1:])
    evaluate(
        1,
        f"[begin erlang:set_cookie(N, erlang:get_cookie()), net_kernel:connect_node(N) end || N <- [{others}]].",
    )


def rabbit_running(node: int) -> bool:
    return "true" in evaluate(node, "rabbit:is_running().")


def wait_for(condition: Callable[[], bool], timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.5)
    return False


def decided(backend: RabbitMQBackend, claims: list[Claim], instance: str) -> list[Outcome]:
    """Claims made again while their gates are away, as the scheduler does (for up to 30 s)."""
    outcomes = backend.claim(claims, instance)
    for _ in range(30):
        away = [i for i, outcome in enumerate(outcomes) if outcome is Outcome.AWAY]
        if not away:
            break
        time.sleep(1)
        for i, outcome in zip(away, backend.claim([claims[i] for i in away], instance)):
            outcomes[i] = outcome
    return outcomes


def check(urls: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    """`celery anarchon check` of an app whose broker_url is ``urls``, as a real process (the
    partition handling is read only when ``args`` give --rabbitmqctl)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), HISTORY_APP_BROKER=";".join(urls), HISTORY_APP_PREFIX="t-check.")
    env.pop("ANARCHON_RABBITMQCTL", None)
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.apps.history_app", "anarchon", "check", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
