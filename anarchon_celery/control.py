"""What users call from Python (and the ``celery anarchon`` command): a deployment's jobs, their
history, and running one now. Every function takes the Celery app whose configuration the
beat instances use."""

from __future__ import annotations

import difflib
import uuid
from dataclasses import dataclass
from typing import Any

from . import clock
from .backends import Backend, backend_for
from .errors import ConfigError
from .history import Run, encode_event, fold
from .jobs import Job, collect_jobs
from .sending import instance_id, send_run, task_connection
from .settings import Settings

__all__ = ["ManualRun", "configure", "history", "last_run", "run_now"]


@dataclass(frozen=True)
class Deployment:
    """An app's settings, backend and jobs, as every beat instance of it sees them."""

    settings: Settings
    backend: Backend
    jobs: dict[str, Job]

    def job(self, name: str) -> Job:
        try:
            return self.jobs[name]
        except KeyError:
            close = difflib.get_close_matches(name, sorted(self.jobs), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"no job named {name!r}.{hint} Jobs: {', '.join(sorted(self.jobs)) or 'none'}") from None

    def release(self) -> None:
        """Close the backend, unless it is an instance the app's settings hold (shared)."""
        if not isinstance(self.settings.backend, Backend):
            self.backend.close()


def configure(app: Any) -> Deployment:
    """Read and check the app's configuration as the scheduler does (no broker I/O)."""
    settings = Settings.from_app(app)
    backend = backend_for(app, settings)
    jobs = collect_jobs(app, settings, backend.prefix, backend.slot_ttl_ms)
    return Deployment(settings, backend, {job.name: job for job in jobs})


def history(app: Any, job: str, limit: int | None = None, *, deployment: Deployment | None = None) -> list[Run]:
    """The job's recent runs, newest first: at most ``limit``, never more than its
    ``history_size`` (none for a job with ``history_size`` 0, which keeps no history)."""
    own = deployment is None
    deployment = deployment or configure(app)
    try:
        spec = deployment.job(job)
        if not spec.history_size:
            return []
        events = deployment.backend.read_history([job])[job]
    finally:
        if own:
            deployment.release()
    cap = spec.history_size if limit is None else min(limit, spec.history_size)
    return fold(events, cap)


def last_run(app: Any, job: str) -> Run | None:
    """The job's most recent run, or None."""
    runs = history(app, job, 1)
    return runs[0] if runs else None


@dataclass(frozen=True)
class ManualRun:
    """A run sent by :func:`run_now`."""

    job: str
    run_id: str
    task_id: str


def run_now(app: Any, job: str) -> ManualRun:
    """Send the job's task now, outside its schedule, as a run with trigger ``manual``.

    It gets its own run and task id, is recorded in the job's history like any other run (unless
    its ``history_size`` is 0), and involves no claim: each call sends once.
    """
    deployment = configure(app)
    spec = deployment.job(job)
    backend = deployment.backend
    run_id = str(uuid.uuid4())
    now = clock.now_ms()
    connection = task_connection(app)
    try:
        backend.open()
        send_run(
            app,
            connection,
            spec,
            slot=now,
            task_id=run_id,
            run_id=run_id,
            trigger="manual",
            deadline_ms=now + spec.max_late_ms,
        )
        if spec.history_size:
            backend.record(
                spec.name,
                encode_event(
                    "sent",
                    run=run_id,
                    job=spec.name,
                    at_ms=now,
                    slot=now,
                    task_id=run_id,
                    task=spec.task,
                    instance=instance_id(),
                    trigger="manual",
                ),
                spec.history_size,
            )
    finally:
        connection.release()
        deployment.release()
    return ManualRun(spec.name, run_id, run_id)
