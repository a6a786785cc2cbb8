"""Sending runs' Celery tasks: once each, with their deterministic ids and headers.

The tasks of runs won together are written one after the other on a channel in confirm mode and
their confirms are read afterwards, matched by delivery tag: one round trip for the lot, not one
per task (kombu has no batch publish for AMQP; its ``Producer.batch`` publishes one by one there).

Publisher confirms are an AMQP feature (py-amqp: the ``amqp``, ``amqps`` and ``pyamqp`` transports).
On the other transports (Redis, SQS, the filesystem, memory...) each task is published by its
``apply_async`` as usual, with the same task id, headers and options, and counts as sent once that
publish call returned: there is no answer to wait for, and nothing is read back.

A send is repeated only when it certainly did not reach a queue: the connection could not be made
(nothing was written), or the broker refused the message (a nack). A connection lost or a confirm
missing after the message was written is not repeated, since the broker may have queued it
already: a second copy would run the task twice. Without confirms, a publish that raised once
it had started writing is that run's error, likewise.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from amqp import spec
from amqp.exceptions import MessageNacked
from kombu.exceptions import OperationalError

from . import clock
from .connections import NodeLog
from .jobs import Job

__all__ = [
    "Outgoing",
    "TaskSender",
    "has_publisher_confirms",
    "instance_id",
    "run_headers",
    "send_run",
    "task_connection",
]

#: Seconds to wait for the broker's confirms of the task messages written together.
CONFIRM_TIMEOUT = 5.0
#: Seconds between two sends of a message the broker refused.
NACK_BACKOFF = 0.5


class Outgoing(NamedTuple):
    """One run's task, to be sent by ``deadline_ms`` (epoch milliseconds) at the latest."""

    job: Job
    slot: int
    task_id: str
    run_id: str
    trigger: str
    deadline_ms: int
    #: The run's fencing token on a backend with leases (0: none), carried in the message.
    token: int = 0


def instance_id() -> str:
    """Who this process is, as written in claims and history: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def run_headers(
    job: Job,
    *,
    slot: int,
    run_id: str,
    trigger: str,
    token: int = 0,
    instance: str | None = None,
    place: str | None = None,
) -> dict[str, Any]:
    """The headers a run's task message carries, on top of the job's own: with a fencing token
    (``anarchon_token``) on a backend with leases, which the worker checks before it starts, and
    the instance that sent it (``anarchon_instance``), which the worker's history names."""
    headers = {
        **dict(job.options.get("headers") or {}),
        "anarchon_job": job.name,
        "anarchon_slot": slot,
        "anarchon_run": run_id,
        "anarchon_trigger": trigger,
    }
    if token:
        headers["anarchon_token"] = token
    if instance:
        headers["anarchon_instance"] = instance
    if place:
        headers["anarchon_place"] = place  # where the run was decided (Backend.place)
    return headers


def task_connection(app: Any, **options: Any) -> Any:
    """A connection to send tasks on, from the app's broker settings. Confirms are handled by
    :class:`TaskSender` on its own channel, so kombu's wait-for-each-publish mode is turned off."""
    transport_options = {"read_timeout": 10, "write_timeout": 10, **options.pop("transport_options", {})}
    transport_options["confirm_publish"] = False
    connection = app.connection_for_write(transport_options=transport_options, **options)
    if getattr(connection.get_transport_cls(), "driver_type", None) == "redis":  # redis, rediss, sentinel
        merged = connection.transport_options  # the app's broker_transport_options and the ones above
        # redis-py waits forever on a dead server by default (kombu passes no timeouts)...
        merged.setdefault("socket_timeout", 10)
        merged.setdefault("socket_connect_timeout", 10)
        # ...and with retry_on_timeout it sends a command again after a timeout, when the first
        # one may have been executed: a task queued twice. Never on this connection.
        merged["retry_on_timeout"] = False
    return connection


def has_publisher_confirms(connection: Any) -> bool:
    """Whether tasks are sent on ``connection`` with publisher confirms (else a plain publish).

    kombu has no capability for confirms (``transport.implements`` lists ``asynchronous``,
    ``batch_publish``, ``exchange_type`` and ``heartbeats`` only), and the confirmed path drives a
    py-amqp channel itself (``confirm_select``, ``send_method``, its ``basic_ack``/``basic_nack``
    events): it is taken exactly when the transport's driver is py-amqp, as kombu's
    ``driver_name`` says for the ``amqp``, ``amqps`` and ``pyamqp`` transports and their
    subclasses. No I/O: only the transport class is looked at.
    """
    return getattr(connection.get_transport_cls(), "driver_name", None) == "py-amqp"


def send_run(app: Any, connection: Any, job: Job, **run: Any) -> None:
    """Send one run (see :class:`TaskSender`); raise its error when it could not be sent."""
    error = TaskSender(app, connection, instance=instance_id()).send([Outgoing(job, **run)])[0]
    if error is not None:
        raise error


class TaskSender:
    """Sends runs' tasks over ``connection`` (from :func:`task_connection`), on a channel of its
    own that it keeps between sends: confirmed on AMQP, a plain publish on the other transports
    (see :func:`has_publisher_confirms`).

    Runs can be written one by one as they are won (:meth:`write`), while other claims are still
    being answered, and then handed to :meth:`send`, which reads their confirms and sends what
    could not be written then.
    """

    def __init__(self, app: Any, connection: Any, *, instance: str | None = None) -> None:
        self.app = app
        self.connection = connection
        #: Who sends, named in each message (``anarchon_instance``).
        self.instance = instance
        #: Where the runs sent were decided (Backend.place), named in each message.
        self.place: str | None = None
        #: When each run's message was last written, by task id (epoch ms): for its history.
        self.written_at: dict[str, int] = {}
        self._channel: Any = None
        self._producer: Any = None
        self._confirms: _TaskConfirms | None = None
        self._raw: Any = None
        self._written: _Written | None = None
        self._nodes = NodeLog("tasks", "the broker")

    def open(self) -> None:
        """Connect (one attempt) and open the task channel now, ahead of the runs, so that the
        first runs won are written as their claims are answered. Does nothing while runs written
        wait for :meth:`send`. Raises what stopped it; the next send connects again."""
        if self._written is not None:
            return
        try:
            self.connection.ensure_connection(max_retries=0)
            self._nodes.note(self.connection)
            self._open_channel()
        except Exception:
            self._drop()
            raise

    def write(self, run: Outgoing) -> None:
        """Write ``run``'s task now if the connection is up, without waiting for its confirm.
        Never raises: a run not written here is sent by :meth:`send`, which must get the runs
        written, in the order written, at the start of its list."""
        written = self._written
        if written is None:
            written = self._written = _Written()
        index = len(written.runs)
        written.runs.append(run)
        if written.failure is not None or not self.connection.connected:
            return  # send() connects, with its retries
        try:
            producer, confirms = self._open_channel()
            if written.confirms is None:
                written.confirms = confirms
            elif confirms is not written.confirms:  # the earlier runs' answers would come on the old channel
                raise RuntimeError("the task channel was replaced while runs were being written")
            self._write(producer, confirms, written.runs, index, written.results, written.strikes)
        except Exception as exc:  # noqa: BLE001 - the connection's state is unknown: never reuse it
            written.failure = exc
            self._drop()

    def send(self, runs: Sequence[Outgoing]) -> list[BaseException | None]:
        """One entry per run, in order: None once the broker confirmed its message (without
        confirms: once its publish returned), else the error that stopped it (a run that could
        not be sent by its deadline gets the last one)."""
        results: dict[int, BaseException | None] = {}
        strikes: dict[int, int] = {}  # channel errors each run met before its message was written
        # Deadlines on the monotonic clock: a wall clock that jumps cannot stretch the retries.
        start, now_ms = time.monotonic(), clock.now_ms()
        until = [start + (run.deadline_ms - now_ms) / 1000 for run in runs]
        written, self._written = self._written, None
        todo = list(range(len(runs)))
        if written is not None and written.runs:
            if list(runs[: len(written.runs)]) != written.runs:
                raise ValueError("send() must get the runs written, in the order written, first")
            results.update(written.results)
            strikes.update(written.strikes)
            ahead = list(range(len(written.runs)))
            refused, unwritten, failure = self._settle(written.confirms, ahead, results, written.failure)
            todo = self._again(runs, until, results, refused, unwritten, failure) + todo[len(written.runs) :]
        while todo:
            remaining = max(until[i] for i in todo) - time.monotonic()
            try:
                # Safe to retry: nothing is written before the connection is up.
                self.connection.ensure_connection(
                    max_retries=None, interval_start=0, interval_step=0.5, interval_max=2, timeout=max(0.5, remaining)
                )
            except Exception as exc:  # noqa: BLE001 - whatever stops the connection fails these runs
                results.update((i, exc) for i in todo)
                break
            self._nodes.note(self.connection)
            refused, unwritten, failure = self._send_once(runs, todo, results, strikes)
            todo = self._again(runs, until, results, refused, unwritten, failure)
        return [results.get(i) for i in range(len(runs))]

    def _again(
        self,
        runs: Sequence[Outgoing],
        until: list[float],
        results: dict[int, BaseException | None],
        refused: list[int],
        unwritten: list[int],
        failure: BaseException | None,
    ) -> list[int]:
        """The runs to send again (certainly not queued, before their deadline); the others get
        their error. Pauses before a retry: not a tight loop of reconnections."""
        now = time.monotonic()
        todo = [i for i in unwritten if now <= until[i]]
        again = [i for i in refused if now + NACK_BACKOFF <= until[i]]
        if again or (todo and failure is not None):
            todo += again
            time.sleep(NACK_BACKOFF)
        for i in refused:
            results.setdefault(i, MessageNacked(f"task {runs[i].task_id} refused by the broker"))
        for i in unwritten:
            results.setdefault(i, failure or TimeoutError(f"task {runs[i].task_id} not sent by its deadline"))
        for i in todo:
            results.pop(i, None)
        return todo

    def close(self) -> None:
        """Forget the channel (its connection is the caller's to close)."""
        self._channel = self._confirms = self._raw = self._producer = None

    def _drop(self) -> None:
        """Never reuse this channel nor this connection: their state is unknown."""
        self.close()
        self.connection.collect()

    def _open_channel(self) -> tuple[Any, _TaskConfirms]:
        """The producer of the task channel (opened if need be) and the channel's confirms."""
        raw = self.connection.connection
        if self._channel is None or self._confirms is None or self._raw is not raw or not _is_open(self._channel):
            self._raw = raw  # a channel of an earlier connection is never used again
            channel = self.connection.channel()
            confirms: _TaskConfirms
            if has_publisher_confirms(self.connection):
                channel.confirm_select()
                confirms = _TaskConfirms()
                channel.events["basic_ack"].add(confirms.on_ack)
                channel.events["basic_nack"].add(confirms.on_nack)
                _count_publishes(channel, confirms)
            else:
                confirms = _TaskPublishes()
                _track_publishes(channel, confirms)
            producer = self.app.amqp.Producer(channel, auto_declare=False)
            self._channel, self._confirms, self._producer = channel, confirms, producer
        return self._producer, self._confirms

    def _write(
        self,
        producer: Any,
        confirms: _TaskConfirms,
        runs: Sequence[Outgoing],
        i: int,
        results: dict[int, BaseException | None],
        strikes: dict[int, int],
    ) -> None:
        """Write run ``i``'s task. Raises when the connection or the channel failed (the run may
        have been written: ``confirms.wrote(i)`` tells); other errors become its result."""
        connection = self.connection
        run = runs[i]
        options = dict(run.job.options)
        options["headers"] = run_headers(
            run.job,
            slot=run.slot,
            run_id=run.run_id,
            trigger=run.trigger,
            token=run.token,
            instance=self.instance,
            place=self.place if run.trigger == "schedule" else None,
        )
        confirms.runs[run.task_id] = i
        try:
            task = self.app.tasks[run.job.task]
            options.update(task_id=run.task_id, producer=producer, retry=False)
            self.written_at[run.task_id] = clock.now_ms()
            task.apply_async(run.job.args, dict(run.job.kwargs), **options)
        except Exception as exc:  # noqa: BLE001 - sorted out below
            if confirms.wrote(i):
                raise  # after its message was written: the channel's state is unknown
            broken = (*connection.connection_errors, *connection.channel_errors, OperationalError)
            if isinstance(confirms, _TaskPublishes):
                # kombu's Redis transport counts KeyError as a connection error, and Celery's
                # QueueNotFound is one: that is the run's own error, not to be retried.
                broken = tuple(error for error in broken if error is not KeyError)
            if not isinstance(exc, broken):
                results[i] = exc  # refused before writing (arguments that cannot be encoded...)
                return
            # The connection or the channel failed (kombu wraps some as OperationalError).
            if isinstance(exc, connection.channel_errors):
                # Before the write: maybe this run's own doing (Celery declares its queue,
                # which the broker may refuse), maybe a message written earlier. Twice in a
                # row: this run's, and it is not tried again.
                strikes[i] = strikes.get(i, 0) + 1
                if strikes[i] >= 2:
                    results[i] = exc
            raise
        if not confirms.wrote(i):
            # apply_async returned without publishing: run here (task_always_eager), or
            # a task class that does not publish with the id it was given.
            eager = bool(self.app.conf.task_always_eager)
            results[i] = None if eager else RuntimeError(f"task {run.task_id} was not published")

    def _send_once(
        self,
        runs: Sequence[Outgoing],
        todo: list[int],
        results: dict[int, BaseException | None],
        strikes: dict[int, int],
    ) -> tuple[list[int], list[int], BaseException | None]:
        """Write the runs' tasks, then read their confirms. Returns the runs the broker refused
        and the runs not written (both certainly not queued), and the error that stopped it."""
        failure: BaseException | None = None
        confirms = None
        try:
            producer, confirms = self._open_channel()
            for i in todo:
                self._write(producer, confirms, runs, i, results, strikes)
        except Exception as exc:  # noqa: BLE001 - the connection's state is unknown: never reuse it
            failure = exc
            self._drop()
        return self._settle(confirms, todo, results, failure)

    def _settle(
        self,
        confirms: _TaskConfirms | None,
        todo: list[int],
        results: dict[int, BaseException | None],
        failure: BaseException | None,
    ) -> tuple[list[int], list[int], BaseException | None]:
        """Read the confirms of the runs written (unless writing failed), and sort ``todo`` out:
        returns the runs refused and the runs not written, and the error that stopped it."""
        if failure is None and confirms is not None:
            try:
                deadline = time.monotonic() + CONFIRM_TIMEOUT
                while confirms.waiting:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"no confirm within {CONFIRM_TIMEOUT}s")
                    self.connection.drain_events(timeout=left)
            except Exception as exc:  # noqa: BLE001 - the connection's state is unknown: never reuse it
                failure = exc
                self._drop()
        refused = []
        try:
            for i in todo:
                if i in results or confirms is None or not confirms.wrote(i):
                    continue
                answer = confirms.answers.get(i)
                if answer is True:
                    results[i] = None
                elif answer is False:
                    refused.append(i)  # nothing was queued: safe to send again
                else:  # written, its fate unknown: never sent twice
                    results[i] = failure or TimeoutError("no confirm")
        finally:
            if confirms is not None:
                confirms.clear()
        unwritten = [i for i in todo if i not in results and i not in refused]
        return refused, unwritten, failure


class _Written:
    """Runs written by :meth:`TaskSender.write`, waiting for :meth:`TaskSender.send`."""

    def __init__(self) -> None:
        self.runs: list[Outgoing] = []
        self.confirms: _TaskConfirms | None = None
        self.results: dict[int, BaseException | None] = {}
        self.strikes: dict[int, int] = {}
        self.failure: BaseException | None = None


def _count_publishes(channel: Any, confirms: _TaskConfirms) -> None:
    """Give every message written on ``channel`` its delivery tag, as the broker does.

    Counted at the frame write, not per task: ``apply_async`` may publish more than the task
    (a ``task-sent`` event with ``task_send_sent_event``), and py-amqp's ``basic_publish`` may
    fail on a pending channel error before writing anything, which must not take a tag.
    """
    send_method = channel.send_method

    def counted(sig: Any, format: Any = None, args: Any = None, content: Any = None, *rest: Any, **kw: Any) -> Any:
        if sig == spec.Basic.Publish:
            confirms.writing(content)  # before the write: one that fails half-way took a tag
        return send_method(sig, format, args, content, *rest, **kw)

    channel.send_method = counted


def _is_open(channel: Any) -> bool:
    """py-amqp channels say ``is_open``; kombu's virtual channels say ``closed``."""
    is_open = getattr(channel, "is_open", None)
    return bool(is_open) if is_open is not None else not getattr(channel, "closed", False)


def _track_publishes(channel: Any, publishes: _TaskPublishes) -> None:
    """Note every message published on ``channel``, a channel without confirms: a run's task is
    written from the moment its publish starts, and sent once that call returned.

    Noted at the channel's ``basic_publish``, not per task: ``apply_async`` may declare the task's
    queue first (I/O that fails before anything is written) and publish a ``task-sent`` event
    after the task (a failure then does not undo the task's publish).
    """
    basic_publish = channel.basic_publish

    def tracked(message: Any, *args: Any, **kwargs: Any) -> Any:
        run = publishes.publishing(message)  # before the write: one that fails half-way may have queued it
        result = basic_publish(message, *args, **kwargs)
        if run is not None:
            publishes.answers[run] = True
        return result

    channel.basic_publish = tracked


class _TaskConfirms:
    """Delivery tags of the messages written on one confirm channel, and the answers for the
    runs' tasks among them."""

    def __init__(self) -> None:
        self.next_tag = 1
        self.runs: dict[str, int] = {}  # task id -> run index, for the runs being sent
        self.tags: dict[int, int | None] = {}  # unanswered delivery tag -> run index (None: not a run's task)
        self.written: set[int] = set()  # run indexes whose message was written
        self.answers: dict[int, bool] = {}  # run index -> acked (True) or nacked (False)

    @property
    def waiting(self) -> bool:
        return any(run is not None for run in self.tags.values())

    def writing(self, message: Any) -> None:
        properties = getattr(message, "properties", None) or {}
        task_id = (properties.get("application_headers") or {}).get("id") or properties.get("correlation_id")
        run = self.runs.get(task_id) if isinstance(task_id, str) else None
        if run is not None and run in self.written:
            run = None  # a second message with the same id: the run's answer is its first
        self.tags[self.next_tag] = run
        if run is not None:
            self.written.add(run)
        self.next_tag += 1

    def wrote(self, run: int) -> bool:
        return run in self.written

    def clear(self) -> None:
        """Forget the runs of the last send (their tags keep counting)."""
        self.runs.clear()
        self.written.clear()
        self.answers.clear()
        self.tags = {tag: None for tag in self.tags}

    def on_ack(self, tag: int, multiple: bool) -> None:
        self._settle(tag, multiple, True)

    def on_nack(self, tag: int, multiple: bool) -> None:
        self._settle(tag, multiple, False)

    def _settle(self, tag: int, multiple: bool, acked: bool) -> None:
        for t in [t for t in self.tags if t <= tag] if multiple else [tag]:
            run = self.tags.pop(t, None)
            if run is not None:
                self.answers[run] = acked


class _TaskPublishes(_TaskConfirms):
    """The runs' tasks published on a channel without confirms: a run's answer is set (acked)
    when its publish call returns, and there is never anything to wait for."""

    @property
    def waiting(self) -> bool:
        return False  # never drain_events: on a virtual transport that consumes messages

    def publishing(self, message: Any) -> int | None:
        """Note ``message`` being published; returns the run it is the task of, if any."""
        task_id = _task_id(message)
        run = self.runs.get(task_id) if isinstance(task_id, str) else None
        if run is None or run in self.written:
            return None  # a second message with the same id: the run's answer is its first
        self.written.add(run)
        return run


def _task_id(message: Any) -> Any:
    """The task id of a message as the channel's ``basic_publish`` gets it: a dict on kombu's
    virtual transports, else a message object with AMQP-style properties."""
    if isinstance(message, Mapping):
        headers = message.get("headers") or {}
        properties = message.get("properties") or {}
    else:
        properties = getattr(message, "properties", None) or {}
        headers = properties.get("application_headers") or {}
    return headers.get("id") or properties.get("correlation_id")
