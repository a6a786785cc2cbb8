"""The backend's connection to RabbitMQ: how it is made, the server it reaches, the node it is on,
and its outages (logged once when they start, then a reminder a minute, and once when they end)."""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import amqp
from amqp import spec
from kombu import Connection
from kombu.exceptions import OperationalError
from kombu.utils.url import maybe_sanitize_url

from ...connections import NodeLog, abort
from ...errors import BrokerError, BrokerRefused, BrokerUnavailable, ConfigError
from ..outages import MissedRuns

__all__ = ["Link", "app_connection_options", "check_server", "let_go", "node_urls"]

logger = logging.getLogger(__name__)

MIN_VERSION = (3, 9)
AMQP_SCHEMES = ("amqp", "amqps", "pyamqp")
DEFAULT_CONFIRM_TIMEOUT = 5.0
#: Seconds a connection attempt may take, by default (Celery's broker_connection_timeout is 4).
DEFAULT_CONNECT_TIMEOUT = 5.0
#: The AMQP heartbeat of the backend's own connection, by default (Celery's broker_heartbeat is 120).
DEFAULT_HEARTBEAT = 60.0
#: Seconds a read of answers already arriving may wait for the rest of them.
READ_SLICE = 0.05


def node_urls(url: str | Sequence[str]) -> list[str]:
    """The AMQP URLs of ``url``: one, several joined by ``;``, or a list; ConfigError, with the
    offending URL (password hidden), unless each is amqp:// or amqps://."""
    given: list[Any] = url.split(";") if isinstance(url, str) else list(url) if isinstance(url, list | tuple) else [url]
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


def own_connection_options(confirm_timeout: float) -> dict[str, Any]:
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


def text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def check_server(properties: dict[str, Any], where: str) -> tuple[int, ...]:
    """The broker's version from its AMQP server properties; BrokerError unless RabbitMQ >= 3.9."""
    product = text(properties.get("product", ""))
    version = tuple(int(n) for n in re.findall(r"\d+", text(properties.get("version", "")))[:3])
    if product != "RabbitMQ" or version < MIN_VERSION:
        shown = ".".join(map(str, version)) or "of unknown version"
        raise BrokerError(
            f"{where} is {product or 'an unknown broker'} {shown}: RabbitMQBackend needs RabbitMQ "
            f"{'.'.join(map(str, MIN_VERSION))} or newer (streams, reject-publish)"
        )
    return version


class Link:
    """A kombu connection (ours, or the caller's when not ``owned``), connected when needed.

    The parts of the backend that keep channels on it ask to hear of it being dropped
    (:meth:`on_discard`), so that nothing is ever used on a connection that failed. It also holds
    the channel that declares queues, which several parts share.
    """

    #: Seconds between two reminders that an outage goes on.
    outage_reminder_s = 60.0

    def __init__(self, connection: Connection, *, owned: bool, confirm_timeout: float) -> None:
        self.connection = connection
        self.owned = owned
        self.confirm_timeout = confirm_timeout
        self.opened = False
        self.server_version: tuple[int, ...] = ()
        self._nodes = NodeLog("claims")
        self._declarer: amqp.Channel | None = None
        self._forgetters: list[Callable[[], None]] = []
        self._outage_since: float | None = None
        self._outage_missed = MissedRuns()  # runs not claimed during the current outage
        self._outage_unrecorded = 0  # history events not written during the current outage
        self._outage_reminded = 0.0  # time.monotonic() of its last line

    @property
    def several_nodes(self) -> bool:
        """Whether the connection has several nodes to move between (kombu's failover)."""
        return len(self.connection.alt or ()) > 1

    def on_discard(self, forget: Callable[[], None]) -> None:
        """Call ``forget`` whenever the channels on this connection must no longer be used."""
        self._forgetters.append(forget)

    def errors(self) -> tuple[type[BaseException], ...]:
        return (
            self.connection.connection_errors
            + self.connection.channel_errors
            + (OSError, TimeoutError, OperationalError, amqp.exceptions.AMQPError, BrokerUnavailable, BrokerRefused)
        )

    def open(self) -> None:
        if self.opened:
            return
        try:
            self.connection.ensure_connection(max_retries=3, interval_start=0.5, interval_step=1)
        except self.errors() as exc:
            raise self.unreachable(exc) from exc
        self._check_server()

    def unreachable(self, exc: BaseException) -> BrokerUnavailable | BrokerRefused:
        reason = refusal(exc, self.connection)
        if reason is not None:
            return BrokerRefused(f"RabbitMQ at {self.connection.as_uri()} {reason}")
        return BrokerUnavailable(
            f"cannot reach RabbitMQ at {self.connection.as_uri()}: {exc}. Check that it is "
            "running and that anarchon_backend (or broker_url) points at it"
        )

    def _check_server(self) -> None:
        properties = self.connection.connection.server_properties or {}
        self.server_version = check_server(properties, self.connection.as_uri())
        if not self.opened and self.owned:
            from .survey import warn_about  # every node, once: they must be one cluster

            warn_about(self.connection, min(self.connection.connect_timeout or 5.0, 5.0))
        self.opened = True
        self._note_node()

    def _note_node(self) -> None:
        self._nodes.note(self.connection)

    def connect(self, timeout: float | None) -> amqp.Connection:
        """The live connection, (re)connecting for at most about ``timeout`` seconds (plus one
        ``connect_timeout``); a broker that was not there at :meth:`open` is checked now."""
        reconnecting = not self.connection.connected
        try:
            self.connection.ensure_connection(
                # An outage is logged once, not per attempt (before open(), its error says it all).
                errback=(lambda exc, interval: self.outage(exc)) if self.opened else None,
                max_retries=None if timeout else 1,
                interval_start=0.2,
                interval_step=0.5,
                interval_max=2,
                timeout=max(0.5, timeout) if timeout else None,
            )
        except self.errors() as exc:
            if not self.opened and not isinstance(exc, (BrokerUnavailable, BrokerRefused)):
                raise self.unreachable(exc) from exc  # never reached yet: say where, and what to check
            raise
        if not self.opened:
            self._check_server()
        elif reconnecting:
            self._note_node()
        self._recovered()
        return self.connection.connection

    def declare_channel(self) -> amqp.Channel:
        """The channel queues are declared on (one the broker closed is replaced)."""
        if self._declarer is None or not self._declarer.is_open:
            self._declarer = self.connection.connection.channel()
        return self._declarer

    def forget_declarer(self) -> None:
        """The declaring channel is of no more use: the broker closed it, or it waits for an
        answer that is not coming. It is closed without waiting (a channel the broker closed,
        py-amqp has opened again: ``Channel._on_close``), and the next declare opens another."""
        if self._declarer is not None:
            let_go(self._declarer)
        self._declarer = None

    def discard(self, *, connection_lost: bool) -> None:
        """Forget the channels, and the connection when it is ours or broken."""
        self._declarer = None
        for forget in self._forgetters:
            forget()
        if self.owned:
            abort(self.connection)  # ours: nothing else is written on it
        if self.owned or connection_lost:
            self.connection.collect()

    def close(self) -> None:
        """Close the connection if it is ours; the caller's is left open."""
        self.opened = False
        self._declarer = None
        for forget in self._forgetters:
            forget()
        if self.owned:
            try:
                self.connection.release()
            except Exception:  # noqa: BLE001 - closing is best effort; the socket goes anyway
                self.connection.collect()

    # -- outages ------------------------------------------------------------------------------

    def in_outage(self) -> bool:
        return self._outage_since is not None

    def missed(self, job: str, slots: Sequence[int]) -> None:
        self._outage_missed.add(job, slots)

    def unrecorded(self, count: int) -> None:
        """``count`` history events were not written during the current outage (reported,
        with the runs missed, when it ends)."""
        self._outage_unrecorded += count

    def history_timeout(self) -> float | None:
        """How long a history write may spend reconnecting: ``confirm_timeout``, but during an
        outage one attempt (None), or every event written after a failed claim would hold the
        next claims up by as much."""
        return None if self.in_outage() else self.confirm_timeout

    def outage(self, exc: BaseException) -> None:
        """One line when an outage starts, then one every ``outage_reminder_s`` while it lasts."""
        now = time.monotonic()
        reason = refusal(exc, self.connection)
        shown = reason or f"is unavailable ({type(exc).__name__}: {exc})"
        if self._outage_since is None:
            self._outage_since = self._outage_reminded = now
            self._outage_missed, self._outage_unrecorded = MissedRuns(), 0
            logger.warning(
                "anarchon: RabbitMQ at %s %s; reconnecting with back-off. Runs due meanwhile are not run by "
                "this instance",
                self.connection.as_uri(),
                shown,
            )
        elif now - self._outage_reminded >= self.outage_reminder_s:
            self._outage_reminded = now
            logger.warning(
                "anarchon: RabbitMQ at %s still %s after %.0fs; %d run(s) not claimed so far",
                self.connection.as_uri(),
                "refuses us" if reason else "unavailable",
                now - self._outage_since,
                self._outage_missed.count,
            )

    def _recovered(self) -> None:
        if self._outage_since is not None:
            unrecorded = self._outage_unrecorded
            logger.warning(
                "anarchon: RabbitMQ at %s is back after %.1fs; %s%s",
                self.connection.as_uri(),
                time.monotonic() - self._outage_since,
                self._outage_missed,
                f", {unrecorded} history event(s) not recorded" if unrecorded else "",
            )
            self._outage_since = None
            self._outage_missed, self._outage_unrecorded = MissedRuns(), 0


def refusal(exc: BaseException, connection: Connection) -> str | None:
    """What the broker refused, with the fix, when ``exc`` is a refusal (login, vhost,
    permissions) rather than a broker out of reach; None otherwise."""
    reply = text(getattr(exc, "reply_text", "") or exc)
    user, vhost = connection.userid, connection.virtual_host
    if isinstance(exc, amqp.exceptions.AccessRefused) and "login" in reply.lower():
        return (
            f"refused the login of user {user!r} ({reply}): check the user name and password in "
            "anarchon_backend (or broker_url)"
        )
    if isinstance(exc, amqp.exceptions.NotAllowed):
        if "not found" in reply:
            return (
                f"has no vhost {vhost!r} ({reply}): create it (rabbitmqctl add_vhost {vhost}) or fix the "
                "vhost at the end of the URL"
            )
        return (
            f"refused user {user!r} on vhost {vhost!r} ({reply}): give it permissions "
            f"(rabbitmqctl set_permissions -p {vhost} {user} '.*' '.*' '.*', or at least on the "
            "anarchon_prefix names)"
        )
    return None


def let_go(channel: amqp.Channel) -> None:
    """Close ``channel`` without waiting: its close-ok (or any late answer before it) is read, and
    dropped, whenever the connection is next read."""
    if channel.connection is None or not channel.is_open:
        return
    channel.is_closing = True  # py-amqp drops every method but the close's answer from now on
    with contextlib.suppress(Exception):  # a dead connection shows itself at its next use
        channel.send_method(spec.Channel.Close, "BsBB", (200, "", 0, 0))
