"""What users call from Python (and the ``celery anarchon`` command): a deployment's jobs, their
history, running one now, and the history streams of jobs that are gone. Every function takes
the Celery app whose configuration the beat instances use, or its :class:`Deployment`."""

from __future__ import annotations

import difflib
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from . import clock, docs
from .backends import Backend, StreamHistory, backend_for
from .backends.definitions import JobDef
from .backends.rabbitmq import history_name
from .backfilling import BackfillReport, backfill_runs, instant_ms
from .errors import ConfigError
from .history import Run, encode_event, fold
from .jobs import JOB_NAME_RE, Job, claim_only, collect_jobs, runtime_job
from .sending import has_publisher_confirms, instance_id, send_run, task_connection
from .settings import LEASE_SETTINGS, LEGACY_PREFIX, Settings

__all__ = [
    "ManualRun",
    "backfill",
    "configure",
    "delete_history_stream",
    "history",
    "history_job",
    "history_streams",
    "last_run",
    "rabbitmq_backend",
    "run_now",
]


@dataclass(frozen=True)
class Deployment:
    """An app's settings, backend and jobs, as every beat instance of it sees them: ``jobs`` are
    those of the code; :meth:`job` finds the runtime jobs too (read from the backend)."""

    settings: Settings
    backend: Backend
    jobs: dict[str, Job]
    app: Any = None
    #: The runtime jobs as read from the backend, once asked for (:meth:`runtime`).
    _runtime: dict[str, Job] = field(default_factory=dict, compare=False, repr=False)
    _runtime_defs: dict[str, JobDef] = field(default_factory=dict, compare=False, repr=False)
    _invalid: dict[str, str] = field(default_factory=dict, compare=False, repr=False)
    _read: list[bool] = field(default_factory=list, compare=False, repr=False)
    _defs_read: list[bool] = field(default_factory=list, compare=False, repr=False)

    def runtime(self) -> dict[str, Job]:
        """The runtime jobs this app can run (read from the backend once; a job defined in code
        hides a runtime job of its name). Those it cannot are in :meth:`invalid`."""
        if not self._read and self.app is not None:
            self._read.append(True)
            for kept in self.runtime_defs().values():
                self._build(kept)
        return self._runtime

    def _build(self, kept: JobDef) -> Job | None:
        """``kept`` as this app runs it (None, with why in :meth:`invalid`, when it cannot)."""
        if kept.name in self.jobs:
            self._invalid[kept.name] = "a job of the code has its name"
            return None
        try:
            job = runtime_job(kept.name, kept.version, kept.entry, self.app, self.settings, self.backend)
        except ConfigError as exc:
            self._invalid[kept.name] = str(exc)
            return None
        self._runtime[kept.name] = job
        return job

    def runtime_defs(self) -> dict[str, JobDef]:
        """Every runtime job's definition (read from the backend once)."""
        if not self._defs_read:
            self._defs_read.append(True)
            self._runtime_defs.update(self.backend.runtime_jobs())
        return self._runtime_defs

    def names(self) -> set[str]:
        """Every job's name: of the code, and every runtime job kept (runnable here or not)."""
        return {*self.jobs, *self.runtime_defs()}

    def invalid(self) -> dict[str, str]:
        """The runtime jobs this app cannot run, with why (as read by :meth:`runtime`)."""
        self.runtime()
        return self._invalid

    def job(self, name: str) -> Job:
        """The job ``name``: of the code, or a runtime one (that one read); ConfigError for none."""
        if name in self.jobs:
            return self.jobs[name]
        if name in self._runtime:
            return self._runtime[name]
        if self.app is not None and name not in self._invalid:
            kept = self.backend.runtime_jobs([name]).get(name)
            job = self._build(kept) if kept is not None else None
            if job is not None:
                return job
        if name in self._invalid:
            raise ConfigError(f"runtime job {name!r} cannot be run by this app: {self._invalid[name]}")
        known = sorted({*self.jobs, *self.runtime()})
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"no job named {name!r}.{hint} Jobs: {', '.join(known) or 'none'}")

    def release(self) -> None:
        """Close the backend, unless it is an instance the app's settings hold (shared)."""
        if not isinstance(self.settings.backend, Backend):
            self.backend.close()


def configure(app: Any) -> Deployment:
    """Read and check the app's configuration as the scheduler does (no broker I/O)."""
    settings = Settings.from_app(app)
    backend = backend_for(app, settings)
    if not backend.leases:
        for key in LEASE_SETTINGS:
            if key in settings.given:
                raise ConfigError(f"{settings.name_of(key)} is not available: {claim_only(backend.title)}")
    jobs = collect_jobs(app, settings, backend)
    return Deployment(settings, backend, {job.name: job for job in jobs}, app)


def classic_task_queues_on_a_cluster(app: Any, deployment: Deployment) -> list[str] | None:
    """The app's task queues that are classic queues, when its tasks go to a RabbitMQ cluster
    (the task broker's URL lists several nodes, or the claims go to several); None when the tasks
    do not go to a cluster as far as the configuration tells. No I/O."""
    connection = app.connection_for_write()
    try:
        if not has_publisher_confirms(connection):
            return None  # not RabbitMQ
        nodes = len(connection.alt or ()) > 1
    finally:
        connection.release()
    backend = deployment.backend
    if not nodes and not backend.on_several_nodes:
        return None
    classic = []
    for name, queue in sorted(app.amqp.queues.items()):
        arguments = queue.queue_arguments or {}
        if arguments.get("x-queue-type", "classic") == "classic":
            classic.append(name)
    return classic


def check_prefix_unshared(deployment: Deployment) -> None:
    """ConfigError when the prefix is this release's default for the app and the backend keeps
    runs of the same jobs under ``cron.``, the default of earlier releases: an upgraded deployment
    (whose older instances decide there: both would send every run) or another project's jobs.
    Either way, naming the prefix decides. After :meth:`Backend.open`."""
    settings, backend = deployment.settings, deployment.backend
    if "prefix" in settings.given or isinstance(settings.backend, Backend) or backend.prefix == LEGACY_PREFIX:
        return
    found = backend.jobs_with_state(LEGACY_PREFIX, sorted(deployment.jobs))
    if found:
        shown = ", ".join(repr(job) for job in found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        raise ConfigError(
            f"{backend.describe()} keeps runs of job(s) {shown} under the prefix {LEGACY_PREFIX!r}, the default "
            f"of earlier releases, and this one's default for the app is {backend.prefix!r}. If they are this "
            f"deployment's, set anarchon_prefix = {LEGACY_PREFIX!r} for every beat and worker (instances on two "
            f"prefixes would each send every run); if another project's, set anarchon_prefix = {backend.prefix!r} "
            f"(see {docs.UPGRADING_FROM_CRON})"
        )


def history(app: Any, job: str, limit: int | None = None, *, deployment: Deployment | None = None) -> list[Run]:
    """The job's recent runs, newest first: at most ``limit``, never more than its
    ``history_size`` (none for a job with ``history_size`` 0, which keeps no history). A
    ``deployment`` given is the caller's to release."""
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


def run_now(app: Any, job: str, *, deployment: Deployment | None = None) -> ManualRun:
    """Send the job's task now, outside its schedule, as a run with trigger ``manual``.

    It gets its own run and task id, is recorded in the job's history like any other run (unless
    its ``history_size`` is 0), and involves no claim: each call sends once. A ``deployment``
    given is the caller's to release.
    """
    own = deployment is None
    deployment = deployment or configure(app)
    try:
        return _run_now(app, deployment, job)
    finally:
        if own:
            deployment.release()


def _run_now(app: Any, deployment: Deployment, job: str) -> ManualRun:
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
    return ManualRun(spec.name, run_id, run_id)


def backfill(
    app: Any,
    job: str,
    since: Any,
    until: Any,
    *,
    rate: float = 10.0,
    dry_run: bool = False,
    deployment: Deployment | None = None,
) -> BackfillReport:
    """Send the runs of ``job`` due from ``since`` (included) to ``until`` (excluded), on purpose,
    whatever its catch-up policy: at ``rate`` runs a second at most, each with trigger
    ``backfill``, and each once however often it is asked for (see
    :mod:`anarchon_celery.backfilling`). ``since`` and ``until`` are datetimes (naive ones in the
    job's time zone), ISO 8601 text or epoch milliseconds; ``until`` may not be in the future.
    ``dry_run`` sends nothing and says which runs would be sent. Redis, PostgreSQL and SQLite
    only. A ``deployment`` given is the caller's to release."""
    own = deployment is None
    deployment = deployment or configure(app)
    try:
        spec = deployment.job(job)
        start, end = instant_ms(since, spec.tz, "since"), instant_ms(until, spec.tz, "until")
        deployment.backend.open()
        return backfill_runs(app, deployment.backend, spec, start, end, rate=rate, dry_run=dry_run)
    finally:
        if own:
            deployment.release()


# -- history streams of jobs that are gone ------------------------------------------------------


def history_job(prefix: str, queue: str) -> str | None:
    """The job whose history stream ``queue`` would be under ``prefix``, or None."""
    suffix = history_name("", "")
    if not queue.startswith(prefix) or not queue.endswith(suffix):
        return None
    job = queue[len(prefix) : -len(suffix)]
    return job if JOB_NAME_RE.match(job) else None


def rabbitmq_backend(deployment: Deployment) -> StreamHistory:
    """The deployment's history streams: its backend must keep history in the broker's queues."""
    backend = deployment.backend
    streams = backend.stream_history
    if streams is None:
        raise ConfigError(f"history streams are RabbitMQ queues, and this deployment's backend is {backend.describe()}")
    return streams


def history_streams(deployment: Deployment, jobs: Iterable[str]) -> dict[str, bool]:
    """Whether each job's history stream exists on the deployment's broker (a passive declare on
    the backend's connection, which it opens)."""
    return rabbitmq_backend(deployment).history_streams(jobs)


def delete_history_stream(deployment: Deployment, job: str) -> str:
    """Delete the history stream of ``job``, a job the deployment does not have (which deletes
    that job's history), with queue.delete on the backend's connection; return its name."""
    if job in deployment.names():
        raise ConfigError(f"job {job!r} is configured: its history stream is never pruned")
    if not JOB_NAME_RE.match(job):
        raise ConfigError(f"{job!r} is not a job name")
    return rabbitmq_backend(deployment).delete_history_stream(job)
