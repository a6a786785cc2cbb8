"""Small helpers for kombu connections that sleep between uses."""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
from typing import Any

__all__ = ["NodeLog", "abort", "keep_alive", "negotiated_heartbeat", "reset_connection"]

logger = logging.getLogger(__name__)


class NodeLog:
    """Logs the node a connection is on when it first connects, and when it moves to another
    (given several nodes, kombu's failover moves it to the next when one fails). URLs are shown
    with their password hidden."""

    def __init__(self, what: str, where: str = "RabbitMQ") -> None:
        self.what = what  # "claims", "tasks", ...
        self.where = where
        self.node: str | None = None

    def note(self, connection: Any) -> None:
        node = connection.as_uri()
        if node == self.node:
            return
        if self.node is None:
            logger.info("anarchon: %s on %s at %s", self.what, self.where, node)
        else:
            logger.warning("anarchon: %s moved from %s at %s to %s", self.what, self.where, self.node, node)
        self.node = node


def keep_alive(connection: Any) -> None:
    """Read what the broker sent while we slept (heartbeats, a close) and send our heartbeat.

    Cheap, and a no-op when the connection is not open. Raises the connection's errors when the
    broker has gone away, so that the caller can drop the connection before relying on it.

    Also a no-op on a transport without heartbeats (kombu's ``supports_heartbeats``: Redis, SQS,
    the virtual transports), which has nothing to read or send while idle: its ``drain_events`` is
    a consumer's poll, which would take messages from the queues consumed on the connection.
    """
    if not connection.supports_heartbeats or not connection.connected:
        return
    raw = connection.connection
    while True:
        try:
            raw.drain_events(timeout=0)
        except TimeoutError:
            break
    connection.heartbeat_check(rate=3)


def negotiated_heartbeat(connection: Any) -> float:
    """The heartbeat in force: the one agreed with the broker once connected, else the one asked.
    0 on a transport without heartbeats, whatever was asked: there is nothing to keep up."""
    if not connection.supports_heartbeats:
        return 0.0
    raw = connection._connection if connection.connected else None
    value = getattr(raw, "heartbeat", None) if raw is not None else None
    return float(value if value is not None else connection.heartbeat or 0)


def reset_connection(connection: Any) -> None:
    """Drop ``connection`` at once, without the closing handshake, discarding what the kernel has
    not delivered yet (see :func:`abort`). Never raises; the connection connects again if used."""
    with contextlib.suppress(Exception):
        abort(connection)
    with contextlib.suppress(Exception):
        connection.collect()


def abort(connection: Any) -> None:
    """Make the coming close of ``connection`` drop what the kernel has not delivered yet.

    A plain close sends the socket's buffered data first: a claim stuck there (the broker silent,
    the network stalled) could then reach its gate long after its deadline, even after the gate
    expired. A reset instead (SO_LINGER 0) discards it.
    """
    raw = connection._connection  # not .connection, which would connect
    transport = getattr(raw, "_transport", None)  # not .transport, which would connect too
    sock = getattr(transport, "sock", None)
    if sock is not None:
        with contextlib.suppress(Exception):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
