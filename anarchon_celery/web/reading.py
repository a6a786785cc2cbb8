"""What the schedules page shows, read from the app's deployment for one request: every job
with its state, or one job with its definition, next runs and recent runs.

Each read from the backend stands alone: one that fails (the store does not answer, a history
stream is refused) leaves its part of the page empty and says why in one line, and the rest is
shown. Once the backend did not answer, the reads after it are not tried (each would wait as
long again).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .. import clock
from ..backends.base import Backend
from ..backends.definitions import JobDef
from ..backends.pauses import Pause
from ..control import Deployment, configure, history
from ..errors import AnarchonError, BrokerUnavailable, ConfigError
from ..history import Run, fold
from ..jobs import Job
from ..pausing import paused
from .busy import Busy, busy_jobs

__all__ = ["JobRow", "JobView", "NoSuchJob", "Overview", "job_view", "opened", "overview"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: How many next runs a job's page lists.
NEXT_RUNS = 10
#: How many recent runs a job's page lists (never more than the job's ``history_size``).
RECENT_RUNS = 50


@contextlib.contextmanager
def opened(app: Any, shared: threading.Lock) -> Iterator[Deployment]:
    """The app's deployment for one request, whose connections are closed at its end.

    A backend instance that the app's settings hold is the process's, shared by every request:
    it is used by one request at a time (``shared``) and left open.
    """
    deployment = configure(app)
    if not isinstance(deployment.settings.backend, Backend):
        try:
            yield deployment
        finally:
            deployment.release()
        return
    with shared:
        yield deployment


class NoSuchJob(ConfigError):
    """The page of a job the app does not have (its message names the closest)."""


class Reads:
    """Reads from the backend, each failure kept as one line of what could not be read."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self._down = False

    def __call__(self, what: str, read: Callable[[], T]) -> T | None:
        """What ``read`` returns, or None when it failed (``what`` names it in the line kept)."""
        if self._down:
            return None
        try:
            return read()
        except AnarchonError as exc:
            self.problems.append(f"cannot read {what}: {exc}")
            self._down = isinstance(exc, BrokerUnavailable)
        except Exception as exc:  # noqa: BLE001 - the page is shown, saying what could not be read
            logger.warning("anarchon web: cannot read %s", what, exc_info=True)
            self.problems.append(f"cannot read {what}: {type(exc).__name__}: {exc}")
        return None


@dataclass(frozen=True)
class JobRow:
    """One job of the index: a job this app runs (``job``), or a runtime job it cannot
    (``invalid`` says why)."""

    name: str
    job: Job | None
    version: int = 0
    pause: Pause | None = None
    busy: Busy | None = None
    last: Run | None = None
    invalid: str | None = None


@dataclass(frozen=True)
class Overview:
    """Every job of the deployment, with its state, and what could not be read."""

    backend: str
    rows: list[JobRow]
    problems: list[str]
    now_ms: int


def overview(app: Any, deployment: Deployment) -> Overview:
    """Every job, as ``celery anarchon jobs`` lists them, and whether each is busy."""
    read = Reads()
    backend = deployment.backend
    runtime = read("the runtime jobs", deployment.runtime)
    invalid = deployment.invalid() if runtime is not None else {}  # (read with them)
    defs = deployment.runtime_defs() if runtime is not None else {}
    every: dict[str, Job] = {**deployment.jobs, **(runtime or {})}
    kept = sorted(name for name, job in every.items() if job.history_size)
    events = read("the history", lambda: backend.read_history(kept)) or {}
    pauses = read("the pauses", lambda: paused(app, deployment=deployment)) or {}
    guarded = [name for name, job in every.items() if job.overlap != "allow"]
    busy = read("which jobs are busy", lambda: busy_jobs(backend, guarded)) or {}
    rows = []
    for name, job in every.items():
        last = fold(events.get(name, []), 1)
        rows.append(JobRow(name, job, job.version, pauses.get(name), busy.get(name), last[0] if last else None))
    for name, why in invalid.items():
        rows.append(JobRow(name, None, defs[name].version if name in defs else 0, invalid=why))
    rows.sort(key=lambda row: row.name)
    return Overview(backend.describe(), rows, read.problems, clock.now_ms())


@dataclass(frozen=True)
class JobView:
    """One job's page: the job as this app runs it (None for a runtime job it cannot run, then
    ``invalid`` says why), its runtime definition (None for a job of the code), its next runs,
    its recent runs (None when it keeps no history), its pause and whether it is busy."""

    name: str
    backend: str
    job: Job | None
    definition: JobDef | None
    invalid: str | None = None
    next_slots: list[int] = field(default_factory=list)
    runs: list[Run] | None = None
    pause: Pause | None = None
    busy: Busy | None = None
    leases: bool = False
    problems: list[str] = field(default_factory=list)
    now_ms: int = 0


def job_view(app: Any, deployment: Deployment, name: str) -> JobView:
    """The page of job ``name``; NoSuchJob for a job the app does not have."""
    read = Reads()
    backend = deployment.backend
    job, kept, invalid = _the_job(read, deployment, name)
    now = clock.now_ms()
    if job is None:
        return JobView(name, backend.describe(), None, kept, invalid, leases=backend.leases, problems=read.problems)
    slots, slot = [], now
    for _ in range(NEXT_RUNS):
        slot = job.next_slot(slot)
        slots.append(slot)
    runs = None
    if job.history_size:
        runs = read("the history", lambda: history(app, name, RECENT_RUNS, deployment=deployment)) or []
    pause = read("the pause", lambda: paused(app, deployment=deployment).get(name))
    busy = None
    if job.overlap != "allow":
        busy = read("whether the job is busy", lambda: busy_jobs(backend, [name]).get(name))
    return JobView(
        name, backend.describe(), job, kept, None, slots, runs, pause, busy, backend.leases, read.problems, now
    )


def _the_job(read: Reads, deployment: Deployment, name: str) -> tuple[Job | None, JobDef | None, str | None]:
    """The job as this app runs it, its runtime definition, and why this app cannot run it."""
    if name in deployment.jobs:
        return deployment.jobs[name], None, None
    kept = read("the runtime jobs", lambda: deployment.backend.runtime_jobs([name]).get(name))
    if kept is None:
        if read.problems:  # not read: whether there is such a job is not known
            return None, None, None
        try:
            deployment.job(name)
        except ConfigError as exc:
            raise NoSuchJob(str(exc)) from None
    try:
        return deployment.job(name), kept, None
    except ConfigError as exc:
        return None, kept, str(exc)
