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

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from typing import Any, NamedTuple

from amqp import spec
from amqp.exceptions import MessageNacked
from kombu.common import ignore_errors
from kombu.exceptions import OperationalError

from . import clock, docs
from .confirms import ConfirmTracker
from .connections import NodeLog, keep_alive, negotiated_heartbeat, reset_connection
from .history import encode_event
from .jobs import Job

__all__ = [
    "Outgoing",
    "SendOutcome",
    "TaskLink",
    "TaskSender",
    "has_publisher_confirms",
    "history_events",
    "instance_id",
    "run_headers",
    "send_run",
    "task_connection",
]

logger = logging.getLogger(__name__)

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
    #: A run of catch-up (trigger ``catch_up``): how many missed runs it stands for.
    coalesced: int = 0


class SendOutcome(NamedTuple):
    """A run once its send is over: sent (``error`` None) or not, at ``at_ms`` (epoch ms)."""

    run: Outgoing
    at_ms: int
    error: BaseException | None


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
    coalesced: int = 0,
) -> dict[str, Any]:
    """The headers a run's task message carries, on top of the job's own: with a fencing token
    (``anarchon_token``) on a backend with leases, which the worker checks before it starts, and
    the instance that sent it (``anarchon_instance``), which the worker's history names; a run
    of catch-up, how many missed runs it stands for (``anarchon_coalesced``)."""
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
    if coalesced:
        headers["anarchon_coalesced"] = coalesced  # a run of catch-up: the missed runs it stands for
    if job.overlap != "allow":
        headers["anarchon_overlap"] = job.overlap  # its job is protected: the worker tells its end
    if job.version:  # a runtime job, which the worker's configuration does not have
        headers["anarchon_history_size"] = job.history_size
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
        self._channel: _TaskChannel | None = None
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
        sending = _Sending(run)
        written.runs.append(sending)
        if written.failure is not None or not self.connection.connected:
            return  # send() connects, with its retries
        try:
            channel = self._open_channel()
            if written.channel is None:
                written.channel = channel
            elif channel is not written.channel:  # the earlier runs' answers would come on the old channel
                raise RuntimeError("the task channel was replaced while runs were being written")
            self._write(channel, sending)
        except Exception as exc:  # noqa: BLE001 - the connection's state is unknown: never reuse it
            written.failure = exc
            self._drop()

    def send(self, runs: Sequence[Outgoing]) -> list[BaseException | None]:
        """One entry per run, in order: None once the broker confirmed its message (without
        confirms: once its publish returned), else the error that stopped it (a run that could
        not be sent by its deadline gets the last one)."""
        written, self._written = self._written, None
        ahead = written.runs if written is not None else []
        if [sending.run for sending in ahead] != list(runs[: len(ahead)]):
            raise ValueError("send() must get the runs written, in the order written, first")
        sendings = ahead + [_Sending(run) for run in runs[len(ahead) :]]
        # Deadlines on the monotonic clock: a wall clock that jumps cannot stretch the retries.
        start, now_ms = time.monotonic(), clock.now_ms()
        for sending in sendings:
            sending.until = start + (sending.run.deadline_ms - now_ms) / 1000
        todo = sendings
        if written is not None and ahead:
            failure = self._settle(written.channel, ahead, written.failure)
            todo = self._again(ahead, failure) + sendings[len(ahead) :]
        while todo:
            remaining = max(sending.until for sending in todo) - time.monotonic()
            try:
                # Safe to retry: nothing is written before the connection is up.
                self.connection.ensure_connection(
                    max_retries=None, interval_start=0, interval_step=0.5, interval_max=2, timeout=max(0.5, remaining)
                )
            except Exception as exc:  # noqa: BLE001 - whatever stops the connection fails these runs
                for sending in todo:
                    sending.finish(exc)
                break
            self._nodes.note(self.connection)
            todo = self._again(todo, self._send_once(todo))
        return [sending.error for sending in sendings]

    def close(self) -> None:
        """Forget the channel (its connection is the caller's to close)."""
        self._channel = None

    def _drop(self) -> None:
        """Never reuse this channel nor this connection: their state is unknown."""
        self.close()
        self.connection.collect()

    def _open_channel(self) -> _TaskChannel:
        """The task channel, opened if need be (a channel of an earlier connection is never used again)."""
        channel = self._channel
        if channel is None or not channel.usable(self.connection):
            channel = self._channel = _TaskChannel(self.app, self.connection)
        return channel

    def _write(self, channel: _TaskChannel, sending: _Sending) -> None:
        """Write the run's task. Raises when the connection or the channel failed (the message may
        have been written: ``sending.written`` tells); other errors finish the run."""
        connection = self.connection
        run = sending.run
        options = dict(run.job.options)
        options["headers"] = run_headers(
            run.job,
            slot=run.slot,
            run_id=run.run_id,
            trigger=run.trigger,
            token=run.token,
            instance=self.instance,
            place=self.place if run.trigger != "manual" else None,
            coalesced=run.coalesced,
        )
        channel.expect(sending)
        try:
            task = self.app.tasks[run.job.task]
            options.update(task_id=run.task_id, producer=channel.producer, retry=False)
            self.written_at[run.task_id] = clock.now_ms()
            task.apply_async(run.job.args, dict(run.job.kwargs), **options)
        except Exception as exc:  # noqa: BLE001 - sorted out below
            if sending.written:
                raise  # after its message was written: the channel's state is unknown
            if not isinstance(exc, channel.broken_errors(connection)):
                sending.finish(exc)  # refused before writing (arguments that cannot be encoded...)
                return
            # The connection or the channel failed (kombu wraps some as OperationalError).
            if isinstance(exc, connection.channel_errors):
                # Before the write: maybe this run's own doing (Celery declares its queue,
                # which the broker may refuse), maybe a message written earlier. Twice in a
                # row: this run's, and it is not tried again.
                sending.strikes += 1
                if sending.strikes >= 2:
                    sending.finish(exc)
            raise
        if not sending.written:
            # apply_async returned without publishing: run here (task_always_eager), or
            # a task class that does not publish with the id it was given.
            eager = bool(self.app.conf.task_always_eager)
            sending.finish(None if eager else RuntimeError(f"task {run.task_id} was not published"))

    def _send_once(self, todo: list[_Sending]) -> BaseException | None:
        """Write the runs' tasks, then read their confirms; returns the error that stopped it."""
        failure: BaseException | None = None
        channel = None
        try:
            channel = self._open_channel()
            for sending in todo:
                self._write(channel, sending)
        except Exception as exc:  # noqa: BLE001 - the connection's state is unknown: never reuse it
            failure = exc
            self._drop()
        return self._settle(channel, todo, failure)

    def _settle(
        self, channel: _TaskChannel | None, todo: list[_Sending], failure: BaseException | None
    ) -> BaseException | None:
        """Read the confirms of the runs written (unless writing failed) and finish those whose
        fate is known: sent, or written with no answer (never sent twice). A refused run, or one
        not written, is certainly not queued: left to :meth:`_again`. Returns the error that
        stopped it."""
        if failure is None and channel is not None and channel.confirms is not None:
            try:
                channel.confirms.wait(lambda left: self.connection.drain_events(timeout=left), CONFIRM_TIMEOUT)
            except Exception as exc:  # noqa: BLE001 - the connection's state is unknown: never reuse it
                failure = exc
                self._drop()
        try:
            for sending in todo:
                if sending.done or not sending.written:
                    continue
                if sending.answer is True:
                    sending.finish(None)
                elif sending.answer is None:  # written, its fate unknown: never sent twice
                    sending.finish(failure or TimeoutError("no confirm"))
        finally:
            if channel is not None:
                channel.forget()
        return failure

    def _again(self, todo: list[_Sending], failure: BaseException | None) -> list[_Sending]:
        """The runs to send again (certainly not queued, before their deadline); the others get
        their error. Pauses before a retry: not a tight loop of reconnections."""
        now = time.monotonic()
        refused = [sending for sending in todo if not sending.done and sending.answer is False]
        unwritten = [sending for sending in todo if not sending.done and sending.answer is not False]
        again = [sending for sending in unwritten if now <= sending.until]
        retried = [sending for sending in refused if now + NACK_BACKOFF <= sending.until]
        if retried or (again and failure is not None):
            again += retried
            time.sleep(NACK_BACKOFF)
        for sending in refused:
            if sending not in again:
                sending.finish(MessageNacked(f"task {sending.run.task_id} refused by the broker"))
        for sending in unwritten:
            if sending not in again:
                sending.finish(failure or TimeoutError(f"task {sending.run.task_id} not sent by its deadline"))
        for sending in again:
            sending.written, sending.answer = False, None
        return again


class TaskLink:
    """A beat's connection for sending tasks, and its :class:`TaskSender`: opened ahead of the
    runs, kept alive while the beat sleeps, and dropped without a goodbye when a stop's grace
    period runs out.

    The connection is the app's broker, with publisher confirms on AMQP (so that a message the
    broker refused is an error logged with its job and slot, not a task silently lost; other
    brokers have none), heartbeats where the transport has them (``broker_heartbeat``) and
    timeouts (so that a dead broker is noticed). Both are made on first use.
    """

    #: Seconds without connecting ahead of the runs after an attempt failed.
    connect_backoff_s = 5.0

    def __init__(self, app: Any, *, instance: str, make_sender: Callable[[Any], TaskSender] | None = None) -> None:
        self.app = app
        self.instance = instance
        #: Makes the sender from the connection (a subclass of TaskSender, in tests of faults).
        self._make_sender = make_sender
        #: 0 while connecting works; after a failed attempt, the time.monotonic() before which
        #: :meth:`connect_ahead` does not try again.
        self._connect_after = 0.0

    @cached_property
    def connection(self) -> Any:
        heartbeat = self.app.conf.get("broker_heartbeat")
        return task_connection(self.app, heartbeat=float(heartbeat) if heartbeat else 0.0)

    @cached_property
    def sender(self) -> TaskSender:
        if self._make_sender is not None:
            return self._make_sender(self.connection)
        return TaskSender(self.app, self.connection, instance=self.instance)

    @property
    def failing(self) -> bool:
        """Whether the last attempt to connect ahead failed (the broker is away)."""
        return bool(self._connect_after)

    def connect_ahead(self) -> None:
        """Have the connection and its channel open before the runs come due (at start, and after
        the connection was lost), or the first runs won would be written only after all the
        claims are answered: connecting takes tens of milliseconds, much more on a busy machine.
        One attempt, then none for ``connect_backoff_s`` seconds; sends connect anyway."""
        if time.monotonic() < self._connect_after:
            return
        try:
            self.sender.open()
        except Exception as exc:  # noqa: BLE001 - the next send connects, with its retries
            logger.log(
                logging.DEBUG if self._connect_after else logging.INFO,  # logged once per outage
                "anarchon: could not connect for sending tasks ahead of the runs (%r); trying again every %g s",
                exc,
                self.connect_backoff_s,
            )
            self._connect_after = time.monotonic() + self.connect_backoff_s
        else:
            self._connect_after = 0.0

    def keep_alive(self) -> None:
        """Read what the broker sent while the beat slept and send a heartbeat; a connection
        found dropped is replaced at the next use."""
        connection = self.__dict__.get("connection")
        if connection is None:
            return
        try:
            keep_alive(connection)
        except Exception as exc:  # noqa: BLE001 - the next send reconnects
            logger.info("anarchon: the task connection dropped while idle (%r); it will be replaced", exc)
            connection.collect()
            self.sender.close()

    def send(self, runs: list[Outgoing]) -> list[SendOutcome]:
        """Send the runs' tasks, all at once, and log how each send ended; returns each run with
        when its message was written (its sent time, not when the batch's confirms were in)."""
        errors = self.sender.send(runs)
        at_ms = clock.now_ms()
        written_at = self.sender.written_at
        for run, error in zip(runs, errors):
            job = run.job
            if error is not None:  # a failed send must not stop the other jobs
                logger.error(
                    "anarchon: job %r slot %d: won, but sending task %s (%s) failed: %r%s",
                    job.name,
                    run.slot,
                    job.task,
                    run.task_id,
                    error,
                    _hint_for(error),
                    exc_info=error,
                )
            else:
                logger.info("anarchon: job %r slot %d: won, sent %s[%s]", job.name, run.slot, job.task, run.task_id)
        return [SendOutcome(run, written_at.pop(run.task_id, at_ms), error) for run, error in zip(runs, errors)]

    def wake_within_s(self) -> float | None:
        """How long the beat may sleep and keep the connection's heartbeats: None without them."""
        connection = self.__dict__.get("connection")
        heartbeat = negotiated_heartbeat(connection) if connection is not None and connection.connected else 0
        return max(1.0, heartbeat / 3) if heartbeat else None

    def drop(self) -> None:
        """Forget the connection without a goodbye (a broker that does not answer would not
        answer that either)."""
        connection = self.__dict__.get("connection")
        if connection is not None:
            reset_connection(connection)
        if "sender" in self.__dict__:
            self.sender.close()

    def close(self) -> None:
        """Release the connection (made again on next use). Interrupted, it is still there for
        :meth:`drop`."""
        connection = self.__dict__.get("connection")
        if connection is not None:
            ignore_errors(connection, connection.release)
        self.__dict__.pop("connection", None)
        self.__dict__.pop("sender", None)


def history_events(outcomes: Sequence[SendOutcome], instance: str) -> list[tuple[str, bytes, int]]:
    """The history events of runs whose send is over, for :meth:`~.Backend.record_many`: ``sent``,
    or ``unsent`` with the error; none for a job that keeps no history."""
    events = []
    for run, at_ms, error in outcomes:
        if not run.job.history_size:
            continue
        failure = {} if error is None else {"error_type": type(error).__name__, "error": str(error)}
        event = encode_event(
            "sent" if error is None else "unsent",
            run=run.run_id,
            job=run.job.name,
            at_ms=at_ms,
            slot=run.slot,
            task_id=run.task_id,
            task=run.job.task,
            instance=instance,
            trigger=run.trigger,
            coalesced=run.coalesced or None,
            **failure,
        )
        events.append((run.job.name, event, run.job.history_size))
    return events


def _hint_for(error: BaseException) -> str:
    """What to change, when a send failed for a reason the configuration decides."""
    if "home node" in str(error):  # RabbitMQ: a classic queue whose node is down or unreachable
        return (
            ". The task queue is a classic queue that lives on a cluster node now lost: declare the task "
            f"queues quorum queues (task_default_queue_type = 'quorum'), see {docs.TASK_SIDE_OF_A_CLUSTER}"
        )
    return ""


class _Sending:
    """One run's task being sent: whether its message was written on the current channel and
    the broker's answer, the channel errors it met before being written, its deadline (on the
    monotonic clock), and once it is done, its error (None: sent)."""

    __slots__ = ("answer", "done", "error", "run", "strikes", "until", "written")

    def __init__(self, run: Outgoing) -> None:
        self.run = run
        self.until = 0.0
        self.written = False
        self.answer: bool | None = None  # acked (True) or nacked (False), once its message was written
        self.strikes = 0
        self.done = False
        self.error: BaseException | None = None

    def finish(self, error: BaseException | None) -> None:
        if not self.done:
            self.done, self.error = True, error

    def answered(self, acked: bool) -> None:
        self.answer = acked


class _Written:
    """Runs written by :meth:`TaskSender.write`, waiting for :meth:`TaskSender.send`."""

    def __init__(self) -> None:
        self.runs: list[_Sending] = []
        self.channel: _TaskChannel | None = None
        self.failure: BaseException | None = None


class _TaskChannel:
    """The task channel, its producer, and which run each message written on it is the task of:
    with publisher confirms, the delivery tags of what is written (a
    :class:`~anarchon_celery.confirms.ConfirmTracker`); without, each publish as it returns."""

    def __init__(self, app: Any, connection: Any) -> None:
        self.raw = connection.connection
        self.channel = connection.channel()
        self._expected: dict[str, _Sending] = {}  # by task id, the runs being written
        self.confirms: ConfirmTracker[_Sending] | None = None
        if has_publisher_confirms(connection):
            self.channel.confirm_select()
            self.confirms = ConfirmTracker(_Sending.answered)
            self.confirms.listen(self.channel)
            self._count_publishes(self.confirms)
        else:
            self._track_publishes()
        self.producer = app.amqp.Producer(self.channel, auto_declare=False)

    def usable(self, connection: Any) -> bool:
        """Whether this channel is open, on ``connection``'s current connection."""
        return self.raw is connection.connection and _is_open(self.channel)

    def broken_errors(self, connection: Any) -> tuple[type[BaseException], ...]:
        """The errors that mean the connection or the channel failed, not the run."""
        broken = (*connection.connection_errors, *connection.channel_errors, OperationalError)
        if self.confirms is None:
            # kombu's Redis transport counts KeyError as a connection error, and Celery's
            # QueueNotFound is one: that is the run's own error, not to be retried.
            broken = tuple(error for error in broken if error is not KeyError)
        return broken

    def expect(self, sending: _Sending) -> None:
        """The next message with this run's task id is its task."""
        self._expected[sending.run.task_id] = sending

    def forget(self) -> None:
        """Forget the runs of the last send (the delivery tags keep counting)."""
        self._expected.clear()
        if self.confirms is not None:
            self.confirms.forget()

    def _written(self, message: Any) -> _Sending | None:
        """The run whose task ``message`` is, now written; None when it is no run's (or a second
        message with the same id: the run's answer is its first)."""
        task_id = _task_id(message)
        sending = self._expected.get(task_id) if isinstance(task_id, str) else None
        if sending is None or sending.written:
            return None
        sending.written = True
        return sending

    def _count_publishes(self, confirms: ConfirmTracker[_Sending]) -> None:
        """Give every message written on the channel its delivery tag, as the broker does.

        Counted at the frame write, not per task: ``apply_async`` may publish more than the task
        (a ``task-sent`` event with ``task_send_sent_event``), and py-amqp's ``basic_publish`` may
        fail on a pending channel error before writing anything, which must not take a tag.
        """
        send_method = self.channel.send_method

        def counted(sig: Any, format: Any = None, args: Any = None, content: Any = None, *rest: Any, **kw: Any) -> Any:
            if sig == spec.Basic.Publish:
                confirms.writing(self._written(content))  # before the write: one that fails half-way took a tag
            return send_method(sig, format, args, content, *rest, **kw)

        self.channel.send_method = counted

    def _track_publishes(self) -> None:
        """Note every message published on the channel, a channel without confirms: a run's task
        is written from the moment its publish starts, and sent once that call returned.

        Noted at the channel's ``basic_publish``, not per task: ``apply_async`` may declare the
        task's queue first (I/O that fails before anything is written) and publish a
        ``task-sent`` event after the task (a failure then does not undo the task's publish).
        """
        basic_publish = self.channel.basic_publish

        def tracked(message: Any, *args: Any, **kwargs: Any) -> Any:
            sending = self._written(message)  # before the write: one that fails half-way may have queued it
            result = basic_publish(message, *args, **kwargs)
            if sending is not None:
                sending.answer = True
            return result

        self.channel.basic_publish = tracked


def _is_open(channel: Any) -> bool:
    """py-amqp channels say ``is_open``; kombu's virtual channels say ``closed``."""
    is_open = getattr(channel, "is_open", None)
    return bool(is_open) if is_open is not None else not getattr(channel, "closed", False)


def _task_id(message: Any) -> Any:
    """The task id of a message as the channel gets it: a dict on kombu's virtual transports'
    ``basic_publish``, else a message object with AMQP-style properties."""
    if isinstance(message, Mapping):
        headers = message.get("headers") or {}
        properties = message.get("properties") or {}
    else:
        properties = getattr(message, "properties", None) or {}
        headers = properties.get("application_headers") or {}
    return headers.get("id") or properties.get("correlation_id")
