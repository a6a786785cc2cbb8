"""The deployment's control log on RabbitMQ: a stream ``<prefix>anarchon.control`` (RabbitMQ holds
no rows, but a stream is an ordered log that every instance reads in the same order), where each
pause and resume is appended, confirmed. Every beat instance reads it to its end once, then
follows it with a consumer on the claims' connection, so that a change reaches it as soon as that
connection is read (at every claim and wake-up). The state is the fold of the log: the log's
retention (:data:`LOG_BYTES`) bounds how many changes it keeps.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from typing import Any

import amqp

from ... import clock
from ...errors import BrokerError
from ..pauses import Pause
from .declaring import declare_adopting
from .link import Link
from .streams import read_streams

__all__ = ["LOG_BYTES", "ControlLog", "log_name"]

logger = logging.getLogger(__name__)

SCHEMA = 1
#: What the control log keeps: about 100,000 changes of a few hundred bytes each.
LOG_BYTES = 50_000_000
SEGMENT_BYTES = 1_000_000
#: Seconds between two tries to follow the log after one failed (RabbitMQ away, or refusing it).
FOLLOW_AGAIN_S = 10.0


def log_name(prefix: str) -> str:
    """The control log's stream (a job's queues always end in a suffix of their own)."""
    return f"{prefix}anarchon.control"


def _decode(body: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(body)
    except (TypeError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("v") != SCHEMA or not isinstance(record.get("job"), str):
        return None
    return record


def fold(records: list[dict[str, Any]], into: dict[str, Pause]) -> None:
    """Apply the log's records, in log order, to the pauses ``into`` (by job)."""
    for record in records:
        if record.get("op") == "pause":
            pause = Pause.decode(json.dumps(record.get("pause")))
            if pause is not None:
                into[record["job"]] = pause
        elif record.get("op") == "resume":
            into.pop(record["job"], None)


class ControlLog:
    """The control log of the deployment under ``prefix``, through ``link``."""

    def __init__(self, link: Link, prefix: str) -> None:
        self.link = link
        self.name = log_name(prefix)
        #: The pauses as this instance has read them (followed: see :meth:`follow`).
        self.view: dict[str, Pause] = {}
        self._offset = -1  # the last record folded into the view
        self._read = False
        self._channel: amqp.Channel | None = None
        self._failed_at: float | None = None  # time.monotonic() of the last failed try to follow
        link.on_discard(self._forget)

    def _forget(self) -> None:
        self._channel = None

    def _declare(self) -> None:
        arguments = {
            "x-queue-type": "stream",
            "x-max-length-bytes": LOG_BYTES,
            "x-stream-max-segment-size-bytes": SEGMENT_BYTES,
        }
        refusal = declare_adopting(self.link, self.name, arguments, lambda arg, _: arg.startswith("x-max"))
        if refusal is not None:
            raise BrokerError(f"queue {self.name!r} exists but is not anarchon's control log ({refusal}): delete it")

    def append(self, record: dict[str, Any]) -> None:
        """Append a change, confirmed. Raises BrokerError (BrokerUnavailable when RabbitMQ cannot
        be reached); then it may or may not have been kept."""
        body = json.dumps({"v": SCHEMA, **record}, separators=(",", ":")).encode()
        try:
            raw = self.link.connect(self.link.confirm_timeout)
            self._declare()
            channel = raw.channel()
            try:
                channel.basic_publish_confirm(
                    amqp.Message(body, content_type="application/json", delivery_mode=2),
                    exchange="",
                    routing_key=self.name,
                    confirm_timeout=self.link.confirm_timeout,
                )
            finally:
                with contextlib.suppress(Exception):
                    channel.close()
        except BrokerError:
            raise
        except (amqp.exceptions.MessageNacked, *self.link.errors()) as exc:
            self.link.discard(connection_lost=True)
            raise BrokerError(
                f"RabbitMQ did not keep the change in {self.name!r} ({type(exc).__name__}: {exc})"
            ) from exc

    def pauses(self) -> dict[str, Pause]:
        """The pauses kept in the log, read to its end (those in effect now)."""
        records, _ = read_streams(self.link, {"log": self.name}, 0.5, _decode)
        found: dict[str, Pause] = {}
        fold(records["log"], found)
        now = clock.now_ms()
        return {job: pause for job, pause in sorted(found.items()) if pause.in_effect(now)}

    def follow(self, *, read: bool = True) -> None:
        """Keep :attr:`view` up to date: read the log to its end the first time (unless ``read``
        is False: then nothing is done until it was), then consume what is appended after it
        (again from there on a new connection). Only on the connection as it is: never connects,
        so that it never holds a claim up. Best effort: never raises; the view stays as it was
        until the next call."""
        if self._channel is not None and self._channel.is_open:
            return
        if not self.link.connection.connected or (not read and not self._read):
            return
        if self._failed_at is not None and time.monotonic() - self._failed_at < FOLLOW_AGAIN_S:
            return
        try:
            if not self._read:
                records, reached = read_streams(self.link, {"log": self.name}, 0.5, _decode)
                fold(records["log"], self.view)
                self._offset = reached.get("log", -1)
                self._read = True
            raw = self.link.connect(self.link.confirm_timeout)
            self._declare()
            channel = raw.channel()
            channel.basic_qos(0, 100, False)
            # Named and not awaited: RabbitMQ can deliver from a stream before its consume-ok.
            channel.basic_consume(
                self.name,
                consumer_tag=f"anarchon.control.{uuid.uuid4().hex[:12]}",
                nowait=True,
                callback=lambda message: self._delivered(channel, message),
                arguments={"x-stream-offset": self._offset + 1},
            )
            self._channel = channel
            self._failed_at = None
        except BrokerError as exc:
            self._failed(exc, logging.WARNING)
        except self.link.errors() as exc:
            self.link.discard(connection_lost=True)
            self._failed(exc, logging.INFO)

    def _failed(self, exc: BaseException, level: int) -> None:
        """Say once that the log is not followed (then again only once it was followed since)."""
        if self._failed_at is None:
            logger.log(
                level,
                "anarchon: pauses are not followed from RabbitMQ yet (%s: %s); tried again every %gs, and the "
                "jobs are run as last read meanwhile",
                type(exc).__name__,
                exc,
                FOLLOW_AGAIN_S,
            )
        self._failed_at = time.monotonic()

    def _delivered(self, channel: amqp.Channel, message: amqp.Message) -> None:
        channel.basic_ack(message.delivery_tag)
        offset = (message.headers or {}).get("x-stream-offset")
        if isinstance(offset, int):
            if offset <= self._offset:
                return  # (read already)
            self._offset = offset
        record = _decode(message.body)
        if record is not None:
            before = self.view.get(record["job"])
            fold([record], self.view)
            if self.view.get(record["job"]) != before:
                logger.info(
                    "anarchon: job %r %s",
                    record["job"],
                    f"paused by {self.view[record['job']].by}" if record["job"] in self.view else "resumed",
                )

    def paused(self, job: str) -> bool:
        """Whether ``job`` is paused now, as this instance has read the log."""
        pause = self.view.get(job)
        return pause is not None and pause.in_effect(clock.now_ms())

    def close(self) -> None:
        """Stop following on a connection that stays open (the caller's)."""
        if self._channel is not None:
            with contextlib.suppress(Exception):
                self._channel.close()
        self._channel = None
