"""The runtime jobs of one beat instance (see :mod:`.runtime`): read at start, then followed. About
twice a second the instance asks the backend which runtime jobs changed since it last looked, reads
those only, and hands the scheduler the jobs to run from now on (``None``: no more), so that a
change is acted on job by job, never by reloading them all. Every ``anarchon_runtime_check_ms``
(30 s) it reads them all and compares the versions, in case a change was missed (a backend that
could not tell, a connection lost at the wrong moment, a change told and lost).

A runtime job this instance cannot run (its task not registered here, a job of the code with its
name) is reported once per version, loudly, and left to the instances that can.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from .backends import Backend
from .backends.definitions import JobDef
from .errors import AnarchonError, ConfigError
from .jobs import Job, runtime_job
from .settings import Settings

__all__ = ["CHANGES_POLL_S", "LiveJobs"]

logger = logging.getLogger(__name__)

#: Seconds between two looks for changes of runtime jobs.
CHANGES_POLL_S = 0.5


class LiveJobs:
    """What one instance runs of the runtime jobs kept in ``backend``."""

    def __init__(self, app: Any, settings: Settings, backend: Backend, code_jobs: Mapping[str, Job]) -> None:
        self.app, self.settings, self.backend = app, settings, backend
        #: Seconds between two reads of every runtime job, the fallback for a change missed.
        self.full_check_s = settings.runtime_check_ms / 1000
        self.code_jobs = set(code_jobs)
        #: The version of each runtime job known (run here or not), by name.
        self.versions: dict[str, int] = {}
        #: The runtime jobs run here, by name.
        self.running: set[str] = set()
        self._since: Any = None
        self._started = False
        self._looked = -CHANGES_POLL_S
        self._checked = 0.0
        self._told: dict[str, int] = {}  # the version of each job reported as not runnable here
        #: When each runtime job read at start was made, as its version kept says (epoch ms).
        self.made_at: dict[str, int] = {}

    def start(self) -> dict[str, Job]:
        """The runtime jobs this instance runs, read at start (changes are looked for from then on).
        None read when the backend cannot be reached: the next full check reads them."""
        _, self._since = self.backend.job_changes(None)  # (first: a change made meanwhile is read again)
        self._checked = time.monotonic()
        try:
            defs = self.backend.runtime_jobs()
        except AnarchonError as exc:
            logger.warning("anarchon: runtime jobs not read yet (%s); read again within %gs", exc, self.full_check_s)
            self._checked = -self.full_check_s
            return {}
        self._started = True
        changed, starts = self._apply(defs, set(defs))
        self.made_at = {name: starts[name] for name, job in changed.items() if job is not None and name in starts}
        return {name: job for name, job in changed.items() if job is not None}

    def wait_s(self) -> float:
        """How soon to look for changes again."""
        return max(0.0, self._looked + CHANGES_POLL_S - time.monotonic())

    def poll(self) -> tuple[dict[str, Job | None], dict[str, int]]:
        """The runtime jobs changed since the last look (at most once per :data:`CHANGES_POLL_S`):
        each one to run from now on (``None``: no more), and when each changed (the store's time,
        epoch milliseconds)."""
        now = time.monotonic()
        if now < self._looked + CHANGES_POLL_S or self.backend.in_outage():  # (the claims find its end)
            return {}, {}
        self._looked = now
        if self._since is None:  # the backend could not tell where changes were: from now on, all read
            _, self._since = self.backend.job_changes(None)
            if self._since is not None or now - self._checked >= self.full_check_s:
                return self._full_check(now)
            return {}, {}
        names, self._since = self.backend.job_changes(self._since)
        if names is None or now - self._checked >= self.full_check_s:
            return self._full_check(now)
        if not names:
            return {}, {}
        try:
            defs = self.backend.runtime_jobs(sorted(names))
        except AnarchonError as exc:
            logger.warning("anarchon: runtime jobs %s changed, not read yet (%s)", ", ".join(sorted(names)), exc)
            self._checked = -self.full_check_s  # (read them all at the next look)
            return {}, {}
        return self._apply(defs, names)

    def _full_check(self, now: float) -> tuple[dict[str, Job | None], dict[str, int]]:
        try:
            defs = self.backend.runtime_jobs()
        except AnarchonError as exc:
            logger.debug("anarchon: runtime jobs not checked (%s)", exc)
            return {}, {}
        self._checked = now
        differ = {name for name, kept in defs.items() if self.versions.get(name) != kept.version}
        differ |= {name for name in self.versions if name not in defs}
        if differ and self._started:
            logger.info("anarchon: runtime jobs changed and not told: %s", ", ".join(sorted(differ)))
        self._started = True
        return self._apply({name: defs[name] for name in differ if name in defs}, differ)

    def _apply(self, defs: Mapping[str, JobDef], names: set[str]) -> tuple[dict[str, Job | None], dict[str, int]]:
        """The jobs of ``names`` as ``defs`` now has them (one missing from ``defs`` is gone)."""
        changed: dict[str, Job | None] = {}
        starts: dict[str, int] = {}
        for name in sorted(names):
            kept = defs.get(name)
            if kept is None:
                if self.versions.pop(name, None) is not None and name in self.running:
                    self.running.discard(name)
                    changed[name] = None
                    logger.info("anarchon: runtime job %r removed: no run of it is claimed from now on", name)
                continue
            if self.versions.get(name) == kept.version:
                continue
            self.versions[name] = kept.version
            job = self._job(kept)
            if job is None:
                if name in self.running:
                    self.running.discard(name)
                    changed[name] = None
                continue
            logger.info(
                "anarchon: runtime job %r %s (version %d, by %s): %s",
                name,
                "changed" if name in self.running else "added",
                kept.version,
                kept.by or "?",
                job.schedule.describe(),
            )
            self.running.add(name)
            changed[name] = job
            starts[name] = kept.at_ms
        return changed, starts

    def _job(self, kept: JobDef) -> Job | None:
        """The job to run, or None (told once per version) when this instance cannot run it."""
        try:
            if kept.name in self.code_jobs:
                raise ConfigError("a job of the code has its name, and the code's is run")
            return runtime_job(kept.name, kept.version, kept.entry, self.app, self.settings, self.backend)
        except ConfigError as exc:
            if self._told.get(kept.name) != kept.version:
                self._told[kept.name] = kept.version
                logger.error(
                    "anarchon: runtime job %r (version %d) cannot be run by this instance: %s. Its runs are "
                    "left to the instances that can",
                    kept.name,
                    kept.version,
                    exc,
                )
            return None
