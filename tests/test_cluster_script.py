"""scripts/rabbitmq-cluster itself: a start that finds its ports taken starts nothing, and says
so with a status of its own, so that the suite's fixtures never stop a cluster they did not start.
(A module of its own: test_cluster.py's cluster holds the ports while that module runs.)"""

from __future__ import annotations

import socket

import pytest

from .support.cluster_control import VERSION, ClusterBusy, cluster

pytestmark = [pytest.mark.broker, pytest.mark.cluster]


def test_start_says_when_its_ports_are_taken_and_starts_nothing() -> None:
    port = 5702 if VERSION == "3.10" else 5712  # node 2's AMQP port
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", port))
        holder.listen()
        with pytest.raises(ClusterBusy, match=rf"ports \[{port}\] are taken by another process"):
            cluster("start")
    with pytest.raises(OSError):  # nothing was started: node 1 does not answer
        socket.create_connection(("127.0.0.1", port - 1), timeout=2).close()
