"""Declaring the gates of the runs being claimed: pipelined, and each one that exists already
used as it is when it can serve as a gate, or left out (its run skipped) when it cannot."""

from __future__ import annotations

import logging

import amqp
from amqp import spec

from .declaring import declare_adopting, write_declare
from .link import Link
from .names import gate_arguments

logger = logging.getLogger(__name__)


def declare_gates(link: Link, gates: list[str], slot_ttl_ms: int) -> list[bool]:
    """Declare gates pipelined: every declare is written, then the answers are read in order (the
    broker answers a channel's methods in order). A gate the broker objects to closes the channel
    and, with it, the declares written after it: that one goes through :func:`declare_gate`
    (adoption, or refusal), and the rest are written again. One entry per gate: whether it can
    serve as a gate. Raises the connection's errors."""
    arguments = gate_arguments(slot_ttl_ms)
    usable: dict[str, bool] = {}
    todo = list(gates)
    while todo:
        channel = link.declare_channel()
        for gate in todo:
            write_declare(channel, gate, arguments)
        answered = 0
        try:
            for gate in todo:
                channel.wait(spec.Queue.DeclareOk, timeout=link.confirm_timeout)
                usable[gate] = True
                answered += 1
            todo = []
        except amqp.exceptions.ChannelError:
            link.forget_declarer()  # closed by the broker, with every declare written after
            usable[todo[answered]] = declare_gate(link, todo[answered], slot_ttl_ms)
            todo = todo[answered + 1 :]
    return [usable[gate] for gate in gates]


def declare_gate(link: Link, gate: str, slot_ttl_ms: int) -> bool:
    """Declare a gate; False when it cannot serve as one.

    Instances whose ``slot_ttl_ms`` differs, or an older gate made transient or without an
    explicit queue type, are used as they are. Any other difference means the queue is not a
    gate, and it never counts as won; so does a gate the broker refuses (permissions, an
    exclusive queue of another connection).
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
