"""RabbitMQBackend: a one-message "gate" queue per run decides who runs it.

Each run gets a queue ``<prefix><job>.slot.<slot>`` that holds one message and refuses the rest
(``x-max-length: 1``, ``x-overflow: reject-publish``) and deletes itself ``slot_ttl_ms`` after its
last use (``x-expires``). Every instance publishes one persistent claim into it on a confirm
channel: the broker acks the publish that filled the queue and nacks every later one, so exactly
one instance gets the ack. Anything else (a connection lost before the answer, a confirm that
never comes, a claim returned as unroutable) is *not* a win: the run is skipped rather than risk
running it twice.

Gates are durable classic queues: transient non-exclusive queues are refused by RabbitMQ 4.3 and
later, a transient claim message would vanish with a broker restart and leave the gate open, and
quorum queues overshoot ``x-max-length`` under reject-publish (several winners).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import select
import socket
import struct
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import amqp
from amqp import spec
from kombu import Connection
from kombu.exceptions import OperationalError
from kombu.utils.url import maybe_sanitize_url

from .. import clock
from ..connections import keep_alive, negotiated_heartbeat
from ..errors import BrokerError, BrokerRefused, BrokerUnavailable, ConfigError
from ..history import decode_event
from .base import Backend, Claim, Outcome, check_prefix, check_slot_ttl
from .peers import Peers

__all__ = ["RabbitMQBackend", "gate_arguments", "gate_name", "history_arguments", "history_name", "reset_connection"]

logger = logging.getLogger(__name__)

MIN_VERSION = (3, 9)
AMQP_SCHEMES = ("amqp", "amqps", "pyamqp")

_INEQUIVALENT = re.compile(r"inequivalent arg '([^']+)' for .*: received (.*) but current is (.*)\Z")
_VALUE = re.compile(r"'([^']*)'")


DEFAULT_CONFIRM_TIMEOUT = 5.0
#: Seconds a read of answers already arriving may wait for the rest of them.
READ_SLICE = 0.05
#: Seconds without declares ahead after their connection failed (the claims declare meanwhile).
PREPARE_BACKOFF = 5.0


#: Seconds a connection attempt may take, by default (Celery's broker_connection_timeout is 4).
DEFAULT_CONNECT_TIMEOUT = 5.0
#: The AMQP heartbeat of the backend's own connection, by default (Celery's broker_heartbeat is 120).
DEFAULT_HEARTBEAT = 60.0


def _own_connection_options(confirm_timeout: float) -> dict[str, Any]:
    """kombu Connection options for a connection of the backend's own."""
    # Every broker answer is awaited at most this long: a silent broker is an outage.
    return {"transport_options": {"read_timeout": confirm_timeout, "write_timeout": confirm_timeout}}


def app_connection_options(app: Any) -> dict[str, Any]:
    """The heartbeat, connect timeout and failover strategy of the app's ``broker_heartbeat``,
    ``broker_connection_timeout`` and ``broker_failover_strategy`` settings, for connections of
    ours to its brokers."""
    conf = app.conf
    heartbeat = conf.get("broker_heartbeat")
    timeout = conf.get("broker_connection_timeout")
    return {
        "heartbeat": float(heartbeat) if heartbeat is not None else 0.0,
        "connect_timeout": float(timeout) if timeout else DEFAULT_CONNECT_TIMEOUT,
        "failover_strategy": conf.get("broker_failover_strategy") or "round-robin",
    }


def gate_name(prefix: str, job: str, slot: int) -> str:
    """The gate queue of one run."""
    return f"{prefix}{job}.slot.{slot}"


def gate_arguments(slot_ttl_ms: int) -> dict[str, Any]:
    """The arguments every gate is declared with.

    The queue type is explicit: a broker whose default queue type is quorum would otherwise make
    gates quorum queues, which let several publishers past ``x-max-length``.
    """
    return {"x-max-length": 1, "x-overflow": "reject-publish", "x-expires": slot_ttl_ms, "x-queue-type": "classic"}


#: Stream bytes budgeted per run: its three small JSON events with their storage overhead (about
#: 450 bytes each, measured), with room for long error messages and host names.
RUN_BYTES = 2_000
MIN_SEGMENT_BYTES = 4_096


def history_name(prefix: str, job: str) -> str:
    """The stream that keeps a job's history."""
    return f"{prefix}{job}.history"


def history_arguments(history_size: int) -> dict[str, Any]:
    """A history stream's arguments, sized to keep at least ``history_size`` runs.

    Retention drops whole segments, so the stream holds between ``max - segment`` and ``max``
    bytes: a segment a quarter of the budget keeps retention close to the size asked for.
    """
    segment = max(MIN_SEGMENT_BYTES, history_size * RUN_BYTES // 4)
    return {
        "x-queue-type": "stream",
        "x-max-length-bytes": history_size * RUN_BYTES + segment,
        "x-stream-max-segment-size-bytes": segment,
    }


def node_urls(url: str | Sequence[str]) -> list[str]:
    """The AMQP URLs of ``url``: one, several joined by ``;``, or a list; ConfigError, with the
    offending URL (password hidden), unless each is amqp:// or amqps://."""
    given: list[Any] = (
        url.split(";") if isinstance(url, str) else list(url) if isinstance(url, (list, tuple)) else [url]
    )
    urls = []
    for one in given:
        if one == "":
            continue  # "a;b;" is "a;b"
        if not isinstance(one, str) or one.strip().split("://", 1)[0] not in AMQP_SCHEMES:
            shown = maybe_sanitize_url(one) if isinstance(one, str) else repr(one)
            raise ConfigError(f"RabbitMQBackend needs AMQP URLs (amqp://, amqps://), not {shown}")
        urls.append(one.strip())
    if not urls:
        raise ConfigError("RabbitMQBackend needs at least one AMQP URL")
    return urls


def _current_value(text: str) -> str | None:
    """The current value in a 406 reply: ``'60000'``, ``the value '60000' of type 'long'``, ``none``."""
    match = _VALUE.search(text)
    return match.group(1) if match else None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def check_server(properties: dict[str, Any], where: str) -> tuple[int, ...]:
    """The broker's version from its AMQP server properties; BrokerError unless RabbitMQ >= 3.9."""
    product = _text(properties.get("product", ""))
    version = tuple(int(n) for n in re.findall(r"\d+", _text(properties.get("version", "")))[:3])
    if product != "RabbitMQ" or version < MIN_VERSION:
        shown = ".".join(map(str, version)) or "of unknown version"
        raise BrokerError(
            f"{where} is {product or 'an unknown broker'} {shown}: RabbitMQBackend needs RabbitMQ "
            f"{'.'.join(map(str, MIN_VERSION))} or newer (streams, reject-publish)"
        )
    return version


class _Confirms:
    """A confirm-mode channel and the answers to the claims published on it.

    Answers are matched by delivery tag; a ``basic.return`` (which RabbitMQ sends before the ack
    of the same message) is matched by routing key, the gate's name, which is unique per claim.
    """

    def __init__(self, connection: amqp.Connection) -> None:
        self.channel = connection.channel()
        self.channel.confirm_select()
        self.next_tag = 1
        self.pending: dict[int, str] = {}
        self.answers: dict[str, Outcome] = {}
        self.returned: set[str] = set()
        self.won: list[str] = []  # gates answered WON since the caller last took them
        self.dead = False
        self.channel.events["basic_ack"].add(self._on_ack)
        self.channel.events["basic_nack"].add(self._on_nack)
        self.channel.events["basic_return"].add(self._on_return)

    def publish(self, gate: str, body: bytes) -> None:
        message = amqp.Message(body, delivery_mode=2, content_type="application/json")
        tag = self.next_tag
        self.next_tag += 1  # the broker numbers every publish on the channel, even a failed one
        self.pending[tag] = gate
        # The plain publish, even on a connection made with confirm_publish=True (whose
        # basic_publish would wait for each answer in turn and raise on a nack).
        amqp.Channel._basic_publish(self.channel, message, exchange="", routing_key=gate, mandatory=True)

    def _on_return(self, exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
        if not self.dead:
            self.returned.add(routing_key)

    def _on_ack(self, tag: int, multiple: bool) -> None:
        self._settle(tag, multiple, Outcome.WON)

    def _on_nack(self, tag: int, multiple: bool) -> None:
        self._settle(tag, multiple, Outcome.LOST)

    def _settle(self, tag: int, multiple: bool, outcome: Outcome) -> None:
        if self.dead:  # a late answer on an abandoned channel means nothing any more
            return
        tags = [t for t in self.pending if t <= tag] if multiple else [tag]
        for t in tags:
            gate = self.pending.pop(t, None)
            if gate is None:
                continue
            if gate in self.returned:
                # Unroutable: the gate vanished between declare and publish. The broker acks a
                # returned message, but nothing holds the gate: not a win.
                self.returned.discard(gate)
                self.answers[gate] = Outcome.UNDECIDED
            else:
                self.answers[gate] = outcome
                if outcome is Outcome.WON:
                    self.won.append(gate)


class _StreamRead:
    """Reading history streams to their end. Per job, a consumer from the stream's last chunk
    tells where its end is: its first delivery is where that chunk starts. Once the reader from
    the start gets there, the end is fixed at the highest offset the last-chunk consumer has
    seen, so that a stream being written all along is read to a fixed point, not chased."""

    def __init__(self, channel: amqp.Channel) -> None:
        self.channel = channel
        self.last_chunk: dict[str, int] = {}  # where the last chunk starts
        self.end: dict[str, int] = {}  # the highest offset seen from the last chunk on
        self.fixed: set[str] = set()  # jobs whose end no longer moves
        self.reached: dict[str, int] = {}  # the highest offset read from the start
        self.moved = time.monotonic()  # when a message last arrived

    def _offset(self, message: amqp.Message) -> int:
        self.channel.basic_ack(message.delivery_tag)
        self.moved = time.monotonic()
        offset = (message.headers or {}).get("x-stream-offset")
        return offset if isinstance(offset, int) else -1

    def _fix(self, job: str) -> None:
        if job in self.last_chunk and self.reached.get(job, -1) >= self.last_chunk[job]:
            self.fixed.add(job)

    def tail(self, job: str) -> Callable[[amqp.Message], None]:
        def on_message(message: amqp.Message) -> None:
            offset = self._offset(message)
            if job not in self.fixed:
                self.last_chunk.setdefault(job, offset)
                self.end[job] = max(self.end.get(job, -1), offset)
                self._fix(job)

        return on_message

    def events(self, job: str, into: list[dict[str, Any]]) -> Callable[[amqp.Message], None]:
        def on_message(message: amqp.Message) -> None:
            self.reached[job] = max(self.reached.get(job, -1), self._offset(message))
            self._fix(job)
            event = decode_event(message.body)
            if event is not None:
                into.append(event)

        return on_message

    def unfinished(self, jobs: Sequence[str], *, empty: bool) -> list[str]:
        """The jobs not read to their end yet; with ``empty``, a stream that delivered nothing
        at all counts as empty (and read)."""
        left = []
        for job in jobs:
            if job in self.fixed:
                if self.reached[job] < self.end[job]:
                    left.append(job)
            elif job in self.end or job in self.reached or not empty:
                left.append(job)  # its last chunk is still to come
        return left


def _write_declare(channel: amqp.Channel, gate: str, arguments: dict[str, Any]) -> None:
    """Write a gate's declare without waiting for its answer (the broker answers a channel's
    methods in order)."""
    # queue.declare's fields: ticket, queue, passive, durable, exclusive, auto_delete, nowait,
    # arguments. Not nowait: a declare with nowait does not renew x-expires.
    channel.send_method(spec.Queue.Declare, "BsbbbbbF", (0, gate, False, True, False, False, False, arguments))


class _Preparer:
    """Declares gates ahead of their claims on a connection of its own, without waiting for the
    answers: creating a durable queue is the slowest thing the broker does for a run (a few
    milliseconds each, one after the other, and slower while it deletes expired gates), and the
    claims of other runs must not queue up behind it. The answers are read, without blocking,
    whenever the backend passes by (:meth:`collect`); a gate whose answer has not come yet is
    simply declared by its claim.
    """

    def __init__(self, connection: Connection, arguments: dict[str, Any], timeout: float) -> None:
        self.connection = connection
        self.arguments = arguments
        self.timeout = timeout
        self.channel: amqp.Channel | None = None
        self.in_flight: deque[tuple[str, float]] = deque()  # gates declared, unanswered, in order

    def declare(self, gates: Sequence[str]) -> None:
        """Write the gates' declares (connecting first if needed); raises the connection's errors."""
        if self.channel is None or not self.channel.is_open:
            self.in_flight.clear()  # the answers of an earlier channel are not coming
            self.connection.ensure_connection(max_retries=0)  # one attempt: the claims declare meanwhile
            self.channel = self.connection.connection.channel()
        now = time.monotonic()
        for gate in gates:
            _write_declare(self.channel, gate, self.arguments)
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
            if _text(name) != gate:  # answers come in order: a mismatch means we lost track
                raise amqp.exceptions.RecoverableConnectionError(
                    f"the broker answered the declare of {_text(name)!r} where {gate!r} was expected"
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
            _abort(self.connection)
            self.connection.collect()
            return
        try:
            self.connection.release()
        except Exception:  # noqa: BLE001 - closing is best effort; the socket goes anyway
            self.connection.collect()


class RabbitMQBackend(Backend):
    """Claims runs in RabbitMQ (3.9 or newer) with gate queues and publisher confirms.

    Arguments:
        url: AMQP URL of the broker (``amqp://user:password@host:5672/vhost``), or the URLs of
            the nodes of a cluster, as a list or joined by ``;`` as in Celery's ``broker_url``:
            the connections move to the next node by themselves when theirs goes.
        connection: your own :class:`kombu.Connection`. You keep ownership: it is never closed
            here (a broken one is revived, as kombu does). Give it a ``read_timeout`` transport
            option, or a broker that stops answering can hold a claim up.
        prefix: prefix of every queue name.
        slot_ttl_ms: how long RabbitMQ remembers that a run was taken (each gate's
            ``x-expires``). A job's ``jitter_ms + max_late_ms`` must be shorter.
        confirm_timeout: seconds to wait for any answer of the broker (a declare, a claim's
            confirm) before treating the claim as not won.
        heartbeat: AMQP heartbeat of the backend's own connection, in seconds (0: none). From
            the app's settings, it is ``broker_heartbeat``.
        connect_timeout: seconds one connection attempt may take. From the app's settings, it is
            ``broker_connection_timeout``.
        failover_strategy: the order in which the nodes of ``url`` are tried, as kombu's
            (``round-robin``, ``shuffle``, or an iterator factory). From the app's settings, it is
            ``broker_failover_strategy``.
        ssl: as kombu's ``Connection(ssl=...)``.
    """

    def __init__(
        self,
        url: str | Sequence[str] = "amqp://localhost",
        connection: Connection | None = None,
        prefix: str = "cron.",
        slot_ttl_ms: int = 300_000,
        *,
        confirm_timeout: float = DEFAULT_CONFIRM_TIMEOUT,
        heartbeat: float = DEFAULT_HEARTBEAT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        failover_strategy: Any = "round-robin",
        ssl: Any = None,
    ) -> None:
        self.prefix = check_prefix(prefix)
        self.slot_ttl_ms = check_slot_ttl(slot_ttl_ms)
        if (
            isinstance(confirm_timeout, bool)
            or not isinstance(confirm_timeout, (int, float))
            or not 0 < confirm_timeout <= 300
        ):
            raise ConfigError(f"confirm_timeout must be seconds in (0, 300], not {confirm_timeout!r}")
        self.confirm_timeout = float(confirm_timeout)
        #: How many times a claim left without an answer is made again (see :meth:`claim`).
        self.claim_retries = 2
        self._owned = connection is None
        if connection is None:
            connection = Connection(
                ";".join(node_urls(url)),
                heartbeat=heartbeat,
                ssl=ssl,
                connect_timeout=connect_timeout,
                failover_strategy=failover_strategy,
                **_own_connection_options(self.confirm_timeout),
            )
        elif not isinstance(connection, Connection):
            raise ConfigError(f"connection must be a kombu Connection, not {type(connection).__name__}")
        elif connection.transport_cls not in AMQP_SCHEMES:
            raise ConfigError(f"RabbitMQBackend needs an AMQP connection, not {connection.transport_cls!r}")
        self.connection = connection
        self._declarer: amqp.Channel | None = None
        self._confirms: _Confirms | None = None
        self._recorder: amqp.Channel | None = None
        self._streams: set[str] = set()  # history streams declared on the current connection
        # Gates declared ahead of their claim by prepare(), with when: they live on the broker
        # (durable, slot_ttl_ms from that declaration), whatever happens to the connection.
        self._ready: dict[str, float] = {}
        self._preparer: _Preparer | None = None
        self._prepare_after = 0.0  # monotonic: no new connection for prepare() before then
        self._opened = False
        self._node: str | None = None  # the node connected to last (as_uri)
        self._outage_since: float | None = None
        # Job definitions shared with the other instances (share_definitions), on a channel of
        # the claims' connection: their announcements are read whenever it is.
        self._peers: Peers | None = None
        self._peers_channel: amqp.Channel | None = None
        self._peers_refused = False
        self._outage_missed = 0  # runs not claimed during the current outage
        self._outage_reminded = 0.0  # time.monotonic() of its last line

    @classmethod
    def from_app(cls, app: Any, *, prefix: str = "cron.", slot_ttl_ms: int = 300_000) -> RabbitMQBackend:
        """A backend on the app's broker, with a connection of its own built from every
        ``broker_*`` setting (failover URLs, TLS, login method, transport options)."""
        connection = app.connection_for_write(
            **app_connection_options(app), **_own_connection_options(DEFAULT_CONFIRM_TIMEOUT)
        )
        backend = cls(connection=connection, prefix=prefix, slot_ttl_ms=slot_ttl_ms)
        backend._owned = True
        return backend

    # -- lifecycle ----------------------------------------------------------------------------

    def open(self) -> None:
        if self._opened:
            return
        try:
            self.connection.ensure_connection(max_retries=3, interval_start=0.5, interval_step=1)
        except self._errors() as exc:
            raise self._unreachable(exc) from exc
        self._check_server()

    def _unreachable(self, exc: BaseException) -> BrokerUnavailable | BrokerRefused:
        refusal = _refusal(exc, self.connection)
        if refusal is not None:
            return BrokerRefused(f"RabbitMQ at {self.connection.as_uri()} {refusal}")
        return BrokerUnavailable(
            f"cannot reach RabbitMQ at {self.connection.as_uri()}: {exc}. Check that it is "
            "running and that anarchon_backend (or broker_url) points at it"
        )

    def _check_server(self) -> None:
        properties = self.connection.connection.server_properties or {}
        self.server_version = check_server(properties, self.connection.as_uri())
        self._opened = True
        self._note_node()

    def _note_node(self) -> None:
        """Log the node the connection is on when it connects, and when it moves to another
        (with several nodes, kombu moves to the next when one fails)."""
        node = self.connection.as_uri()
        if node == self._node:
            return
        if self._node is None:
            logger.info("anarchon: claims on RabbitMQ at %s", node)
        else:
            logger.warning("anarchon: claims moved from RabbitMQ at %s to %s", self._node, node)
        self._node = node

    def close(self) -> None:
        self._opened = False
        if not self._owned and self._peers_channel is not None:
            with contextlib.suppress(Exception):  # the caller's connection stays; our consumer goes
                self._peers_channel.close()
        self._peers_channel = None
        if self._owned:
            try:
                self.connection.release()
            except Exception:  # noqa: BLE001 - closing is best effort; the socket goes anyway
                self.connection.collect()
        self._declarer = None
        self._confirms = None
        self._recorder = None
        self._streams.clear()
        self._ready.clear()
        if self._preparer is not None:
            self._preparer.close()
            self._preparer = None

    def abandon(self) -> None:
        self._opened = False
        self._discard(connection_lost=True)
        self._ready.clear()
        if self._preparer is not None:
            self._preparer.close(broken=True)
            self._preparer = None

    def describe(self) -> str:
        return f"rabbitmq {self.connection.as_uri()} (prefix {self.prefix!r}, slot_ttl_ms {self.slot_ttl_ms})"

    def max_idle_s(self) -> float | None:
        heartbeat = negotiated_heartbeat(self.connection)
        return max(1.0, heartbeat / 3) if heartbeat else None

    def maintain(self) -> None:
        if not self._opened:
            return
        self.await_prepared()
        try:
            keep_alive(self.connection)  # reads the other instances' announcements too
            self._keep_peers()
        except amqp.exceptions.ChannelError as exc:
            logger.info("anarchon: a channel was closed by RabbitMQ while idle (%s)", exc)
            self._declarer = self._recorder = None
            self._streams.clear()
        except self._errors() as exc:
            logger.info("anarchon: the connection to RabbitMQ dropped while idle (%s); it will be replaced", exc)
            self._discard(connection_lost=True)

    # -- the other instances ------------------------------------------------------------------

    def share_definitions(self, instance: str, definitions: Mapping[str, Mapping[str, str]]) -> None:
        """See :meth:`Backend.share_definitions`: announcements go through a fanout exchange
        ``<prefix>anarchon.instances`` (transient, deleted with its last queue) to an exclusive
        queue of each instance, consumed on the claims' connection."""
        self._peers = Peers(instance, definitions)
        self._peers_channel = None
        try:
            self._keep_peers()
        except self._errors() as exc:
            logger.info("anarchon: job definitions not shared yet (%s: %s)", type(exc).__name__, exc)
            self._discard(connection_lost=True)

    def _keep_peers(self) -> None:
        """Listen to the other instances (again, after a new connection: saying hello) and answer
        a newcomer. Raises the connection's errors; a refusal turns sharing off, logged once."""
        peers = self._peers
        if peers is None or self._peers_refused or not self.connection.connected:
            return
        channel = self._peers_channel
        if channel is None or not channel.is_open:
            exchange = f"{self.prefix}anarchon.instances"
            try:
                channel = self.connection.connection.channel()
                channel.exchange_declare(exchange, "fanout", durable=False, auto_delete=True)
                # Named under the prefix (not amq.gen-...), so that the prefix's permissions cover it.
                queue = f"{self.prefix}anarchon.instance.{uuid.uuid4().hex[:12]}"
                channel.queue_declare(queue, exclusive=True, auto_delete=True)
                channel.queue_bind(queue, exchange)
                channel.basic_consume(queue, no_ack=True, callback=lambda message: peers.heard(message.body))
            except amqp.exceptions.ChannelError as exc:
                self._peers_refused = True
                logger.info(
                    "anarchon: job definitions are not compared with the other instances: RabbitMQ refused "
                    "exchange %r (%s)",
                    exchange,
                    exc,
                )
                return
            self._peers_channel = channel
            self._announce(channel, hello=True)
        elif peers.answer_due:
            self._announce(channel, hello=False)

    def _announce(self, channel: amqp.Channel, *, hello: bool) -> None:
        assert self._peers is not None
        self._peers.answer_due = False
        message = amqp.Message(self._peers.announcement(hello=hello), content_type="application/json")
        amqp.Channel._basic_publish(channel, message, exchange=f"{self.prefix}anarchon.instances", routing_key="")

    # -- the claim ----------------------------------------------------------------------------

    def prepare(self, claims: Sequence[Claim]) -> None:
        """Declare the gates of runs due shortly, so that their claims are only a publish. A gate
        counts its ``x-expires`` from this declaration: the scheduler's lead is part of the safety
        rule. The declares go out on a connection of their own and are not waited for (see
        :class:`_Preparer`): they never hold a claim up. Best effort: a gate not made here, or
        not answered yet, is declared by its claim."""
        if not claims or self._outage_since is not None:
            return  # while RabbitMQ is away, the claims alone try to reach it (bounded by deadlines)
        self.await_prepared()
        now = time.monotonic()
        for gate in [g for g, at in self._ready.items() if now - at > self.slot_ttl_ms / 1000]:
            del self._ready[gate]  # a run that was never claimed (skipped, or the instance stopping)
        preparer = self._preparer
        in_flight = {gate for gate, _ in preparer.in_flight} if preparer is not None else set()
        named = dict.fromkeys(gate_name(self.prefix, claim.job, claim.slot) for claim in claims)
        gates = [gate for gate in named if gate not in self._ready and gate not in in_flight]
        if not gates:
            return
        if preparer is None:
            if now < self._prepare_after:
                return  # the last attempt failed a moment ago: the claims declare their gates
            # heartbeat 0: between declares the connection sits unread, with nothing to answer.
            connection = self.connection.clone(heartbeat=0)
            preparer = self._preparer = _Preparer(connection, gate_arguments(self.slot_ttl_ms), self.confirm_timeout)
        try:
            preparer.declare(gates)
        except self._errors() as exc:
            self._drop_preparer(exc)

    def await_prepared(self, timeout: float = 0) -> None:
        """Take in the broker's answers to the declares of :meth:`prepare`, waiting at most
        ``timeout`` seconds for them all (0: only those already here)."""
        preparer = self._preparer
        if preparer is None:
            return
        try:
            declared = preparer.collect(timeout)
        except self._errors() as exc:
            self._drop_preparer(exc)
            return
        now = time.monotonic()
        for gate in declared:
            self._ready[gate] = now

    def _drop_preparer(self, exc: BaseException) -> None:
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

    def claim(
        self, claims: Sequence[Claim], instance: str, *, on_won: Callable[[Claim], None] | None = None
    ) -> list[Outcome]:
        """Claim runs; see :meth:`Backend.claim`.

        Reconnecting is bounded by the claims' deadlines; a claim is never published after its
        deadline, and its answer is awaited at most ``confirm_timeout`` seconds.

        A claim left without an answer (connection lost, confirm timeout) is made again on a new
        connection while its deadline allows. That can never make a second winner: the broker
        acks at most one publish per gate. If our first publish did arrive, the gate is held and
        the new one is nacked (the run is then lost, never doubled); if it did not, the gate is
        still empty and the run is won a little late instead of lost.
        """
        self.await_prepared()  # the gates declared ahead meanwhile are not declared again
        outcomes: dict[str, Outcome] = {}
        pending = [(claim, gate_name(self.prefix, claim.job, claim.slot)) for claim in claims]
        for attempt in range(1 + self.claim_retries):
            unanswered = self._claim_once(
                pending, instance, outcomes, last=attempt == self.claim_retries, on_won=on_won
            )
            pending = [(c, g) for c, g in pending if g in unanswered]
            if not pending:
                break
        return [outcomes[gate_name(self.prefix, c.job, c.slot)] for c in claims]

    def _claim_once(
        self,
        claims: list[tuple[Claim, str]],
        instance: str,
        outcomes: dict[str, Outcome],
        *,
        last: bool,
        on_won: Callable[[Claim], None] | None = None,
    ) -> set[str]:
        """One round of :meth:`claim`; returns the gates whose claim may be made again."""
        claims = self._within_deadline(claims, outcomes, "before connecting")
        if not claims:
            return set()
        just_claims = [claim for claim, _ in claims]
        # Nothing is published before the gates are declared, so this part is safe to repeat: a
        # connection found dead (the broker restarted, or dropped it while we slept) is replaced
        # at once, and only then is the outage reported.
        for attempt in (1, 2):
            left = _seconds_until(just_claims)
            try:
                raw = self._connect(left)
                # Gates made ahead by prepare() are not declared again: at the slot, only the claim.
                undeclared = [gate for _, gate in claims if gate not in self._ready]
                declared = dict(zip(undeclared, self._declare_gates(undeclared)))
                usable = [declared.get(gate, True) for _, gate in claims]
                for _, gate in claims:
                    self._ready.pop(gate, None)
                break
            except self._errors() as exc:
                self._discard(connection_lost=True)
                left = _seconds_until(just_claims)
                if attempt == 2 or (left is not None and left <= 0):
                    self._outage(exc)
                    self._outage_missed += len(claims)  # reported once, when the outage ends
                    for claim, gate in claims:
                        logger.debug(
                            "anarchon: job %r slot %d: not claimed, RabbitMQ is unavailable; not run by this instance",
                            claim.job,
                            claim.slot,
                        )
                        outcomes[gate] = Outcome.UNDECIDED
                    return set()
                logger.info("anarchon: reconnecting to RabbitMQ (%s: %s)", type(exc).__name__, exc)

        gated = []
        for (claim, gate), ok in zip(claims, usable):
            if ok:
                gated.append((claim, gate))
            else:
                outcomes[gate] = Outcome.BAD_GATE
        to_publish = self._within_deadline(gated, outcomes, "when the claim was ready")
        if not to_publish:
            return set()
        return self._publish(raw, to_publish, instance, outcomes, last=last, on_won=on_won)

    @staticmethod
    def _within_deadline(
        claims: list[tuple[Claim, str]], outcomes: dict[str, Outcome], when: str
    ) -> list[tuple[Claim, str]]:
        """The claims still before their deadline; the others are given up (UNDECIDED), since a
        claim published after it could land once the winner's gate has expired."""
        now = clock.now_ms()
        kept = []
        for claim, gate in claims:
            if claim.deadline_ms is not None and now > claim.deadline_ms:
                logger.warning(
                    "anarchon: job %r slot %d: past its deadline by %d ms %s; not run by this instance",
                    claim.job,
                    claim.slot,
                    now - claim.deadline_ms,
                    when,
                )
                outcomes[gate] = Outcome.UNDECIDED
            else:
                kept.append((claim, gate))
        return kept

    def _publish(
        self,
        raw: amqp.Connection,
        claims: list[tuple[Claim, str]],
        instance: str,
        outcomes: dict[str, Outcome],
        *,
        last: bool,
        on_won: Callable[[Claim], None] | None = None,
    ) -> set[str]:
        """Publish the claims and wait for their answers; returns the gates left unanswered.
        ``on_won`` hears of each win as its answer is read (outside py-amqp's event dispatch)."""
        confirms = self._confirms
        failure: BaseException | None = None
        by_gate = {gate: claim for claim, gate in claims}

        def report_wins() -> float:
            """Tell ``on_won`` of the wins read; returns the seconds that took."""
            if confirms is None or not confirms.won:
                return 0.0
            started = time.monotonic()
            gates, confirms.won = confirms.won, []
            for gate in gates:
                claim = by_gate.get(gate)
                if claim is None or on_won is None:
                    continue
                try:
                    on_won(claim)
                except Exception:  # not the broker's doing: the claim is won all the same
                    logger.exception("anarchon: job %r slot %d: on_won failed", claim.job, claim.slot)
            return time.monotonic() - started

        try:
            if confirms is None:
                confirms = self._confirms = _Confirms(raw)
            now_ms = clock.now_ms()
            for claim, gate in claims:
                body = json.dumps(
                    {"job": claim.job, "slot": claim.slot, "instance": instance, "claimed_at_ms": now_ms}
                ).encode()
                confirms.publish(gate, body)
            deadline = time.monotonic() + self.confirm_timeout
            while confirms.pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no confirm within {self.confirm_timeout}s")
                raw.drain_events(timeout=remaining)
                # The time on_won takes (writing tasks) is ours, not the broker's: it does not
                # count against confirm_timeout, or answers already here would be taken for lost.
                deadline += report_wins()
        except self._errors() as exc:
            # Never reuse this channel (a late ack on it could pass for a later win), nor, when
            # it is ours, this connection.
            self._discard(connection_lost=not isinstance(exc, TimeoutError))
            failure = exc
        report_wins()  # answers read before a failure are still wins
        answers = confirms.answers if confirms is not None else {}
        unanswered = set()
        for claim, gate in claims:
            outcome = answers.pop(gate, None)
            if outcome is None:  # no answer: try again (see claim()) or give up
                outcomes[gate] = Outcome.UNDECIDED
                unanswered.add(gate)
                logger.warning(
                    "anarchon: job %r slot %d: no answer to the claim (%s: %s); %s",
                    claim.job,
                    claim.slot,
                    type(failure).__name__,
                    failure,
                    "not run by this instance" if last else "claiming it again on a new connection",
                )
            else:
                outcomes[gate] = outcome
                if outcome is Outcome.UNDECIDED:
                    logger.warning(
                        "anarchon: job %r slot %d: the claim was returned as unroutable (its gate vanished); "
                        "not run by this instance",
                        claim.job,
                        claim.slot,
                    )
        return set() if last else unanswered

    # -- history ------------------------------------------------------------------------------

    def record(self, job: str, event: bytes, history_size: int) -> bool:
        return self._record(job, event, history_size, attempts=3)

    def _record(self, job: str, event: bytes, history_size: int, *, attempts: int) -> bool:
        name = history_name(self.prefix, job)
        message = amqp.Message(event, content_type="application/json", delivery_mode=2)
        for attempt in range(1, attempts + 1):
            try:
                self._connect(self.confirm_timeout)
                if name not in self._streams:
                    self._declare_history(name, history_size)
                    self._streams.add(name)
                if self._recorder is None or not self._recorder.is_open:
                    self._recorder = self.connection.connection.channel()
                # Confirmed, so that a refused event is known (and a newly made stream that is not
                # ready yet, 506 "stream not found", is retried) rather than silently lost.
                self._recorder.basic_publish_confirm(
                    message, exchange="", routing_key=name, confirm_timeout=self.confirm_timeout
                )
                return True
            except BrokerError as exc:
                logger.error("anarchon: job %r: history event not recorded: %s", job, exc)
                return False
            except (amqp.exceptions.ChannelError, amqp.exceptions.MessageNacked) as exc:
                self._declarer = self._recorder = None
                self._streams.discard(name)
                if attempt == attempts:
                    logger.warning("anarchon: job %r: history event not recorded (%r)", job, exc)
                    return False
                time.sleep(0.2 * attempt)
            except self._errors() as exc:
                # A history event is safe to write again (the fold ignores repeats); RabbitMQ 3.10
                # answers two clients creating one stream at once with 541, closing a connection.
                self._discard(connection_lost=True)
                if attempt == attempts:
                    logger.warning(
                        "anarchon: job %r: history event not recorded (%s: %s)", job, type(exc).__name__, exc
                    )
                    return False
                time.sleep(0.2 * attempt)
        return False

    def record_many(self, events: Sequence[tuple[str, bytes, int]]) -> int:
        """See :meth:`Backend.record_many`: the events are written one after the other on a
        confirm channel and their confirms read afterwards. Any left unconfirmed are written
        again one by one (an event written twice is folded once)."""
        if len(events) < 2:
            return super().record_many(events)
        unconfirmed = list(range(len(events)))
        connection_failed = False
        try:
            self._connect(self.confirm_timeout)
            for job, _, history_size in events:
                name = history_name(self.prefix, job)
                if name not in self._streams:
                    self._declare_history(name, history_size)
                    self._streams.add(name)
            channel = self.connection.connection.channel()
            channel.confirm_select()
            pending = set(range(1, len(events) + 1))  # delivery tag n + 1: event n
            nacked: set[int] = set()

            def settle(tag: int, multiple: bool, acked: bool) -> None:
                for t in [t for t in pending if t <= tag] if multiple else [tag]:
                    pending.discard(t)
                    if not acked:
                        nacked.add(t)

            channel.events["basic_ack"].add(lambda tag, multiple: settle(tag, multiple, True))
            channel.events["basic_nack"].add(lambda tag, multiple: settle(tag, multiple, False))
            for job, event, _ in events:
                message = amqp.Message(event, content_type="application/json", delivery_mode=2)
                amqp.Channel._basic_publish(channel, message, exchange="", routing_key=history_name(self.prefix, job))
            deadline = time.monotonic() + self.confirm_timeout
            while pending and time.monotonic() < deadline:
                self.connection.connection.drain_events(timeout=max(0.01, deadline - time.monotonic()))
            unconfirmed = sorted(t - 1 for t in pending | nacked)
            if pending:
                raise TimeoutError(f"no confirm within {self.confirm_timeout}s")
            channel.close()
        except BrokerError:
            pass  # a queue that is no history stream: record() below says so, job by job
        except self._errors() as exc:
            self._discard(connection_lost=True)
            connection_failed = True
            logger.info(
                "anarchon: %d history event(s) written again one by one (%s: %s)",
                len(unconfirmed),
                type(exc).__name__,
                exc,
            )
        recorded = len(events) - len(unconfirmed)
        for done, n in enumerate(unconfirmed):
            # After a failed connection, once each, on a new one: a cut connection is replaced at
            # once, but a broker that does not answer would hold the next claims up at every try.
            if self._record(*events[n], attempts=1 if connection_failed else 3):
                recorded += 1
            elif connection_failed:
                # RabbitMQ is not answering: one event at a time, each with its retries, would hold
                # up the next claims for as long as the outage lasts.
                logger.warning(
                    "anarchon: %d history event(s) not recorded, RabbitMQ is unavailable",
                    len(unconfirmed) - done - 1,
                )
                break
        return recorded

    def ensure_history(self, job: str, history_size: int) -> bool:
        name = history_name(self.prefix, job)
        try:
            self._connect(self.confirm_timeout)
            self._declare_history(name, history_size)
            self._streams.add(name)
            return True
        except BrokerError as exc:
            logger.error("anarchon: job %r: %s", job, exc)
        except self._errors() as exc:
            self._discard(connection_lost=True)
            logger.warning("anarchon: job %r: history stream not declared (%s: %s)", job, type(exc).__name__, exc)
        return False

    def _declare_history(self, name: str, history_size: int) -> None:
        """Declare a history stream; one that exists keeps the size it was created with."""
        sizes = ("x-max-length-bytes", "x-stream-max-segment-size-bytes", "x-max-age")
        refusal = self._declare_adopting(name, history_arguments(history_size), lambda arg, _: arg in sizes)
        if refusal is not None:
            raise BrokerError(
                f"queue {name!r} exists but is not a history stream ({refusal}): delete it (which deletes "
                "that job's history) or change anarchon_prefix"
            )

    def read_history(self, jobs: Sequence[str], empty_s: float = 0.5) -> dict[str, list[dict[str, Any]]]:
        """See :meth:`Backend.read_history`.

        Streams have no end marker in AMQP 0.9.1, and a pause in a busy broker's deliveries must
        not pass for the end: so each stream is also consumed from its last chunk (offset
        ``last``), whose offsets tell where its end is, and read from its first retained event up
        to there. A stream from which nothing at all arrives within ``empty_s`` seconds is empty.
        A read that stops moving for ``confirm_timeout`` raises BrokerError rather than return a
        history cut short.
        """
        events: dict[str, list[dict[str, Any]]] = {job: [] for job in jobs}
        try:
            raw = self._connect(self.confirm_timeout)
            existing = [job for job in jobs if self._stream_exists(history_name(self.prefix, job))]
            if not existing:
                return events
            # basic.get and no-ack consumers are refused on streams (and close the connection):
            # consume with a prefetch and manual acks. RabbitMQ 3.10 can deliver from a stream
            # before its consume-ok, which py-amqp rejects for want of a callback (and a reject
            # closes the connection: 540): so the consumers are named here and registered
            # without waiting for the answer.
            channel = raw.channel()
            channel.basic_qos(0, 1000, False)
            read = _StreamRead(channel)
            tags = []
            for n, job in enumerate(existing):
                name = history_name(self.prefix, job)
                for offset, callback in (("last", read.tail(job)), ("first", read.events(job, events[job]))):
                    tags.append(f"anarchon.history.{n}.{offset}")
                    channel.basic_consume(
                        name,
                        consumer_tag=tags[-1],
                        nowait=True,
                        callback=callback,
                        arguments={"x-stream-offset": offset},
                    )
            started = time.monotonic()
            while True:
                now = time.monotonic()
                left = read.unfinished(existing, empty=now - started >= empty_s)
                if not left:
                    break
                if now - read.moved > self.confirm_timeout:
                    raise BrokerError(
                        f"the history of {', '.join(map(repr, left))} could not be read to its end: RabbitMQ "
                        f"delivered nothing more for {self.confirm_timeout:g}s. Try again"
                    )
                with contextlib.suppress(TimeoutError):
                    raw.drain_events(timeout=READ_SLICE)
            # Cancelled first: the deliveries still under way are then taken (and acked) by their
            # consumers, where a channel closing would log each one as ignored.
            for tag in tags:
                channel.basic_cancel(tag)
            channel.close()
        except (BrokerUnavailable, BrokerRefused):
            raise
        except self._errors() as exc:
            self._discard(connection_lost=True)
            raise BrokerError(f"cannot read history from {self.connection.as_uri()}: {exc}") from exc
        return events

    def _stream_exists(self, name: str) -> bool:
        try:
            self._declare_channel().queue_declare(name, passive=True)
            return True
        except amqp.exceptions.NotFound:
            self._declarer = None
            return False

    def check_history(self) -> None:
        name = f"{self.prefix}anarchon-check.{uuid.uuid4().hex[:12]}"
        try:
            self._connect(self.confirm_timeout)
            channel = self._declare_channel()
            channel.queue_declare(name, durable=True, auto_delete=False, arguments=history_arguments(1))
            channel.queue_delete(name)
        except self._errors() as exc:
            self._discard(connection_lost=True)
            raise BrokerError(
                f"RabbitMQ at {self.connection.as_uri()} cannot keep history streams ({exc}): it needs "
                "RabbitMQ 3.9+ with the stream_queue feature flag enabled "
                "(rabbitmqctl enable_feature_flag stream_queue)"
            ) from exc

    def check_claims(self) -> None:
        """Declare a gate, claim it and delete it, under the prefix: BrokerRefused, naming the
        permissions to give, when the user may not (configure, write, read on the prefix's names)."""
        name = f"{self.prefix}anarchon-check.{uuid.uuid4().hex[:12]}.slot.0"
        arguments = dict(gate_arguments(self.slot_ttl_ms), **{"x-expires": 60_000})  # gone soon, whatever happens
        try:
            raw = self._connect(self.confirm_timeout)
            channel = raw.channel()
            try:
                channel.queue_declare(name, durable=True, auto_delete=False, arguments=arguments)
                channel.basic_publish_confirm(
                    amqp.Message(b"{}", delivery_mode=2),
                    exchange="",
                    routing_key=name,
                    mandatory=True,
                    confirm_timeout=self.confirm_timeout,
                )
                channel.queue_delete(name)
            finally:
                with contextlib.suppress(Exception):
                    channel.close()
        except amqp.exceptions.AccessRefused as exc:
            user, vhost, pattern = self.connection.userid, self.connection.virtual_host, f"^{re.escape(self.prefix)}"
            raise BrokerRefused(
                f"RabbitMQ at {self.connection.as_uri()} refuses user {user!r} the gate queues named "
                f"{self.prefix}* ({_text(exc.reply_text)}): claims need configure, write and read permissions "
                f"on them and write on amq.default, e.g. rabbitmqctl set_permissions -p {vhost} {user} "
                f"'{pattern}' '{pattern}|^amq\\.default$' '{pattern}'"
            ) from exc
        except self._errors() as exc:
            self._discard(connection_lost=True)
            raise BrokerUnavailable(f"cannot check the claims on {self.connection.as_uri()}: {exc}") from exc

    # -- gates --------------------------------------------------------------------------------

    def _declare_gates(self, gates: list[str]) -> list[bool]:
        """Declare gates pipelined: every declare is written, then the answers are read in order
        (the broker answers a channel's methods in order). A gate the broker objects to closes the
        channel and, with it, the declares written after it: that one goes through
        :meth:`_declare_gate` (adoption, or refusal), and the rest are written again."""
        arguments = gate_arguments(self.slot_ttl_ms)
        usable: dict[str, bool] = {}
        todo = list(gates)
        while todo:
            channel = self._declare_channel()
            for gate in todo:
                _write_declare(channel, gate, arguments)
            answered = 0
            try:
                for gate in todo:
                    channel.wait(spec.Queue.DeclareOk, timeout=self.confirm_timeout)
                    usable[gate] = True
                    answered += 1
                todo = []
            except amqp.exceptions.ChannelError:
                self._declarer = None  # closed by the broker, with every declare written after
                usable[todo[answered]] = self._declare_gate(todo[answered])
                todo = todo[answered + 1 :]
        return [usable[gate] for gate in gates]

    def _declare_gate(self, gate: str) -> bool:
        """Declare a gate; False when it cannot serve as one.

        Instances whose ``slot_ttl_ms`` differs, or an older gate made transient or without an
        explicit queue type, are used as they are. Any other difference means the queue is not a
        gate, and it never counts as won; so does a gate the broker refuses (permissions, an
        exclusive queue of another connection).
        """

        def adopt(arg: str, current: str | None) -> bool:
            if arg == "x-queue-type":
                return current in (None, "classic")  # made without the explicit type
            if arg == "x-expires" and (current is None or int(current) < self.slot_ttl_ms):
                logger.warning(
                    "anarchon: gate %r exists with x-expires %s, shorter than slot_ttl_ms %d: used as it "
                    "is; an instance later than it allows could run the slot twice",
                    gate,
                    current,
                    self.slot_ttl_ms,
                )
            return arg in ("x-expires", "durable")

        try:
            refusal = self._declare_adopting(gate, gate_arguments(self.slot_ttl_ms), adopt)
        except amqp.exceptions.ChannelError as exc:
            self._declarer = None
            logger.error(
                "anarchon: the broker refused gate %r (%s); this run is skipped. Check the user's "
                "permissions on the vhost and anarchon_prefix",
                gate,
                exc,
            )
            return False
        if refusal is not None:
            logger.error(
                "anarchon: queue %r exists but is not a gate (%s); it never counts as a win, so this run "
                "is skipped. Delete the queue (rabbitmqctl delete_queue %s) or change anarchon_prefix",
                gate,
                refusal,
                gate,
            )
            return False
        return True

    def _declare_adopting(
        self, name: str, arguments: dict[str, Any], adopt: Callable[[str, str | None], bool]
    ) -> str | None:
        """Declare a durable queue; None when done, else the broker's reply naming a difference
        that ``adopt(argument, current value)`` refused.

        A queue keeps the arguments it was made with, and a 406 reply names only the first one
        that differs, with its current value. Redeclaring with that value proves, in the end,
        that every other argument matches.
        """
        arguments = dict(arguments)
        durable = True
        for _ in range(len(arguments) + 2):
            try:
                self._declare_channel().queue_declare(
                    name, durable=durable, auto_delete=False, exclusive=False, arguments=arguments
                )
                return None
            except amqp.exceptions.PreconditionFailed as exc:
                self._declarer = None  # the broker closed that channel
                match = _INEQUIVALENT.search(str(exc.reply_text))
                if match is None or not adopt(match.group(1), _current_value(match.group(3))):
                    return str(exc.reply_text)
                arg, current = match.group(1), _current_value(match.group(3))
                if arg == "durable":
                    durable = current == "true"
                elif current is None:
                    arguments.pop(arg, None)
                else:
                    arguments[arg] = int(current) if current.lstrip("-").isdigit() else current
        return "too many differences"

    def _declare_channel(self) -> amqp.Channel:
        if self._declarer is None or not self._declarer.is_open:
            self._declarer = self.connection.connection.channel()
        return self._declarer

    # -- connection ---------------------------------------------------------------------------

    def _errors(self) -> tuple[type[BaseException], ...]:
        return (
            self.connection.connection_errors
            + self.connection.channel_errors
            + (OSError, TimeoutError, OperationalError, amqp.exceptions.AMQPError, BrokerUnavailable, BrokerRefused)
        )

    def _connect(self, timeout: float | None) -> amqp.Connection:
        """The live connection, (re)connecting for at most about ``timeout`` seconds (plus one
        ``connect_timeout``); a broker that was not there at :meth:`open` is checked now."""
        reconnecting = not self.connection.connected
        try:
            self.connection.ensure_connection(
                # An outage is logged once, not per attempt (before open(), its error says it all).
                errback=(lambda exc, interval: self._outage(exc)) if self._opened else None,
                max_retries=None if timeout else 1,
                interval_start=0.2,
                interval_step=0.5,
                interval_max=2,
                timeout=max(0.5, timeout) if timeout else None,
            )
        except self._errors() as exc:
            if not self._opened and not isinstance(exc, (BrokerUnavailable, BrokerRefused)):
                raise self._unreachable(exc) from exc  # never reached yet: say where, and what to check
            raise
        if not self._opened:
            self._check_server()
        elif reconnecting:
            self._note_node()
        self._recovered()
        return self.connection.connection

    def _discard(self, *, connection_lost: bool) -> None:
        """Forget the channels, and the connection when it is ours or broken."""
        if self._confirms is not None:
            self._confirms.dead = True
        self._confirms = None
        self._declarer = None
        self._recorder = None
        self._peers_channel = None
        self._streams.clear()
        if self._owned:
            _abort(self.connection)  # ours: nothing else is written on it
        if self._owned or connection_lost:
            self.connection.collect()

    #: Seconds between two reminders that an outage goes on.
    outage_reminder_s = 60.0

    def in_outage(self) -> bool:
        return self._outage_since is not None

    def missed(self, count: int) -> None:
        self._outage_missed += count

    def _outage(self, exc: BaseException) -> None:
        """One line when an outage starts, then one every ``outage_reminder_s`` while it lasts."""
        now = time.monotonic()
        refusal = _refusal(exc, self.connection)
        reason = refusal or f"is unavailable ({type(exc).__name__}: {exc})"
        if self._outage_since is None:
            self._outage_since = self._outage_reminded = now
            self._outage_missed = 0
            logger.warning(
                "anarchon: RabbitMQ at %s %s; reconnecting with back-off. Runs due meanwhile are not run by "
                "this instance",
                self.connection.as_uri(),
                reason,
            )
        elif now - self._outage_reminded >= self.outage_reminder_s:
            self._outage_reminded = now
            logger.warning(
                "anarchon: RabbitMQ at %s still %s after %.0fs; %d run(s) not claimed so far",
                self.connection.as_uri(),
                "refuses us" if refusal else "unavailable",
                now - self._outage_since,
                self._outage_missed,
            )

    def _recovered(self) -> None:
        if self._outage_since is not None:
            logger.warning(
                "anarchon: RabbitMQ at %s is back after %.1fs; %d run(s) were not claimed meanwhile",
                self.connection.as_uri(),
                time.monotonic() - self._outage_since,
                self._outage_missed,
            )
            self._outage_since = None
            self._outage_missed = 0


def _refusal(exc: BaseException, connection: Connection) -> str | None:
    """What the broker refused, with the fix, when ``exc`` is a refusal (login, vhost,
    permissions) rather than a broker out of reach; None otherwise."""
    text = _text(getattr(exc, "reply_text", "") or exc)
    user, vhost = connection.userid, connection.virtual_host
    if isinstance(exc, amqp.exceptions.AccessRefused) and "login" in text.lower():
        return (
            f"refused the login of user {user!r} ({text}): check the user name and password in "
            "anarchon_backend (or broker_url)"
        )
    if isinstance(exc, amqp.exceptions.NotAllowed):
        if "not found" in text:
            return (
                f"has no vhost {vhost!r} ({text}): create it (rabbitmqctl add_vhost {vhost}) or fix the "
                "vhost at the end of the URL"
            )
        return (
            f"refused user {user!r} on vhost {vhost!r} ({text}): give it permissions "
            f"(rabbitmqctl set_permissions -p {vhost} {user} '.*' '.*' '.*', or at least on the "
            "anarchon_prefix names)"
        )
    return None


def _seconds_until(claims: Sequence[Claim]) -> float | None:
    """Seconds left before the earliest deadline of the claims (None: no deadline)."""
    deadlines = [c.deadline_ms for c in claims if c.deadline_ms is not None]
    return (min(deadlines) - clock.now_ms()) / 1000 if deadlines else None


def reset_connection(connection: Connection) -> None:
    """Drop ``connection`` at once, without the closing handshake, discarding what the kernel has
    not delivered yet (see :func:`_abort`). Never raises; the connection connects again if used."""
    with contextlib.suppress(Exception):
        _abort(connection)
    with contextlib.suppress(Exception):
        connection.collect()


def _abort(connection: Connection) -> None:
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
