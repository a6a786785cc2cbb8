"""Declaring gates ahead of their claims, on a connection of their own and without waiting for
the answers: creating a durable queue is the slowest thing the broker does for a run (a few
milliseconds each, one after the other, and slower while it deletes expired gates), and the claims
of other runs must not queue up behind it."""

from __future__ import annotations

import logging
import select
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import amqp
from amqp import spec
from kombu import Connection

from ...connections import NodeLog, abort
from .declaring import write_declare
from .link import READ_SLICE, Link, text
from .names import gate_arguments

logger = logging.getLogger(__name__)

#: Seconds without declares ahead after their connection failed (the claims declare meanwhile).
PREPARE_BACKOFF = 5.0


class Preparer:
    """The declares of gates on a connection of their own. The answers are read, without
    blocking, whenever the backend passes by (:meth:`collect`); a gate whose answer has not come
    yet is simply declared by its claim."""

    def __init__(self, connection: Connection, arguments: dict[str, Any], timeout: float) -> None:
        self.connection = connection
        self.arguments = arguments
        self.timeout = timeout
        self.channel: amqp.Channel | None = None
        self.in_flight: deque[tuple[str, float]] = deque()  # gates declared, unanswered, in order
        self.nodes = NodeLog("gates declared ahead")

    def declare(self, gates: Sequence[str]) -> None:
        """Write the gates' declares (connecting first if needed); raises the connection's errors."""
        if self.channel is None or not self.channel.is_open:
            self.in_flight.clear()  # the answers of an earlier channel are not coming
            self.connection.ensure_connection(max_retries=0)  # one attempt: the claims declare meanwhile
            self.nodes.note(self.connection)
            self.channel = self.connection.connection.channel()
        now = time.monotonic()
        for gate in gates:
            write_declare(self.channel, gate, self.arguments)
            self.in_flight.append((gate, now))

    def collect(self, timeout: float = 0) -> list[str]:
        """The gates whose declare the broker has answered since the last call, waiting at most
        ``timeout`` seconds for them all. Raises the connection's errors, and TimeoutError when
        the oldest declare is unanswered after the backend's timeout.

        A gate the broker objects to (not a gate, or refused) closes the channel, and the
        declares written after it are dropped with it: that gate is left to its claim (which
        adopts it or reports what is wrong), the others are written again on the channel py-amqp
        reopens."""
        done: list[str] = []
        until = time.monotonic() + timeout
        while self.in_flight and self.channel is not None:
            left = until - time.monotonic()
            if left <= 0 and not self._readable():
                break
            try:
                # A bounded wait even when data is there: at timeout 0, py-amqp would spin until
                # the rest of a frame it has begun to read arrives.
                name = self.channel.wait(spec.Queue.DeclareOk, timeout=max(left, READ_SLICE))
            except TimeoutError:
                if not self.channel.is_open:  # closed by the broker, and not reopened
                    self.channel = None
                elif until - time.monotonic() <= 0:
                    break
                continue
            except amqp.exceptions.ChannelError:
                again = [gate for gate, _ in list(self.in_flight)[1:]]
                self.in_flight.clear()
                if self.channel.is_open and again:
                    self.declare(again)
                continue
            gate, _ = self.in_flight.popleft()
            if text(name) != gate:  # answers come in order: a mismatch means we lost track
                raise amqp.exceptions.RecoverableConnectionError(
                    f"the broker answered the declare of {text(name)!r} where {gate!r} was expected"
                )
            done.append(gate)
        if self.in_flight and self.channel is not None and time.monotonic() - self.in_flight[0][1] > self.timeout:
            raise TimeoutError(f"no answer to a gate's declare within {self.timeout}s")
        return done

    def _readable(self) -> bool:
        """Whether an answer (or part of one) is waiting to be read."""
        raw = self.channel.connection if self.channel is not None else None
        transport = getattr(raw, "transport", None)
        if transport is None:
            return False
        if getattr(transport, "_read_buffer", None):  # py-amqp keeps part of a frame read earlier
            return True
        sock = transport.sock
        pending = getattr(sock, "pending", None)  # TLS: decrypted bytes not read yet
        if pending is not None and pending():
            return True
        return bool(select.select([sock], [], [], 0)[0])

    def close(self, *, broken: bool = False) -> None:
        """Close the connection; a ``broken`` one is only dropped (nothing more is sent on it)."""
        self.in_flight.clear()
        self.channel = None
        if broken:
            abort(self.connection)
            self.connection.collect()
            return
        try:
            self.connection.release()
        except Exception:  # noqa: BLE001 - closing is best effort; the socket goes anyway
            self.connection.collect()


class DeclaresAhead:
    """The gates declared ahead of their claims, and those the broker has answered: they live on
    the broker (durable, ``slot_ttl_ms`` from that declaration), whatever happens to the claims'
    connection."""

    def __init__(self, link: Link, slot_ttl_ms: int) -> None:
        self.link = link
        self.slot_ttl_ms = slot_ttl_ms
        self.ready: dict[str, float] = {}  # gate: when its declare was answered (monotonic)
        self._preparer: Preparer | None = None
        self._prepare_after = 0.0  # monotonic: no new connection for prepare() before then

    def prepare(self, gates: Sequence[str]) -> None:
        """Write the declares of the gates not declared yet (see :meth:`RabbitMQBackend.prepare`)."""
        self.collect()
        now = time.monotonic()
        for gate in [g for g, at in self.ready.items() if now - at > self.slot_ttl_ms / 1000]:
            del self.ready[gate]  # a run that was never claimed (skipped, or the instance stopping)
        preparer = self._preparer
        in_flight = {gate for gate, _ in preparer.in_flight} if preparer is not None else set()
        todo = [gate for gate in dict.fromkeys(gates) if gate not in self.ready and gate not in in_flight]
        if not todo:
            return
        if preparer is None:
            if now < self._prepare_after:
                return  # the last attempt failed a moment ago: the claims declare their gates
            # heartbeat 0: between declares the connection sits unread, with nothing to answer.
            connection = self.link.connection.clone(heartbeat=0)
            preparer = self._preparer = Preparer(
                connection, gate_arguments(self.slot_ttl_ms), self.link.confirm_timeout
            )
        try:
            preparer.declare(todo)
        except self.link.errors() as exc:
            self._drop(exc)

    def collect(self, timeout: float = 0) -> None:
        """Take in the broker's answers to the declares, waiting at most ``timeout`` seconds for
        them all (0: only those already here)."""
        preparer = self._preparer
        if preparer is None:
            return
        try:
            declared = preparer.collect(timeout)
        except self.link.errors() as exc:
            self._drop(exc)
            return
        now = time.monotonic()
        for gate in declared:
            self.ready[gate] = now

    def _drop(self, exc: BaseException) -> None:
        preparer, self._preparer = self._preparer, None
        if preparer is None:
            return
        self._prepare_after = time.monotonic() + PREPARE_BACKOFF
        logger.info(
            "anarchon: %d gate(s) not declared ahead (%s: %s); their claims declare them",
            len(preparer.in_flight),
            type(exc).__name__,
            exc,
        )
        preparer.close(broken=True)

    def close(self, *, broken: bool = False) -> None:
        self.ready.clear()
        if self._preparer is not None:
            self._preparer.close(broken=broken)
            self._preparer = None
