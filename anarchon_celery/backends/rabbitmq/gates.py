"""Declaring the gates of the runs being claimed: pipelined, and each one that exists already
used as it is when it can serve as a gate, or left out (its run not claimed) when it cannot. A
gate whose cluster node is down or cut off is *away*: its run is claimed again once the node can
answer, and one such gate never holds up the others."""

from __future__ import annotations

import logging
import time
from typing import Any

import amqp
from amqp import spec

from ..base import Outcome
from .declaring import declare_adopting, write_declare
from .link import Link, let_go
from .names import gate_arguments

logger = logging.getLogger(__name__)

#: The 404 that RabbitMQ 4 also gave, once, on a single node that was up, to one of six clients
#: racing to declare the same new gate (4.3.6; most likely its metadata store held the queue a
#: moment before the node's view of live queues did). Rare: 12,000 racing declares later gave none.
_NODE_DOWN = "is down or inaccessible"
#: How RabbitMQ 3.x and 4.x word a 404 for a queue that exists on a node that is down.
_NODE_GONE = (_NODE_DOWN, "stopped by supervisor", "due to timeout", "not running")


def node_gone(reply: str) -> bool:
    """Whether a 404's text says the queue lives on a node that is down (not that it is missing)."""
    return any(words in reply for words in _NODE_GONE)


#: Seconds to wait for the answer about a gate known to be away, or suspected: its node answers
#: in milliseconds once it is back, and RabbitMQ 4 holds the declare for a minute until then.
PROBE_S = 0.5


def declare_gates(
    link: Link,
    gates: list[str],
    slot_ttl_ms: int,
    *,
    timeout: float | None = None,
    apart: bool = False,
    quiet: bool = False,
) -> list[Outcome | None]:
    """Declare gates pipelined: every declare is written, then the answers are read in order (the
    broker answers a channel's methods in order). One entry per gate: None when it can serve as a
    gate, else the outcome of its run (``BAD_GATE``, or ``AWAY``).

    A gate the broker objects to closes the channel and, with it, the declares written after it:
    that one goes through :func:`declare_gate` (adoption, or refusal), and the rest are written
    again. A declare left unanswered (RabbitMQ 4 holds the declare of a gate whose node was
    killed for about a minute) costs its own run only: its channel is given up, and the gates
    after it are declared each on a channel of its own, so that more such gates among them cost
    no more time. ``apart`` declares each gate on a channel of its own from the start, and
    ``timeout`` bounds the wait for answers (``confirm_timeout`` by default): for gates known to
    be away, which ``quiet`` logs at debug level. Raises the connection's errors."""
    level = logging.DEBUG if quiet else logging.WARNING
    arguments = gate_arguments(slot_ttl_ms)
    return _declare(
        link,
        gates,
        arguments,
        lambda gate, reply: _refused(link, gate, reply, slot_ttl_ms, level, again=not quiet),
        timeout=timeout or link.confirm_timeout,
        apart=apart,
        level=level,
    )


def gates_away(link: Link, gates: list[str]) -> set[str]:
    """The gates among ``gates`` (which exist, or existed) whose node is down or cut off, by
    passive declares: a claim that such a gate turned down was not lost to another instance.
    Raises the connection's errors."""
    verdicts = _declare(
        link,
        gates,
        {},
        lambda gate, reply: Outcome.AWAY if node_gone(reply) else None,
        timeout=min(PROBE_S, link.confirm_timeout),
        passive=True,
        level=logging.DEBUG,  # the claims' outcomes say it
    )
    return {gate for gate, verdict in zip(gates, verdicts) if verdict is Outcome.AWAY}


def _declare(
    link: Link,
    gates: list[str],
    arguments: dict[str, Any],
    on_close: Any,
    *,
    timeout: float,
    level: int,
    passive: bool = False,
    apart: bool = False,
) -> list[Outcome | None]:
    """Declares pipelined on the declaring channel (or ``apart``); ``on_close(gate, reply)`` gives
    the verdict of a gate whose declare the broker answered by closing the channel."""
    if apart:
        verdicts = _declare_apart(link, gates, arguments, on_close, passive, timeout, level)
        return [verdicts[gate] for gate in gates]
    verdicts = {}
    todo = list(gates)
    while todo:
        channel = link.declare_channel()
        for gate in todo:
            write_declare(channel, gate, arguments, passive=passive)
        answered = 0
        try:
            for gate in todo:
                channel.wait(spec.Queue.DeclareOk, timeout=timeout)
                verdicts[gate] = None
                answered += 1
            todo = []
        except amqp.exceptions.ChannelError as exc:
            link.forget_declarer()  # closed by the broker, with every declare written after
            verdicts[todo[answered]] = on_close(todo[answered], str(exc.reply_text))
            todo = todo[answered + 1 :]
        except TimeoutError:
            link.forget_declarer()
            verdicts[todo[answered]] = _unanswered(todo[answered], timeout, level)
            verdicts.update(_declare_apart(link, todo[answered + 1 :], arguments, on_close, passive, timeout, level))
            todo = []
    return [verdicts[gate] for gate in gates]


def _declare_apart(
    link: Link,
    gates: list[str],
    arguments: dict[str, Any],
    on_close: Any,
    passive: bool,
    timeout: float,
    level: int,
) -> dict[str, Outcome | None]:
    """Declare each gate on a channel of its own, all at once, and wait ``timeout`` for all the
    answers: a gate that holds its declare holds up only itself."""
    if not gates:
        return {}
    raw = link.connection.connection
    channels: dict[str, amqp.Channel] = {}
    answered: set[str] = set()
    closed: dict[str, str] = {}  # gate: the broker's reply when it closed the gate's channel

    def on_channel_close(gate: str, channel: amqp.Channel, code: int, reply: Any, *_: Any) -> None:
        # In place of py-amqp's handler, which would open the channel again and raise.
        closed[gate] = reply.decode(errors="replace") if isinstance(reply, bytes) else str(reply)
        channel.send_method(spec.Channel.CloseOk)
        if not channel.is_closing:  # else our own close is answered later, and that forgets it
            channel.collect()

    for gate in gates:
        channel = raw.channel()  # a round trip: a dead connection raises here
        channels[gate] = channel
        # py-amqp's per-channel handlers: the DeclareOk is noted without a waiter.
        channel._callbacks[spec.Queue.DeclareOk] = lambda *_, gate=gate: answered.add(gate)
        channel._callbacks[spec.Channel.Close] = lambda *args, gate=gate, channel=channel: on_channel_close(
            gate, channel, *args
        )
        write_declare(channel, gate, arguments, passive=passive)
    deadline = time.monotonic() + timeout
    while len(answered) + len(closed) < len(gates):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            raw.drain_events(timeout=left)
        except TimeoutError:
            break
    verdicts: dict[str, Outcome | None] = {}
    for gate, channel in channels.items():
        if gate in closed:
            verdicts[gate] = on_close(gate, closed[gate])
            continue
        let_go(channel)
        verdicts[gate] = None if gate in answered else _unanswered(gate, timeout, level)
    return verdicts


def _unanswered(gate: str, timeout: float, level: int) -> Outcome:
    logger.log(
        level,
        "anarchon: RabbitMQ did not answer for gate %r within %.1fs: the node that holds it is most "
        "likely down or cut off (RabbitMQ 4 holds such a declare for about a minute). Its run is "
        "claimed again shortly, until its deadline; the other runs go on",
        gate,
        timeout,
    )
    return Outcome.AWAY


def _away(gate: str, reply: str, level: int) -> Outcome:
    logger.log(
        level,
        "anarchon: gate %r lives on a RabbitMQ node that is down or cut off (%s). Its run is claimed "
        "again shortly, until its deadline: no instance can win it before that node is back. Never "
        "forget_cluster_node a node while its gates may hold claims",
        gate,
        reply,
    )
    return Outcome.AWAY


def _refused(link: Link, gate: str, reply: str, slot_ttl_ms: int, level: int, *, again: bool) -> Outcome | None:
    """The verdict of a gate whose declare closed the channel: away, or adopted, or refused.

    A gate said to be on a node that is down is declared once more at once when ``again`` (not
    for gates already known to be away): a node that is really down answers the same, in a round
    trip, and a gate caught in RabbitMQ 4's race between two first declares is there by now."""
    if node_gone(reply) and not (again and _NODE_DOWN in reply):
        return _away(gate, reply, level)
    return declare_gate(link, gate, slot_ttl_ms, level)


def declare_gate(link: Link, gate: str, slot_ttl_ms: int, level: int = logging.WARNING) -> Outcome | None:
    """Declare a gate; None when it can serve as one, else the outcome of its run.

    Instances whose ``slot_ttl_ms`` differs, or an older gate made transient or without an
    explicit queue type, are used as they are. Any other difference means the queue is not a
    gate, and it never counts as won; so does a gate the broker refuses (permissions, an
    exclusive queue of another connection). A gate whose node is down is away.
    """

    def adopt(arg: str, current: str | None) -> bool:
        if arg == "x-queue-type":
            return current in (None, "classic")  # made without the explicit type
        if arg == "x-expires" and (current is None or int(current) < slot_ttl_ms):
            logger.warning(
                "anarchon: gate %r exists with x-expires %s, shorter than slot_ttl_ms %d: used as it "
                "is; an instance later than it allows could run the slot twice",
                gate,
                current,
                slot_ttl_ms,
            )
        return arg in ("x-expires", "durable")

    try:
        refusal = declare_adopting(link, gate, gate_arguments(slot_ttl_ms), adopt)
    except amqp.exceptions.ChannelError as exc:
        link.forget_declarer()
        reply = str(exc.reply_text)
        if isinstance(exc, amqp.exceptions.NotFound) and node_gone(reply):
            return _away(gate, reply, level)
        logger.error(
            "anarchon: the broker refused gate %r (%s); this run is skipped. Check the user's "
            "permissions on the vhost and anarchon_prefix",
            gate,
            reply,
        )
        return Outcome.BAD_GATE
    except TimeoutError:
        link.forget_declarer()
        return _unanswered(gate, link.confirm_timeout, level)
    if refusal is not None:
        logger.error(
            "anarchon: queue %r exists but is not a gate (%s); it never counts as a win, so this run "
            "is skipped. Delete the queue (rabbitmqctl delete_queue %s) or change anarchon_prefix",
            gate,
            refusal,
            gate,
        )
        return Outcome.BAD_GATE
    return None
