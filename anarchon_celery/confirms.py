"""Publisher confirms on a py-amqp channel: which message each answer is for.

RabbitMQ numbers the messages published on a channel in confirm mode 1, 2, 3... (every
``basic.publish``, even one it refuses) and answers each with a ``basic.ack`` or ``basic.nack``
carrying that delivery tag, or settling every tag up to it at once (``multiple``). A
:class:`ConfirmTracker` counts the tags as messages are written, maps each to a key of the
caller's (a gate, a history event, a run's task), and settles them as the answers come in; the
caller reads the answers by key. The claims, the history and the tasks each keep one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import amqp

__all__ = ["ConfirmTracker", "publish"]

K = TypeVar("K")


class ConfirmTracker(Generic[K]):
    """The delivery tags of the messages written on one confirm channel, by key, and the
    broker's answers to them: True (acked) or False (nacked). A message written under the key
    None takes its tag but is nobody's (a ``task-sent`` event written beside a task)."""

    def __init__(self, on_answer: Callable[[K, bool], None] | None = None) -> None:
        self.next_tag = 1
        #: Unanswered delivery tags, with their keys.
        self.pending: dict[int, K | None] = {}
        #: The answers read, by key, unless ``on_answer`` takes them; the caller takes them out.
        self.answers: dict[K, bool] = {}
        #: Given each key with its answer as it is read (inside py-amqp's event dispatch).
        self.on_answer = on_answer

    def listen(self, channel: Any) -> None:
        """Have ``channel`` (in confirm mode) report its answers here."""
        channel.events["basic_ack"].add(self.on_ack)
        channel.events["basic_nack"].add(self.on_nack)

    def writing(self, key: K | None) -> int:
        """Note a message about to be written (before the write: one that fails half-way took
        its tag all the same); returns its delivery tag."""
        tag = self.next_tag
        self.next_tag += 1
        self.pending[tag] = key
        return tag

    @property
    def waiting(self) -> bool:
        """Whether a keyed message is still unanswered."""
        return any(key is not None for key in self.pending.values())

    def on_ack(self, tag: int, multiple: bool) -> None:
        self._settle(tag, multiple, True)

    def on_nack(self, tag: int, multiple: bool) -> None:
        self._settle(tag, multiple, False)

    def _settle(self, tag: int, multiple: bool, acked: bool) -> None:
        for t in [t for t in self.pending if t <= tag] if multiple else [tag]:
            key = self.pending.pop(t, None)
            if key is None:
                continue
            if self.on_answer is not None:
                self.on_answer(key, acked)
            else:
                self.answers[key] = acked

    def wait(self, drain: Callable[[float], Any], timeout: float, *, ours: Callable[[], float] | None = None) -> None:
        """Read answers with ``drain(seconds)`` until none is waited for; TimeoutError after
        ``timeout`` seconds. ``ours``, called after each read, does the caller's work on the
        answers read and returns the seconds it took, which do not count against the timeout."""
        deadline = time.monotonic() + timeout
        while self.waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no confirm within {timeout:g}s")
            drain(left)
            if ours is not None:
                deadline += ours()

    def forget(self) -> None:
        """Forget the keys and answers of what was written so far (its tags keep counting: a late
        answer to one of them is nobody's)."""
        self.pending = dict.fromkeys(self.pending)
        self.answers.clear()


def publish(
    channel: amqp.Channel, message: amqp.Message, *, exchange: str, routing_key: str, mandatory: bool = False
) -> None:
    """Write ``message`` on ``channel`` without waiting for an answer: on a confirm channel, a
    :class:`ConfirmTracker` reads it; the announcements of job definitions get none.

    py-amqp's public ``basic_publish`` becomes ``basic_publish_confirm`` on a connection made with
    ``confirm_publish=True`` (kombu's transport option, which a user's broker options may set):
    it would wait for each message's answer in turn and raise on a nack. Its plain publish,
    ``_basic_publish``, is the one that leaves the answers to the caller's tracker.
    """
    amqp.Channel._basic_publish(channel, message, exchange=exchange, routing_key=routing_key, mandatory=mandatory)
