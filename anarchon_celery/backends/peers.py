"""Instances that define a job differently, found and reported.

Every instance computes its runs from its own configuration, so two instances that disagree on a
job (a rolling deploy that changes its time zone, an instance left on an old release) do not
race for the same runs: each wins its own, and the job runs on the union of both schedules. A
claim cannot tell, since each side's gates are its own. Instances that agree on the schedule but
not on the rest (the task, its arguments: two projects sharing a store and a prefix) do race for
the same runs, and each run is sent as its winner defines it: the others' are lost. So
instances tell each other how they define their jobs — a new instance announces its definitions,
and every instance that hears it answers with its own — and each warns, once per other instance
and job, with both definitions and what the difference does to the runs.
Pure: the transport (a fanout exchange on RabbitMQ) is the backend's.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from .. import docs

__all__ = ["Peers"]

logger = logging.getLogger(__name__)

SCHEMA = 1


class Peers:
    """This instance's job definitions, and what it has heard of the others'."""

    def __init__(self, instance: str, definitions: Mapping[str, Mapping[str, str]]) -> None:
        self.instance = instance
        self.definitions = {job: dict(fields) for job, fields in definitions.items()}
        self._warned: set[tuple[str, str]] = set()  # (instance, job) already reported
        #: Whether an announcement of ours is due (another instance just said hello).
        self.answer_due = False
        #: Disagreements found, as (other instance, job, what differs): for tests and `check`.
        self.found: list[tuple[str, str, str]] = []

    def announcement(self, *, hello: bool) -> bytes:
        """Our definitions; ``hello``: we are new here, and the others should answer."""
        return json.dumps(
            {"v": SCHEMA, "instance": self.instance, "hello": hello, "jobs": self.definitions},
            separators=(",", ":"),
        ).encode()

    def heard(self, body: bytes | str) -> None:
        """Take in another instance's announcement; never raises."""
        try:
            message = json.loads(body)
            other, jobs = message["instance"], message["jobs"]
            if message.get("v") != SCHEMA or not isinstance(other, str) or not isinstance(jobs, dict):
                return
        except (ValueError, TypeError, KeyError):
            return
        if other == self.instance:
            return
        if message.get("hello"):
            self.answer_due = True
        for job in sorted(set(jobs) | set(self.definitions)):
            mine, theirs = self.definitions.get(job), jobs.get(job)
            if mine == theirs or (other, job) in self._warned:
                continue
            self._warned.add((other, job))
            theirs = theirs if isinstance(theirs, dict) else None
            difference = _difference(mine, theirs)
            self.found.append((other, job, difference))
            logger.warning(
                "anarchon: job %r is defined differently by instance %s: %s. %s",
                job,
                other,
                difference,
                _consequence(mine, theirs),
            )


def _consequence(mine: Mapping[str, Any] | None, theirs: Mapping[str, Any] | None) -> str:
    """What a disagreement does to the job's runs, and what to do."""
    same = f"Give every instance the same configuration (see {docs.ROLLING_DEPLOYS})"
    if mine is None or theirs is None:
        return f"Only the instances that have the job run it. {same}"
    if mine.get("schedule") != theirs.get("schedule"):
        return (
            "Each instance decides the runs of its own schedule, so until they agree the job runs on "
            f"both schedules. {same}"
        )
    return (
        "Both decide the same runs and each run is sent by whichever wins it, as it defines the job: "
        "runs of this definition are lost to the other one's, and the other's to this one. If these "
        "are two projects, give each its own anarchon_prefix (or job names); else, " + same[0].lower() + same[1:]
    )


def _difference(mine: Mapping[str, Any] | None, theirs: Mapping[str, Any] | None) -> str:
    if mine is None:
        return "it runs it, and this instance has no such job"
    if theirs is None:
        return "it has no such job, and this instance runs it"
    fields = sorted(set(mine) | set(theirs), key=lambda key: (key != "schedule", key != "task", key))
    return "; ".join(
        f"{key} {mine.get(key, '(none)')} here, {theirs.get(key, '(none)')} there"
        for key in fields
        if mine.get(key) != theirs.get(key)
    )
