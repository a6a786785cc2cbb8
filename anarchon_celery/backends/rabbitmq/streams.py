"""History: one stream queue per job, written with confirmed publishes and read to its end."""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import amqp

from ...confirms import ConfirmTracker, publish
from ...errors import BrokerError, BrokerRefused, BrokerUnavailable
from ...history import decode_event
from .declaring import declare_adopting
from .link import READ_SLICE, Link
from .names import history_arguments, history_name

logger = logging.getLogger(__name__)


#: What RabbitMQ says to a consumer of a stream whose member on the node has not started yet.
_STARTING = "does not have a replica on the local node"


class StreamRead:
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

    def events(
        self, job: str, into: list[dict[str, Any]], decode: Callable[[bytes], dict[str, Any] | None] = decode_event
    ) -> Callable[[amqp.Message], None]:
        def on_message(message: amqp.Message) -> None:
            self.reached[job] = max(self.reached.get(job, -1), self._offset(message))
            self._fix(job)
            event = decode(message.body)
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


class Streams:
    """The history streams of the jobs under ``prefix``, through ``link``."""

    def __init__(self, link: Link, prefix: str) -> None:
        self.link = link
        self.prefix = prefix
        self._recorder: amqp.Channel | None = None
        self._declared: set[str] = set()  # streams declared on the current connection
        link.on_discard(self.forget)

    def forget(self) -> None:
        """The channels are gone (or must not be used): declare and open again when needed."""
        self._recorder = None
        self._declared.clear()

    def _ensure(self, name: str, history_size: int) -> None:
        if name not in self._declared:
            self._declare(name, history_size)
            self._declared.add(name)

    def record(self, job: str, event: bytes, history_size: int, *, attempts: int = 3) -> bool:
        name = history_name(self.prefix, job)
        message = amqp.Message(event, content_type="application/json", delivery_mode=2)
        for attempt in range(1, attempts + 1):
            try:
                self.link.connect(self.link.history_timeout())
                self._ensure(name, history_size)
                if self._recorder is None or not self._recorder.is_open:
                    self._recorder = self.link.connection.connection.channel()
                # Confirmed, so that a refused event is known (and a newly made stream that is not
                # ready yet, 506 "stream not found", is retried) rather than silently lost.
                self._recorder.basic_publish_confirm(
                    message, exchange="", routing_key=name, confirm_timeout=self.link.confirm_timeout
                )
                return True
            except BrokerError as exc:
                logger.error("anarchon: job %r: history event not recorded: %s", job, exc)
                return False
            except (amqp.exceptions.ChannelError, amqp.exceptions.MessageNacked) as exc:
                self.link.forget_declarer()
                self._recorder = None
                self._declared.discard(name)
                if attempt == attempts:
                    logger.warning("anarchon: job %r: history event not recorded (%r)", job, exc)
                    return False
                time.sleep(0.2 * attempt)
            except self.link.errors() as exc:
                # A history event is safe to write again (the fold ignores repeats); RabbitMQ 3.10
                # answers two clients creating one stream at once with 541, closing a connection.
                self.link.discard(connection_lost=True)
                if self.link.in_outage():  # counted in the one line that ends the outage
                    logger.debug("anarchon: job %r: history event not recorded, RabbitMQ is unavailable", job)
                    self.link.unrecorded(1)
                    return False
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
        confirms: ConfirmTracker[int] = ConfirmTracker()  # by the event's index
        failure: BaseException | None = None
        try:
            self._write_all(events, confirms)
        except BrokerError:
            pass  # a queue that is no history stream: record() below says so, job by job
        except self.link.errors() as exc:
            self.link.discard(connection_lost=True)
            failure = exc
        unconfirmed = [n for n in range(len(events)) if confirms.answers.get(n) is not True]
        if failure is not None:
            logger.info(
                "anarchon: %d history event(s) written again one by one (%s: %s)",
                len(unconfirmed),
                type(failure).__name__,
                failure,
            )
        return len(events) - len(unconfirmed) + self._record_each(events, unconfirmed, failure is not None)

    def _write_all(self, events: Sequence[tuple[str, bytes, int]], confirms: ConfirmTracker[int]) -> None:
        """Write the events on a new confirm channel and read their confirms into ``confirms``."""
        self.link.connect(self.link.history_timeout())
        for job, _, history_size in events:
            self._ensure(history_name(self.prefix, job), history_size)
        raw = self.link.connection.connection
        channel = raw.channel()
        channel.confirm_select()
        confirms.listen(channel)
        for n, (job, event, _) in enumerate(events):
            confirms.writing(n)
            message = amqp.Message(event, content_type="application/json", delivery_mode=2)
            publish(channel, message, exchange="", routing_key=history_name(self.prefix, job))
        confirms.wait(lambda left: raw.drain_events(timeout=max(0.01, left)), self.link.confirm_timeout)
        channel.close()

    def _record_each(self, events: Sequence[tuple[str, bytes, int]], which: list[int], connection_failed: bool) -> int:
        """Record the events ``which`` one by one; returns how many were recorded."""
        recorded = 0
        for done, n in enumerate(which):
            # After a failed connection, once each, on a new one: a cut connection is replaced at
            # once, but a broker that does not answer would hold the next claims up at every try.
            if self.record(*events[n], attempts=1 if connection_failed else 3):
                recorded += 1
            elif connection_failed:
                # RabbitMQ is not answering: one event at a time, each with its retries, would hold
                # up the next claims for as long as the outage lasts.
                left = len(which) - done - 1
                if self.link.in_outage():
                    self.link.unrecorded(left)
                elif left:
                    logger.warning("anarchon: %d history event(s) not recorded, RabbitMQ is unavailable", left)
                break
        return recorded

    def ensure(self, job: str, history_size: int) -> bool:
        name = history_name(self.prefix, job)
        try:
            self.link.connect(self.link.confirm_timeout)
            self._declare(name, history_size)
            self._declared.add(name)
            return True
        except BrokerError as exc:
            logger.error("anarchon: job %r: %s", job, exc)
        except self.link.errors() as exc:
            self.link.discard(connection_lost=True)
            logger.warning("anarchon: job %r: history stream not declared (%s: %s)", job, type(exc).__name__, exc)
        return False

    def _declare(self, name: str, history_size: int) -> None:
        """Declare a history stream; one that exists keeps the size it was created with."""
        sizes = ("x-max-length-bytes", "x-stream-max-segment-size-bytes", "x-max-age")
        refusal = declare_adopting(self.link, name, history_arguments(history_size), lambda arg, _: arg in sizes)
        if refusal is not None:
            raise BrokerError(
                f"queue {name!r} exists but is not a history stream ({refusal}): delete it (which deletes "
                "that job's history) or change anarchon_prefix"
            )

    def read(self, jobs: Sequence[str], empty_s: float = 0.5) -> dict[str, list[dict[str, Any]]]:
        """See :meth:`RabbitMQBackend.read_history`. A stream whose member is still starting on
        the node (just declared: RabbitMQ refuses its consumers with 406 "does not have a replica
        on the local node") is read again a moment later, for ``confirm_timeout`` at most."""
        deadline = time.monotonic() + self.link.confirm_timeout
        while True:
            try:
                return self._read(jobs, empty_s)
            except BrokerError as exc:
                if _STARTING not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _read(self, jobs: Sequence[str], empty_s: float) -> dict[str, list[dict[str, Any]]]:
        return read_streams(self.link, {job: history_name(self.prefix, job) for job in jobs}, empty_s, decode_event)[0]

    def _exists(self, name: str) -> bool:
        return stream_exists(self.link, name)

    def check(self) -> None:
        """BrokerError unless a history stream can be made (and it is deleted at once)."""
        name = f"{self.prefix}anarchon-check.{uuid.uuid4().hex[:12]}"
        try:
            self.link.connect(self.link.confirm_timeout)
            channel = self.link.declare_channel()
            channel.queue_declare(name, durable=True, auto_delete=False, arguments=history_arguments(1))
            channel.queue_delete(name)
        except self.link.errors() as exc:
            self.link.discard(connection_lost=True)
            raise BrokerError(
                f"RabbitMQ at {self.link.connection.as_uri()} cannot keep history streams ({exc}): it needs "
                "RabbitMQ 3.9+ with the stream_queue feature flag enabled "
                "(rabbitmqctl enable_feature_flag stream_queue)"
            ) from exc


def read_streams(
    link: Link,
    names: dict[str, str],
    empty_s: float,
    decode: Callable[[bytes], dict[str, Any] | None],
    *,
    again: bool = True,
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, int]]:
    """Read streams to their end (``names``: a key to each stream; a missing one holds nothing):
    each stream's records as ``decode`` makes them (None: left out), by key, and the highest
    offset read of each stream that had any. Raises BrokerError when RabbitMQ stops delivering
    before the end."""
    events: dict[str, list[dict[str, Any]]] = {key: [] for key in names}
    try:
        raw = link.connect(link.confirm_timeout)
        existing = [key for key in names if stream_exists(link, names[key])]
        if not existing:
            return events, {}
        # basic.get and no-ack consumers are refused on streams (and close the connection):
        # consume with a prefetch and manual acks. RabbitMQ 3.10 can deliver from a stream
        # before its consume-ok, which py-amqp rejects for want of a callback (and a reject
        # closes the connection: 540): so the consumers are named here and registered
        # without waiting for the answer.
        channel = raw.channel()
        channel.basic_qos(0, 1000, False)
        read = StreamRead(channel)
        tags = []
        for n, key in enumerate(existing):
            for offset, callback in (("last", read.tail(key)), ("first", read.events(key, events[key], decode))):
                tags.append(f"anarchon.history.{n}.{offset}")
                channel.basic_consume(
                    names[key],
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
            if now - read.moved > link.confirm_timeout:
                raise BrokerError(
                    f"{', '.join(names[key] for key in left)} could not be read to its end: RabbitMQ "
                    f"delivered nothing more for {link.confirm_timeout:g}s. Try again"
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
    except link.errors() as exc:
        link.discard(connection_lost=True)
        if again and isinstance(exc, amqp.exceptions.InternalError):
            # RabbitMQ 3.10 fails a consume on a stream declared a moment before, whose member has
            # not started yet, with 541 (stream_not_found in its log), closing the connection.
            time.sleep(0.2)
            return read_streams(link, names, empty_s, decode, again=False)
        raise BrokerError(f"cannot read {', '.join(names.values())} from {link.connection.as_uri()}: {exc}") from exc
    return events, {key: read.reached[key] for key in existing if key in read.reached}


def stream_exists(link: Link, name: str) -> bool:
    """Whether the queue ``name`` exists (a passive declare)."""
    try:
        link.declare_channel().queue_declare(name, passive=True)
        return True
    except amqp.exceptions.NotFound:
        link.forget_declarer()
        return False
