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
from ..births import born
from ..definitions import JobConflict, JobDef, check_change
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


class LogState:
    """What the control log says, folded in log order: the pauses and the runtime jobs, the
    changes accepted (by their ``id``), and the runtime jobs changed, in order (:attr:`changed`).

    A change of a runtime job is accepted only when the version it is based on (``base``) is the
    one kept at that point of the log, so that every instance, reading the same log, accepts the
    same changes; the writer reads the log back to learn whether its change was."""

    def __init__(self) -> None:
        self.pauses: dict[str, Pause] = {}
        self.defs: dict[str, JobDef] = {}
        self.accepted: dict[str, bool] = {}  # by the id of each change of a runtime job
        self.changed: list[str] = []
        #: When each job came to be (see :mod:`..births`): records ``born`` name many jobs.
        self.births: dict[str, int] = {}

    def apply(self, record: dict[str, Any]) -> str | None:
        """Apply one record; the job whose pause or definition it changed, if any."""
        job, op = record["job"], record.get("op")
        if op == "born":
            self._born(record.get("jobs"))
            return None
        if op == "pause":
            pause = Pause.decode(json.dumps(record.get("pause")))
            if pause is None:
                return None
            self.pauses[job] = pause
        elif op == "resume":
            if self.pauses.pop(job, None) is None:
                return None
        elif op in ("put", "remove"):
            return self._change(job, op, record)
        else:
            return None
        return job

    def _born(self, jobs: Any) -> None:
        if isinstance(jobs, dict):
            for job, since in jobs.items():
                if isinstance(since, int) and not isinstance(since, bool):
                    self.births[job] = born(self.births.get(job), None, since)

    def _change(self, job: str, op: str, record: dict[str, Any]) -> str | None:
        base = record.get("base")
        kept = self.defs.get(job)
        accepted = False
        if op == "put" and isinstance(record.get("entry"), dict):
            with contextlib.suppress(JobConflict):
                version = check_change(job, kept, base if isinstance(base, int) else None)
                at = record.get("at")
                self.defs[job] = JobDef(
                    job, version, record["entry"], str(record.get("by", "")), at if isinstance(at, int) else 0
                )
                accepted = True
        elif op == "remove" and kept is not None and (base is None or base == kept.version):
            del self.defs[job]
            self.pauses.pop(job, None)
            accepted = True
        if isinstance(record.get("id"), str):
            self.accepted[record["id"]] = accepted
        if accepted:
            self.changed.append(job)
            return job
        return None


def fold(records: list[dict[str, Any]], into: LogState | None = None) -> LogState:
    """Apply the log's records, in log order, to ``into`` (a new state by default)."""
    state = LogState() if into is None else into
    for record in records:
        state.apply(record)
    return state


class ControlLog:
    """The control log of the deployment under ``prefix``, through ``link``."""

    def __init__(self, link: Link, prefix: str) -> None:
        self.link = link
        self.name = log_name(prefix)
        #: The pauses and runtime jobs as this instance has read them (followed: see :meth:`follow`).
        self.view = LogState()
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

    def read(self) -> LogState:
        """The log, read to its end."""
        records, _ = read_streams(self.link, {"log": self.name}, 0.5, _decode)
        return fold(records["log"])

    def pauses(self) -> dict[str, Pause]:
        """The pauses kept in the log, read to its end (those in effect now)."""
        now = clock.now_ms()
        return {job: pause for job, pause in sorted(self.read().pauses.items()) if pause.in_effect(now)}

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
                self.view.changed.clear()  # (what was there at start is not a change)
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
        if record is None:
            return
        job = self.view.apply(record)
        if job is not None and record.get("op") in ("pause", "resume"):
            pause = self.view.pauses.get(job)
            logger.info("anarchon: job %r %s", job, f"paused by {pause.by}" if pause else "resumed")

    def introduce(self, since: dict[str, int]) -> dict[str, int]:
        """See :meth:`~..base.Backend.introduce`: the log read (and followed from then on), the
        jobs it has no earlier birth of appended in one record ``born``. Every instance folds the
        records in log order, so a birth only goes down; two instances that start together each
        go by what they read and their own start, and a run is still won once, at its gate.
        Raises BrokerError when the log cannot be read, or the record not kept."""
        try:
            self.link.connect(self.link.confirm_timeout)
        except self.link.errors() as exc:
            raise BrokerError(f"the control log {self.name!r} could not be read ({type(exc).__name__}: {exc})") from exc
        self.follow()
        if not self._read:
            raise BrokerError(f"the control log {self.name!r} could not be read")
        kept = self.view.births
        told = {job: at for job, at in since.items() if job not in kept or at < kept[job]}
        if told:
            try:
                self.append({"op": "born", "job": "", "jobs": told})
            except BrokerError as exc:  # the jobs the log knows go by it; this instance by its start
                logger.warning(
                    "anarchon: when %d job(s) came to be was not kept in %s (%s): told again at the next start",
                    len(told),
                    self.name,
                    exc,
                )
        return {job: born(kept.get(job), None, at) for job, at in since.items()}

    def paused(self, job: str) -> bool:
        """Whether ``job`` is paused now, as this instance has read the log."""
        pause = self.view.pauses.get(job)
        return pause is not None and pause.in_effect(clock.now_ms())

    @property
    def following(self) -> bool:
        """Whether :attr:`view` has read the log (and follows it since)."""
        return self._read

    def version(self, job: str) -> int:
        """The version of the runtime job ``job`` as this instance has read it (0: none)."""
        kept = self.view.defs.get(job)
        return 0 if kept is None else kept.version

    def changes(self, since: Any) -> tuple[set[str] | None, Any]:
        """The runtime jobs changed since ``since`` as this instance has read the log (see
        :meth:`~..base.Backend.job_changes`): None while it has not read it yet."""
        if not self._read:
            return None, since
        end = len(self.view.changed)
        return (set() if since is None else set(self.view.changed[since:end])), end

    def change(self, record: dict[str, Any]) -> tuple[LogState, bool]:
        """Append a change of a runtime job (with an id of its own) and read the log back to its
        end: the state then, and whether the change was accepted."""
        record = {**record, "id": uuid.uuid4().hex}
        self.append(record)
        state = self.read()
        if record["id"] not in state.accepted:
            raise BrokerError(
                f"the change of job {record['job']!r} was kept in {self.name!r} but could not be read back"
            )
        return state, state.accepted[record["id"]]

    def close(self) -> None:
        """Stop following on a connection that stays open (the caller's)."""
        if self._channel is not None:
            with contextlib.suppress(Exception):
                self._channel.close()
        self._channel = None
