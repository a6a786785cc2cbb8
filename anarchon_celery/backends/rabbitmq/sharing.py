"""Job definitions shared with the other instances: announcements through a fanout exchange
``<prefix>anarchon.instances`` (transient, deleted with its last queue) to an exclusive queue of
each instance, consumed on the claims' connection, so that they are read whenever it is."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Mapping

import amqp

from ...confirms import publish
from ..peers import Peers
from .link import Link

logger = logging.getLogger(__name__)


class Sharing:
    def __init__(self, link: Link, prefix: str) -> None:
        self.link = link
        self.exchange = f"{prefix}anarchon.instances"
        self.prefix = prefix
        self._peers: Peers | None = None
        self._channel: amqp.Channel | None = None
        self._refused = False
        link.on_discard(self._forget)

    def _forget(self) -> None:
        self._channel = None

    def start(self, instance: str, definitions: Mapping[str, Mapping[str, str]]) -> None:
        """See :meth:`Backend.share_definitions`."""
        self._peers = Peers(instance, definitions)
        self._channel = None
        try:
            self.keep()
        except self.link.errors() as exc:
            logger.info("anarchon: job definitions not shared yet (%s: %s)", type(exc).__name__, exc)
            self.link.discard(connection_lost=True)

    def keep(self) -> None:
        """Listen to the other instances (again, after a new connection: saying hello) and answer
        a newcomer. Raises the connection's errors; a refusal turns sharing off, logged once."""
        peers = self._peers
        if peers is None or self._refused or not self.link.connection.connected:
            return
        channel = self._channel
        if channel is None or not channel.is_open:
            try:
                channel = self.link.connection.connection.channel()
                channel.exchange_declare(self.exchange, "fanout", durable=False, auto_delete=True)
                # Named under the prefix (not amq.gen-...), so that the prefix's permissions cover it.
                queue = f"{self.prefix}anarchon.instance.{uuid.uuid4().hex[:12]}"
                channel.queue_declare(queue, exclusive=True, auto_delete=True)
                channel.queue_bind(queue, self.exchange)
                channel.basic_consume(queue, no_ack=True, callback=lambda message: peers.heard(message.body))
            except amqp.exceptions.ChannelError as exc:
                self._refused = True
                logger.info(
                    "anarchon: job definitions are not compared with the other instances: RabbitMQ refused "
                    "exchange %r (%s)",
                    self.exchange,
                    exc,
                )
                return
            self._channel = channel
            self._announce(channel, hello=True)
        elif peers.answer_due:
            self._announce(channel, hello=False)

    def _announce(self, channel: amqp.Channel, *, hello: bool) -> None:
        assert self._peers is not None
        self._peers.answer_due = False
        message = amqp.Message(self._peers.announcement(hello=hello), content_type="application/json")
        publish(channel, message, exchange=self.exchange, routing_key="")

    def close(self) -> None:
        """Stop listening on a connection that stays open (the caller's)."""
        if self._channel is not None:
            with contextlib.suppress(Exception):  # the caller's connection stays; our consumer goes
                self._channel.close()
        self._channel = None
