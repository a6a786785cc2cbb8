"""Declaring durable queues that may exist already, made with other arguments: a queue keeps the
arguments it was made with, and the backend uses it as it is where that is safe."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import amqp
from amqp import spec

from .link import Link

__all__ = ["declare_adopting", "write_declare"]

_INEQUIVALENT = re.compile(r"inequivalent arg '([^']+)' for .*: received (.*) but current is (.*)\Z")
_VALUE = re.compile(r"'([^']*)'")


def write_declare(channel: amqp.Channel, name: str, arguments: dict[str, Any], *, passive: bool = False) -> None:
    """Write a durable queue's declare without waiting for its answer (the broker answers a
    channel's methods in order). A ``passive`` one only asks whether the queue is there."""
    # queue.declare's fields: ticket, queue, passive, durable, exclusive, auto_delete, nowait,
    # arguments. Not nowait: a declare with nowait does not renew x-expires.
    channel.send_method(spec.Queue.Declare, "BsbbbbbF", (0, name, passive, True, False, False, False, arguments))


def _current_value(text: str) -> str | None:
    """The current value in a 406 reply: ``'60000'``, ``the value '60000' of type 'long'``, ``none``."""
    match = _VALUE.search(text)
    return match.group(1) if match else None


def declare_adopting(
    link: Link, name: str, arguments: dict[str, Any], adopt: Callable[[str, str | None], bool]
) -> str | None:
    """Declare a durable queue; None when done, else the broker's reply naming a difference
    that ``adopt(argument, current value)`` refused.

    A queue keeps the arguments it was made with, and a 406 reply names only the first one that
    differs, with its current value. Redeclaring with that value proves, in the end, that every
    other argument matches.
    """
    arguments = dict(arguments)
    durable = True
    for _ in range(len(arguments) + 2):
        try:
            link.declare_channel().queue_declare(
                name, durable=durable, auto_delete=False, exclusive=False, arguments=arguments
            )
            return None
        except amqp.exceptions.PreconditionFailed as exc:
            link.forget_declarer()  # the broker closed that channel
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
