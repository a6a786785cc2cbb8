"""Declaring the gates of the runs being claimed: pipelined, and each one that exists already
used as it is when it can serve as a gate, or left out (its run not claimed) when it cannot, or
when the node that holds it does not answer."""

from __future__ import annotations

import logging
import time

import amqp
from amqp import spec

from ..base import Outcome
from .declaring import declare_adopting, write_declare
from .link import Link, let_go
from .names import gate_arguments

logger = logging.getLogger(__name__)

#: A 404 that says the gate exists but its node is gone, as RabbitMQ 3.x and 4.x word it.
_NODE_GONE = ("is down or inaccessible", "stopped by supervisor", "due to timeout", "not running")


def declare_gates(link: Link, gates: list[str], slot_ttl_ms: int) -> list[Outcome | None]:
    """Declare gates pipelined: every declare is written, then the answers are read in order (the
    broker answers a channel's methods in order). One entry per gate: None when it can serve as a
    gate, else the outcome of its run (``BAD_GATE``; ``UNDECIDED`` when no answer came).

    A gate the broker objects to closes the channel and, with it, the declares written after it:
    that one goes through :func:`declare_gate` (adoption, or refusal), and the rest are written
    again. A declare left unanswered (on RabbitMQ 4, a gate whose node was killed holds its
    declare about a minute) costs its own run only: its channel is given up, and the gates after
    it are declared each on a channel of its own, so that one more such gate among them costs no
    more time. Raises the connection's errors."""
    arguments = gate_arguments(slot_ttl_ms)
    verdicts: dict[str, Outcome | None] = {}
    todo = list(gates)
    while todo:
        channel = link.declare_channel()
        for gate in todo:
            write_declare(channel, gate, arguments)
        answered = 0
        try:
            for gate in todo:
                channel.wait(spec.Queue.DeclareOk, timeout=link.confirm_timeout)
                verdicts[gate] = None
                answered += 1
            todo = []
        except amqp.exceptions.ChannelError:
            link.forget_declarer()  # closed by the broker, with every declare written after
            verdicts[todo[answered]] = declare_gate(link, todo[answered], slot_ttl_ms)
            todo = todo[answered + 1 :]
        except TimeoutError:
            link.abandon_declarer()
            verdicts[todo[answered]] = _unanswered(todo[answered], link.confirm_timeout)
            verdicts.update(_declare_apart(link, todo[answered + 1 :], slot_ttl_ms))
            todo = []
    return [verdicts[gate] for gate in gates]


def _declare_apart(link: Link, gates: list[str], slot_ttl_ms: int) -> dict[str, Outcome | None]:
    """Declare each gate on a channel of its own, all at once, and wait ``confirm_timeout`` for
    all the answers: a gate that holds its declare holds up only itself."""
    if not gates:
        return {}
    raw = link.connection.connection
    arguments = gate_arguments(slot_ttl_ms)
    channels: dict[str, amqp.Channel] = {}
    answered: set[str] = set()
    closed: set[str] = set()  # closed by the broker: adopted or refused one by one below
    for gate in gates:
        channel = raw.channel()  # a round trip: a dead connection raises here
        channels[gate] = channel
        # py-amqp's hooks, per channel: the DeclareOk is noted (no waiter is needed), and a
        # channel the broker closes is not reopened (py-amqp revives it otherwise).
        channel._callbacks[spec.Queue.DeclareOk] = lambda *_, gate=gate: answered.add(gate)
        channel._do_revive = lambda gate=gate: closed.add(gate)
        write_declare(channel, gate, arguments)
    deadline = time.monotonic() + link.confirm_timeout
    while len(answered) + len(closed) < len(gates):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            raw.drain_events(timeout=left)
        except TimeoutError:
            break
        except amqp.exceptions.ChannelError:
            continue  # the channel is in `closed`
    verdicts: dict[str, Outcome | None] = {}
    for gate, channel in channels.items():
        if gate in answered:
            verdicts[gate] = None
            let_go(channel)
        elif gate in closed:
            channel.collect()
            verdicts[gate] = declare_gate(link, gate, slot_ttl_ms)
        else:
            let_go(channel)
            verdicts[gate] = _unanswered(gate, link.confirm_timeout)
    return verdicts


def _unanswered(gate: str, timeout: float) -> Outcome:
    logger.error(
        "anarchon: RabbitMQ did not answer the declare of gate %r within %.1fs: the node that holds it "
        "is most likely down or cut off (RabbitMQ 4 holds such a declare for about a minute). This run "
        "is not claimed by this instance (claims fail closed); the other runs go on",
        gate,
        timeout,
    )
    return Outcome.UNDECIDED


def declare_gate(link: Link, gate: str, slot_ttl_ms: int) -> Outcome | None:
    """Declare a gate; None when it can serve as one, else the outcome of its run.

    Instances whose ``slot_ttl_ms`` differs, or an older gate made transient or without an
    explicit queue type, are used as they are. Any other difference means the queue is not a
    gate, and it never counts as won; so does a gate the broker refuses (permissions, an
    exclusive queue of another connection). A gate whose node is down is not claimed.
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
    except amqp.exceptions.NotFound as exc:
        link.forget_declarer()
        reply = str(exc.reply_text)
        if any(words in reply for words in _NODE_GONE):
            logger.error(
                "anarchon: gate %r lives on a RabbitMQ node that is down or cut off (%s). This run is "
                "not claimed by this instance (claims fail closed): no instance can win it until that "
                "node is back. Start the node again; never forget_cluster_node it while its gates may "
                "hold claims",
                gate,
                reply,
            )
            return Outcome.UNDECIDED
        logger.error("anarchon: the broker refused gate %r (%s); this run is skipped", gate, reply)
        return Outcome.BAD_GATE
    except amqp.exceptions.ChannelError as exc:
        link.forget_declarer()
        logger.error(
            "anarchon: the broker refused gate %r (%s); this run is skipped. Check the user's "
            "permissions on the vhost and anarchon_prefix",
            gate,
            exc,
        )
        return Outcome.BAD_GATE
    except TimeoutError:
        link.abandon_declarer()
        return _unanswered(gate, link.confirm_timeout)
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
