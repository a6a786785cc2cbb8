"""Every node given, asked once: which answer, their versions, that they are one cluster.

A claim is decided by the gate on one node of one cluster. Nodes of two clusters in one list
would let kombu's failover move an instance to a broker where the others' claims are not seen:
two winners. So a node of another cluster is refused, by name; a node that does not answer, or
refuses the login, is only reported (the claims use the others); nodes of different versions of
one cluster (an upgrade under way) are reported too.
"""

from __future__ import annotations

import logging
import re
import shlex
import subprocess
from dataclasses import dataclass

from kombu import Connection
from kombu.utils.url import maybe_sanitize_url

from ... import docs
from ...errors import BrokerError, ConfigError
from ..base import Finding, checked
from .link import check_server, refusal, text

__all__ = [
    "PARTITION_EVAL",
    "Judgement",
    "NodeAnswer",
    "check_partition_handling",
    "findings",
    "judge",
    "read_partition_handling",
    "survey",
    "urls_of",
    "warn_about",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeAnswer:
    """What one node said: its URL (password hidden), and its version and cluster, or what is
    wrong with it, with the fix."""

    url: str
    version: tuple[int, ...] = ()
    cluster: str | None = None
    problem: str | None = None

    @property
    def shown_version(self) -> str:
        return ".".join(map(str, self.version))


def urls_of(connection: Connection) -> list[str]:
    """The URLs of every node of ``connection`` (with passwords), the one in use first."""
    alt = [url for url in (connection.alt or []) if isinstance(url, str)]
    return alt or [connection.as_uri(include_password=True)]


def survey(connection: Connection, timeout: float) -> list[NodeAnswer]:
    """Connect to each node of ``connection`` once, with its settings, and note what it says."""
    answers = []
    for url in urls_of(connection):
        shown = maybe_sanitize_url(url)
        one = Connection(
            url,
            ssl=connection.ssl,
            login_method=connection.login_method,
            transport_options=connection.transport_options,
            connect_timeout=timeout,
            heartbeat=0,
        )
        try:
            one.ensure_connection(max_retries=1)
            properties = one.connection.server_properties or {}
            version = check_server(properties, shown)
            cluster = text(properties.get("cluster_name", "")) or None
            answers.append(NodeAnswer(shown, version, cluster))
        except Exception as exc:  # noqa: BLE001 - each node's failure is reported, never raised
            reason = refusal(exc, one)
            if reason is not None:
                problem = f"{reason} (for this node)"
            elif "RabbitMQBackend needs" in str(exc):
                problem = "is " + str(exc).split(" is ", 1)[-1]
            else:
                problem = (
                    f"does not answer ({type(exc).__name__}: {exc}): check that it runs and that its "
                    "address in the node list is right"
                )
            answers.append(NodeAnswer(shown, problem=problem))
        finally:
            try:
                one.release()
            except Exception:  # noqa: BLE001 - closing is best effort; the socket goes anyway
                one.collect()
    return answers


@dataclass(frozen=True)
class Judgement:
    """What the nodes' answers say together: errors (the list is never safe to run with), nodes
    that did not answer, nodes of different versions, and whether it is a 3.x cluster (whose
    partition handling decides whether a partition can let two sides win a run)."""

    errors: list[str]
    unanswered: list[str]
    versions: str | None = None
    partitions: str | None = None

    @property
    def warnings(self) -> list[str]:
        return [*self.unanswered, *(w for w in (self.versions, self.partitions) if w is not None)]


def judge(answers: list[NodeAnswer]) -> Judgement:
    """Judge the nodes' ``answers`` together."""
    working = [a for a in answers if a.problem is None]
    unanswered = [
        f"RabbitMQ node {a.url} {a.problem}; the claims use the other nodes" for a in answers if a.problem is not None
    ]
    if not working:
        return Judgement([], unanswered)
    reference = working[0]
    errors = [
        f"RabbitMQ node {answer.url} is of cluster {answer.cluster!r}, and {reference.url} of "
        f"{reference.cluster!r}: a claim on one is not seen on the other, so a run could be won "
        "twice. List the nodes of one cluster only (in broker_url or anarchon_backend)"
        for answer in working[1:]
        if answer.cluster != reference.cluster
    ]
    versions = None
    if len({a.version[:2] for a in working}) > 1:
        shown = ", ".join(f"{a.url} {a.shown_version}" for a in working)
        versions = (
            f"RabbitMQ nodes of different versions ({shown}): fine during an upgrade; claims hold on each "
            "version, but finish the upgrade"
        )
    partitions = None
    if len(answers) > 1 and any(a.version < (4,) for a in working):
        partitions = (
            "RabbitMQ 3.x cluster: exactly once across a network partition needs cluster_partition_handling "
            "= pause_minority (with the default, ignore, both sides of a partition can win the same run). "
            "A client cannot see the setting: `celery anarchon check --rabbitmqctl ...` reads it "
            f"(see {docs.NETWORK_PARTITIONS})"
        )
    return Judgement(errors, unanswered, versions, partitions)


#: What `rabbitmqctl eval` is given to read a node's partition handling, and whether Khepri holds
#: its metadata (RabbitMQ 4; on 3.x the second part is an error, not true).
PARTITION_EVAL = "{application:get_env(rabbit, cluster_partition_handling), catch rabbit_khepri:is_enabled()}."


def check_partition_handling(ctl_output: str) -> tuple[bool, str]:
    """Whether the partition handling that ``rabbitmqctl eval PARTITION_EVAL`` printed keeps runs
    exactly once, and why."""
    setting = re.search(r"\{ok,\s*\{?'?([a-z_]+)", ctl_output)
    mode = setting.group(1) if setting else "ignore"  # the default when it is not set
    khepri = bool(re.search(r",\s*true\s*\}\s*$", ctl_output.strip()))
    if khepri:
        return True, f"{mode}; metadata in Khepri (Raft): the minority side of a partition fails closed"
    if mode in ("pause_minority", "pause_if_all_down"):
        return True, f"{mode}: the minority side of a partition pauses, so only one side can win a run"
    return False, (
        f"{mode}: both sides of a network partition can win the same run (measured with ignore on 3.10). "
        "Set cluster_partition_handling = pause_minority in rabbitmq.conf on every node"
    )


def read_partition_handling(rabbitmqctl: str | None, version: tuple[int, ...]) -> Finding:
    """The cluster's partition handling, read with ``rabbitmqctl`` (a command line) when given;
    a warning that it was not read otherwise. Raises BrokerError when it is unsafe or unreadable."""
    if rabbitmqctl is None:
        needs = "pause_minority (3.x; with ignore or autoheal both sides of a partition can win a run)"
        return Finding(
            "partition",
            f"not read (a client cannot see it): give --rabbitmqctl to read it. Exactly once across a "
            f"network partition needs {needs if version < (4,) else 'Khepri, or pause_minority'}",
            warn=True,
        )
    command = [*shlex.split(rabbitmqctl), "eval", PARTITION_EVAL]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise BrokerError(f"cannot run {rabbitmqctl} ({type(exc).__name__}: {exc})") from None
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise BrokerError(f"{rabbitmqctl} eval failed: {lines[-1] if lines else done.returncode}")
    ok, detail = check_partition_handling(done.stdout)
    if not ok:
        raise BrokerError(detail)
    return Finding("partition", detail)


def findings(connection: Connection, timeout: float, rabbitmqctl: str | None) -> list[Finding]:
    """For ``celery anarchon check``: one finding per node of ``connection`` when it lists
    several, the errors of the list (check ``nodes``, failed), a warning for nodes of different
    versions, and the cluster's partition handling."""
    if len(urls_of(connection)) < 2:
        return []
    answers = survey(connection, timeout)
    found = [
        Finding(
            "node", a.problem or f"RabbitMQ {a.shown_version}, cluster {a.cluster!r}", ok=a.problem is None, node=a.url
        )
        for a in answers
    ]
    judgement = judge(answers)
    found += [Finding("nodes", error, ok=False) for error in judgement.errors]
    if judgement.versions is not None:  # (the 3.x cluster's warning is the partition line's to give)
        found.append(Finding("nodes", judgement.versions, warn=True))
    working = [a for a in answers if a.problem is None]
    if not judgement.errors and working:
        found.append(checked("partition", lambda: read_partition_handling(rabbitmqctl, working[0].version)))
    return found


def warn_about(connection: Connection, timeout: float) -> None:
    """Survey the nodes of ``connection`` when there are several: log the warnings, and raise a
    ConfigError for a list that is never safe (nodes of two clusters)."""
    if len(urls_of(connection)) < 2:
        return
    judgement = judge(survey(connection, timeout))
    for warning in judgement.warnings:
        logger.warning("anarchon: %s", warning)
    if judgement.errors:
        raise ConfigError("; ".join(judgement.errors))
