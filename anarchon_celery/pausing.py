"""Pause and resume a job, for every instance of a deployment at once, on every backend.

A paused job's runs are still decided, each by one instance, which records it ``paused`` (in
the job's history) rather than sending its task; the other instances lose it as ever. The pause
is kept where runs are decided: on Redis, PostgreSQL and SQLite the claim itself reads it (no run
is sent once the pause is written); on RabbitMQ it is appended to the deployment's control log,
which every instance follows (see :mod:`.backends.rabbitmq.control_log`). Resuming never sends
the runs due while the job was paused, whatever its catch-up policy; a pause with ``until``
ends by itself then. ``run_now`` and ``backfill`` still send a paused job's runs: they are
asked for by name.
"""

from __future__ import annotations

import getpass
import logging
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from . import clock
from .backends.base import Claim, Outcome
from .backends.pauses import Pause, check_note
from .backfilling import instant_ms
from .control import Deployment, configure
from .errors import ConfigError
from .history import encode_event
from .jobs import Job, task_id_for

__all__ = ["PausedRuns", "pause", "paused", "resume", "who"]

logger = logging.getLogger(__name__)


def who() -> str:
    """Who is pausing, by default: ``user@host``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # (no name for the uid, in a container)
        user = "?"
    return f"{user}@{socket.gethostname()}"


def pause(
    app: Any,
    job: str,
    *,
    note: str = "",
    until: Any = None,
    by: str | None = None,
    deployment: Deployment | None = None,
) -> Pause:
    """Pause ``job`` for every instance, from now until :func:`resume` (or until ``until``: a
    datetime, naive in the job's time zone, ISO 8601 text or epoch milliseconds, in the future).
    ``note`` says why, ``by`` who (by default ``user@host``). Pausing a paused job replaces its
    pause. Returns the pause kept. ConfigError for a job the app does not have; BrokerError when
    the backend cannot keep it (then nothing changed). A ``deployment`` given is the caller's to
    release."""
    own = deployment is None
    deployment = deployment or configure(app)
    try:
        spec = deployment.job(job)
        now = clock.now_ms()
        until_ms = None if until is None else instant_ms(until, spec.tz, "until")
        if until_ms is not None and until_ms <= now:
            raise ConfigError(f"job {job!r}: until must be in the future, and {until!r} is not")
        if by is not None and not isinstance(by, str):
            raise ConfigError(f"job {job!r}: by names who pauses it, as text, not {by!r}")
        author = " ".join((who() if by is None else by).split())[:200] or "?"
        kept = Pause(by=author, at_ms=now, note=check_note(note), until_ms=until_ms)
        deployment.backend.pause(spec.name, kept)
    finally:
        if own:
            deployment.release()
    logger.info("anarchon: job %r paused by %s", job, kept.by)
    return kept


def resume(app: Any, job: str, *, deployment: Deployment | None = None) -> Pause | None:
    """Resume ``job``: the pause ended, or None when it was not paused. The runs due while it
    was paused are not sent. ConfigError for a job the app does not have; BrokerError when the
    backend cannot be reached."""
    own = deployment is None
    deployment = deployment or configure(app)
    try:
        spec = deployment.job(job)
        return deployment.backend.resume(spec.name)
    finally:
        if own:
            deployment.release()


def paused(app: Any, *, deployment: Deployment | None = None) -> dict[str, Pause]:
    """The app's jobs paused now, with their pauses."""
    own = deployment is None
    deployment = deployment or configure(app)
    try:
        known = {*deployment.jobs, *deployment.runtime_defs()}
        return {name: p for name, p in deployment.backend.pauses().items() if name in known}
    finally:
        if own:
            deployment.release()


class PausedRuns:
    """The runs a scheduler decided while their job was paused, each both logged and recorded: one
    info line per job and claim call, naming every slot (a run sent is logged each time too), and a
    ``paused`` event per run in the job's history (none when its ``history_size`` is 0, as the line
    says). Used wherever a scheduler's claims are answered: its regular claims and its catch-up's."""

    def __init__(self, jobs: Mapping[str, Job], instance: str, prefix: str) -> None:
        self.jobs = jobs
        self.instance = instance
        self.prefix = prefix
        self._events: list[tuple[str, bytes, int]] = []

    def note(self, claims: Sequence[Claim], outcomes: Sequence[Outcome]) -> None:
        found: dict[str, list[int]] = {}
        for claim, outcome in zip(claims, outcomes):
            if outcome is Outcome.PAUSED and claim.job in self.jobs:
                found.setdefault(claim.job, []).append(claim.slot)
        for name, slots in found.items():
            job = self.jobs[name]
            logger.info(
                "anarchon: job %r %s %s: the job is paused; not sent (%s)",
                name,
                "slot" if len(slots) == 1 else "slots",
                ", ".join(str(slot) for slot in slots),
                "recorded paused" if job.history_size else "history_size is 0: not recorded",
            )
            if not job.history_size:
                continue
            at_ms = clock.now_ms()
            for slot in slots:
                run = task_id_for(self.prefix, name, slot)
                event = encode_event("paused", run=run, job=name, at_ms=at_ms, slot=slot, instance=self.instance)
                self._events.append((name, event, job.history_size))

    def events(self) -> list[tuple[str, bytes, int]]:
        """The history events noted since the last call."""
        events, self._events = self._events, []
        return events
