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
from dataclasses import dataclass
from typing import Any

from kombu import Connection
from kombu.utils.url import maybe_sanitize_url

from ...errors import ConfigError
from .link import check_server, refusal, text

__all__ = ["PARTITION_EVAL", "NodeAnswer", "check_partition_handling", "judge", "survey", "urls_of", "warn_about"]

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


def judge(answers: list[NodeAnswer]) -> tuple[list[str], list[str]]:
    """The errors (never safe to run with) and the warnings in ``answers``."""
    errors: list[str] = []
    warnings: list[str] = []
    working = [a for a in answers if a.problem is None]
    for answer in answers:
        if answer.problem is not None:
            warnings.append(f"RabbitMQ node {answer.url} {answer.problem}; the claims use the other nodes")
    if not working:
        return errors, warnings
    reference = working[0]
    for answer in working[1:]:
        if answer.cluster != reference.cluster:
            errors.append(
                f"RabbitMQ node {answer.url} is of cluster {answer.cluster!r}, and {reference.url} of "
                f"{reference.cluster!r}: a claim on one is not seen on the other, so a run could be won "
                "twice. List the nodes of one cluster only (in broker_url or anarchon_backend)"
            )
    versions = sorted({a.version[:2] for a in working})
    if len(versions) > 1:
        shown = ", ".join(f"{a.url} {a.shown_version}" for a in working)
        warnings.append(
            f"RabbitMQ nodes of different versions ({shown}): fine during an upgrade; claims hold on each "
            "version, but finish the upgrade"
        )
    if len(answers) > 1 and any(a.version < (4,) for a in working):
        warnings.append(
            "RabbitMQ 3.x cluster: exactly once across a network partition needs cluster_partition_handling "
            "= pause_minority (with the default, ignore, both sides of a partition can win the same run). "
            "A client cannot see the setting: `celery anarchon check --rabbitmqctl ...` reads it"
        )
    return errors, warnings


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


def warn_about(connection: Connection, timeout: float) -> None:
    """Survey the nodes of ``connection`` when there are several: log the warnings, and raise a
    ConfigError for a list that is never safe (nodes of two clusters)."""
    if len(urls_of(connection)) < 2:
        return
    errors, warnings = judge(survey(connection, timeout))
    for warning in warnings:
        logger.warning("anarchon: %s", warning)
    if errors:
        raise ConfigError("; ".join(errors))


def describe(answers: list[NodeAnswer]) -> list[dict[str, Any]]:
    """One entry per node, for `celery anarchon check`."""
    return [
        {
            "node": a.url,
            "ok": a.problem is None,
            "detail": a.problem or f"RabbitMQ {a.shown_version}, cluster {a.cluster!r}",
        }
        for a in answers
    ]
