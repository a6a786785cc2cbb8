"""RabbitMQBackend: the Backend contract on RabbitMQ, composed of the package's parts."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shlex
import subprocess
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import amqp
from kombu import Connection

from ... import docs
from ...connections import keep_alive, negotiated_heartbeat
from ...errors import BrokerError, BrokerRefused, BrokerUnavailable, ConfigError
from ...jobs import Job, live_gates
from ..base import Backend, Claim, Finding, Outcome, StreamHistory, check_prefix, check_slot_ttl
from . import survey
from .ahead import DeclaresAhead
from .claims import Claimer
from .control_log import ControlLog
from .controlled import ControlLogged
from .gates import PROBE_S, declare_gates, gates_away
from .link import (
    AMQP_SCHEMES,
    DEFAULT_CONFIRM_TIMEOUT,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_HEARTBEAT,
    Link,
    app_connection_options,
    node_urls,
    own_connection_options,
    text,
)
from .names import LONGEST_SUFFIX, MAX_QUEUE_NAME, gate_arguments, gate_name, history_name
from .sharing import Sharing
from .streams import Streams

logger = logging.getLogger(__name__)


class RabbitMQBackend(ControlLogged, Backend, StreamHistory):
    """Claims runs in RabbitMQ (3.9 or newer) with gate queues and publisher confirms.

    Arguments:
        url: AMQP URL of the broker (``amqp://user:password@host:5672/vhost``), or the URLs of
            the nodes of a cluster, as a list or joined by ``;`` as in Celery's ``broker_url``:
            the connections move to the next node by themselves when theirs goes.
        connection: your own :class:`kombu.Connection`. You keep ownership: it is never closed
            here (a broken one is revived, as kombu does). Give it a ``read_timeout`` transport
            option, or a broker that stops answering can hold a claim up.
        prefix: prefix of every queue name.
        slot_ttl_ms: how long RabbitMQ remembers that a run was taken (each gate's
            ``x-expires``). A job's ``jitter_ms + max_late_ms`` must be shorter.
        confirm_timeout: seconds to wait for any answer of the broker (a declare, a claim's
            confirm) before treating the claim as not won.
        heartbeat: AMQP heartbeat of the backend's own connection, in seconds (0: none). From
            the app's settings, it is ``broker_heartbeat``.
        connect_timeout: seconds one connection attempt may take. From the app's settings, it is
            ``broker_connection_timeout``.
        failover_strategy: the order in which the nodes of ``url`` are tried, as kombu's
            (``round-robin``, ``shuffle``, or an iterator factory). From the app's settings, it is
            ``broker_failover_strategy``.
        ssl: as kombu's ``Connection(ssl=...)``.
    """

    title = "the RabbitMQ backend"
    check_names = ("broker", "streams")

    def __init__(
        self,
        url: str | Sequence[str] = "amqp://localhost",
        connection: Connection | None = None,
        prefix: str = "cron.",
        slot_ttl_ms: int = 300_000,
        *,
        confirm_timeout: float = DEFAULT_CONFIRM_TIMEOUT,
        heartbeat: float = DEFAULT_HEARTBEAT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        failover_strategy: Any = "round-robin",
        ssl: Any = None,
    ) -> None:
        self.prefix = check_prefix(prefix)
        self.slot_ttl_ms = check_slot_ttl(slot_ttl_ms)
        if (
            isinstance(confirm_timeout, bool)
            or not isinstance(confirm_timeout, (int, float))
            or not 0 < confirm_timeout <= 300
        ):
            raise ConfigError(f"confirm_timeout must be seconds in (0, 300], not {confirm_timeout!r}")
        self.confirm_timeout = float(confirm_timeout)
        owned = connection is None
        if connection is None:
            connection = Connection(
                ";".join(node_urls(url)),
                heartbeat=heartbeat,
                ssl=ssl,
                connect_timeout=connect_timeout,
                failover_strategy=failover_strategy,
                **own_connection_options(self.confirm_timeout),
            )
        elif not isinstance(connection, Connection):
            raise ConfigError(f"connection must be a kombu Connection, not {type(connection).__name__}")
        elif connection.transport_cls not in AMQP_SCHEMES:
            raise ConfigError(f"RabbitMQBackend needs an AMQP connection, not {connection.transport_cls!r}")
        self.link = Link(connection, owned=owned, confirm_timeout=self.confirm_timeout)
        self._ahead = DeclaresAhead(self.link, self.slot_ttl_ms)
        # The subclass hook _declare_gates (tests use it to lose gates) is the claims' declarer.
        self._claimer = Claimer(
            self.link,
            self.prefix,
            self._ahead,
            self._declare_gates,
            lambda gates: gates_away(self.link, gates),
            lambda gates: declare_gates(
                self.link, gates, self.slot_ttl_ms, timeout=min(PROBE_S, self.confirm_timeout), apart=True, quiet=True
            ),
        )
        self._streams = Streams(self.link, self.prefix)
        self._sharing = Sharing(self.link, self.prefix)
        self._control = ControlLog(self.link, self.prefix)

    @classmethod
    def from_app(cls, app: Any, *, prefix: str = "cron.", slot_ttl_ms: int = 300_000) -> RabbitMQBackend:
        """A backend on the app's broker, with a connection of its own built from every
        ``broker_*`` setting (failover URLs, TLS, login method, transport options)."""
        connection = app.connection_for_write(
            **app_connection_options(app), **own_connection_options(DEFAULT_CONFIRM_TIMEOUT)
        )
        backend = cls(connection=connection, prefix=prefix, slot_ttl_ms=slot_ttl_ms)
        backend.link.owned = True
        return backend

    @property
    def connection(self) -> Connection:
        """The kombu connection of the claims and the history."""
        return self.link.connection

    @property
    def server_version(self) -> tuple[int, ...]:
        """The version of the RabbitMQ connected to (empty before it is reached)."""
        return self.link.server_version

    @property
    def claim_retries(self) -> int:
        """How many times a claim left without an answer is made again (see :meth:`claim`)."""
        return self._claimer.retries

    @claim_retries.setter
    def claim_retries(self, value: int) -> None:
        self._claimer.retries = value

    # -- lifecycle ----------------------------------------------------------------------------

    def open(self) -> None:
        self.link.open()

    def close(self) -> None:
        if not self.link.owned:
            self._sharing.close()
            self._control.close()
        self.link.close()
        self._ahead.close()

    def abandon(self) -> None:
        self.link.opened = False
        self.link.discard(connection_lost=True)
        self._ahead.close(broken=True)

    forgets_text = "after a gate expires, RabbitMQ forgets"

    @property
    def on_several_nodes(self) -> bool:  # type: ignore[override]
        return self.link.several_nodes

    def history_streams(self, jobs: Iterable[str]) -> dict[str, bool]:
        """Whether each job's history stream exists: a passive declare each, on this backend's
        connection (which it opens)."""
        self.open()
        connection = self.connection
        found: dict[str, bool] = {}
        try:
            channel = connection.connection.channel()
            for job in jobs:
                try:
                    channel.queue_declare(history_name(self.prefix, job), passive=True)
                    found[job] = True
                except amqp.exceptions.NotFound:  # closes the channel
                    found[job] = False
                    channel = connection.connection.channel()
            channel.close()
        except connection.connection_errors + connection.channel_errors + (OSError,) as exc:
            raise BrokerError(f"cannot look up history streams at {connection.as_uri()}: {exc}") from exc
        return found

    def listed_streams(self, rabbitmqctl: str) -> list[str]:
        vhost = self.connection.virtual_host or "/"
        command = [*shlex.split(rabbitmqctl), "-q", "list_queues", "-p", vhost, "--formatter", "json", "name", "type"]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120, check=False
            )
            if done.returncode != 0:
                lines = (done.stderr or done.stdout).strip().splitlines()
                raise RuntimeError(f"exit status {done.returncode}: {lines[-1] if lines else 'no output'}")
            rows = json.loads(done.stdout or "[]")
            return [row["name"] for row in rows if row.get("type") == "stream"]
        except Exception as exc:  # noqa: BLE001 - not found, refused, timed out, unreadable: one line
            raise BrokerError(f"{rabbitmqctl} failed ({type(exc).__name__}: {exc})") from None

    def delete_history_stream(self, job: str) -> str:
        name = history_name(self.prefix, job)
        self.open()
        connection = self.connection
        try:
            channel = connection.connection.channel()
            channel.queue_delete(name)
            channel.close()
        except connection.connection_errors + connection.channel_errors + (OSError,) as exc:
            raise BrokerError(f"cannot delete {name} at {connection.as_uri()}: {exc}") from exc
        return name

    def check_job(self, job: Job, lead_ms: int = 0) -> None:
        """A job's queue names must fit RabbitMQ's limit; and the seed's safety rule."""
        longest = len(f"{self.prefix}{job.name}{LONGEST_SUFFIX}".encode())
        if longest > MAX_QUEUE_NAME:
            raise ConfigError(
                f"job {job.name!r}: the name is too long: its queue names would reach {longest} bytes with "
                f"prefix {self.prefix!r}, and RabbitMQ takes {MAX_QUEUE_NAME}. Shorten the job name or the prefix"
            )
        super().check_job(job, lead_ms)

    def survey_nodes(self, *, rabbitmqctl: str | None = None) -> list[Finding]:
        """Every node of a cluster's list, asked once (see :mod:`.survey`); nothing for one node."""
        return survey.findings(self.connection, min(self.connection.connect_timeout or 5.0, 5.0), rabbitmqctl)

    def report_reach(self) -> Finding:
        self.open()
        return Finding("broker", f"{self.describe()}: RabbitMQ {'.'.join(map(str, self.server_version))}")

    def report_claims(self, jobs: Sequence[Job]) -> Finding:
        self.check_claims()
        return Finding("claims", "a gate can be declared, claimed and deleted under the prefix (permissions)")

    def report_history(self) -> Finding:
        self.check_history()
        return Finding("streams", "history streams can be created")

    #: Above this many broker files for the jobs' live queues (one per gate, see
    #: :func:`~anarchon_celery.jobs.live_gates`, two per history stream), a warning at start
    #: names RabbitMQ's open-file limit.
    files_warning = 500

    def job_warnings(self, jobs: Sequence[Job], now_ms: int) -> list[str]:
        """Jobs that keep more queues alive than RabbitMQ may hold files for."""
        gates = live_gates(jobs, self.slot_ttl_ms, now_ms)
        streams = sum(1 for job in jobs if job.history_size)
        if gates + 2 * streams <= self.files_warning:
            return []
        return [
            f"these jobs keep up to about {gates} gate queues (slot_ttl_ms {self.slot_ttl_ms}) and {streams} "
            "history streams alive at once. RabbitMQ holds about one file per gate while it recovers them "
            "after a restart, and two per stream; RabbitMQ 3.10 hangs when they outnumber its open-file "
            f"limit (1,024 in some packages). Raise that limit well above {gates + 2 * streams} (LimitNOFILE), "
            f"lower anarchon_slot_ttl_ms, or set history_size 0 where history is not needed (see {docs.FILE_LIMITS})"
        ]

    def describe(self) -> str:
        return f"rabbitmq {self.connection.as_uri()} (prefix {self.prefix!r}, slot_ttl_ms {self.slot_ttl_ms})"

    def place(self) -> str | None:
        """The cluster's name (the same from every node) and the vhost: not the URL's host."""
        if not self.link.opened or not self.connection.connected:  # (.connection would connect)
            return None
        try:
            properties = self.connection.connection.server_properties or {}
        except Exception:  # noqa: BLE001 - no connection now: told later
            return None
        cluster = text(properties.get("cluster_name", b"?"))
        return f"RabbitMQ cluster {cluster!r}, vhost {self.connection.virtual_host!r}, prefix {self.prefix!r}"

    def max_idle_s(self) -> float | None:
        heartbeat = negotiated_heartbeat(self.connection)
        return max(1.0, heartbeat / 3) if heartbeat else None

    def maintain(self) -> None:
        if not self.link.opened:
            return
        self.await_prepared()
        try:
            keep_alive(self.connection)  # reads the other instances' announcements (and pauses) too
            self._sharing.keep()
            self._control.follow()
        except amqp.exceptions.ChannelError as exc:
            logger.info("anarchon: a channel was closed by RabbitMQ while idle (%s)", exc)
            self.link.forget_declarer()
            self._streams.forget()
        except self.link.errors() as exc:
            logger.info("anarchon: the connection to RabbitMQ dropped while idle (%s); it will be replaced", exc)
            self.link.discard(connection_lost=True)

    def in_outage(self) -> bool:
        return self.link.in_outage()

    def missed(self, job: str, slots: Sequence[int]) -> None:
        self.link.missed(job, slots)

    def share_definitions(self, instance: str, definitions: Mapping[str, Mapping[str, str]]) -> None:
        """See :meth:`Backend.share_definitions` and :mod:`.sharing`; the scheduler calls it at
        start, and from then on the instance follows the pauses (:mod:`.control_log`)."""
        self._sharing.start(instance, definitions)
        self._control.follow()

    # -- the claim ----------------------------------------------------------------------------

    def prepare(self, claims: Sequence[Claim]) -> None:
        """Declare the gates of runs due shortly, so that their claims are only a publish. A gate
        counts its ``x-expires`` from this declaration: the scheduler's lead is part of the safety
        rule. The declares go out on a connection of their own and are not waited for (see
        :mod:`.ahead`): they never hold a claim up. Best effort: a gate not made here, or not
        answered yet, is declared by its claim."""
        if not claims or self.link.in_outage():
            return  # while RabbitMQ is away, the claims alone try to reach it (bounded by deadlines)
        self._ahead.prepare([gate_name(self.prefix, claim.job, claim.slot) for claim in claims])

    def await_prepared(self, timeout: float = 0) -> None:
        """Take in the broker's answers to the declares of :meth:`prepare`, waiting at most
        ``timeout`` seconds for them all (0: only those already here)."""
        self._ahead.collect(timeout)

    def claim(
        self, claims: Sequence[Claim], instance: str, *, on_won: Callable[[Claim], None] | None = None
    ) -> list[Outcome]:
        """Claim runs; see :meth:`Backend.claim`.

        Reconnecting is bounded by the claims' deadlines; a claim is never published after its
        deadline, and its answer is awaited at most ``confirm_timeout`` seconds.

        A claim left without an answer (connection lost, confirm timeout) is made again on a new
        connection while its deadline allows. That can never make a second winner: the broker
        acks at most one publish per gate. If our first publish did arrive, the gate is held and
        the new one is nacked (the run is then lost, never doubled); if it did not, the gate is
        still empty and the run is won a little late instead of lost.
        """
        control = self._control
        control.follow(read=False)  # (again on a new connection; read first at start or when idle)
        paused: dict[tuple[str, int], bool] = {}  # (once looked at, a run's answer stays)

        def is_paused(claim: Claim) -> bool:
            key = (claim.job, claim.slot)
            if key not in paused:
                paused[key] = control.paused(claim.job)
            return paused[key]

        def is_stale(claim: Claim) -> bool:  # (the instance read a change since it planned the claim)
            return bool(claim.version) and control.version(claim.job) != claim.version

        stale = {(claim.job, claim.slot) for claim in claims if is_stale(claim)}
        live = [claim for claim in claims if (claim.job, claim.slot) not in stale]

        def won(claim: Claim) -> None:
            if on_won is not None and not is_paused(claim):
                on_won(claim)

        outcomes = dict(zip(live, self._claimer.claim(live, instance, on_won=won) if live else []))
        return [
            Outcome.STALE
            if claim not in outcomes
            else Outcome.PAUSED
            if outcomes[claim] is Outcome.WON and is_paused(claim)
            else outcomes[claim]
            for claim in claims
        ]

    def _declare_gates(self, gates: list[str]) -> list[Outcome | None]:
        """Declare the gates of the runs being claimed (see :func:`.gates.declare_gates`)."""
        return declare_gates(self.link, gates, self.slot_ttl_ms)

    def check_claims(self) -> None:
        """Declare a gate, claim it and delete it, under the prefix: BrokerRefused, naming the
        permissions to give, when the user may not (configure, write, read on the prefix's names)."""
        name = f"{self.prefix}anarchon-check.{uuid.uuid4().hex[:12]}.slot.0"
        arguments = dict(gate_arguments(self.slot_ttl_ms), **{"x-expires": 60_000})  # gone soon, whatever happens
        try:
            raw = self.link.connect(self.confirm_timeout)
            channel = raw.channel()
            try:
                channel.queue_declare(name, durable=True, auto_delete=False, arguments=arguments)
                channel.basic_publish_confirm(
                    amqp.Message(b"{}", delivery_mode=2),
                    exchange="",
                    routing_key=name,
                    mandatory=True,
                    confirm_timeout=self.confirm_timeout,
                )
                channel.queue_delete(name)
            finally:
                with contextlib.suppress(Exception):
                    channel.close()
        except amqp.exceptions.AccessRefused as exc:
            user, vhost, pattern = self.connection.userid, self.connection.virtual_host, f"^{re.escape(self.prefix)}"
            raise BrokerRefused(
                f"RabbitMQ at {self.connection.as_uri()} refuses user {user!r} the gate queues named "
                f"{self.prefix}* ({text(exc.reply_text)}): claims need configure, write and read permissions "
                f"on them and write on amq.default, e.g. rabbitmqctl set_permissions -p {vhost} {user} "
                f"'{pattern}' '{pattern}|^amq\\.default$' '{pattern}'"
            ) from exc
        except self.link.errors() as exc:
            self.link.discard(connection_lost=True)
            raise BrokerUnavailable(f"cannot check the claims on {self.connection.as_uri()}: {exc}") from exc

    def jobs_with_state(self, prefix: str, jobs: Sequence[str]) -> list[str]:
        """The jobs with a history stream under ``prefix`` (a passive declare each)."""
        found = []
        try:
            raw = self.link.connect(self.confirm_timeout)
            channel = raw.channel()
            try:
                for job in jobs:
                    try:
                        channel.queue_declare(history_name(prefix, job), passive=True)
                        found.append(job)
                    except amqp.exceptions.NotFound:  # closes the channel
                        channel = raw.channel()
            finally:
                with contextlib.suppress(Exception):
                    channel.close()
        except self.link.errors() as exc:
            self.link.discard(connection_lost=True)
            raise BrokerUnavailable(f"cannot look up history streams on {self.connection.as_uri()}: {exc}") from exc
        return found

    # -- history ------------------------------------------------------------------------------

    def record(self, job: str, event: bytes, history_size: int) -> bool:
        return self._streams.record(job, event, history_size)

    def record_many(self, events: Sequence[tuple[str, bytes, int]]) -> int:
        """See :meth:`Backend.record_many` and :meth:`.streams.Streams.record_many`."""
        if len(events) < 2:
            return super().record_many(events)
        return self._streams.record_many(events)

    def ensure_history(self, job: str, history_size: int) -> bool:
        return self._streams.ensure(job, history_size)

    def read_history(self, jobs: Sequence[str], empty_s: float = 0.5) -> dict[str, list[dict[str, Any]]]:
        """See :meth:`Backend.read_history`.

        Streams have no end marker in AMQP 0.9.1, and a pause in a busy broker's deliveries must
        not pass for the end: so each stream is also consumed from its last chunk (offset
        ``last``), whose offsets tell where its end is, and read from its first retained event up
        to there. A stream from which nothing at all arrives within ``empty_s`` seconds is empty.
        A read that stops moving for ``confirm_timeout`` raises BrokerError rather than return a
        history cut short.
        """
        return self._streams.read(jobs, empty_s)

    def check_history(self) -> None:
        self._streams.check()
