"""``celery -A proj anarchon ...``: see and act on the app's schedules.

Registered through Celery's ``celery.commands`` entry point, so it runs with the app's own
configuration, after importing the app's task modules as ``celery beat`` does. Tables by default,
JSON with ``--json``; errors are one line and exit 1. Every connection a command opens is closed
before it returns.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import click

from . import clock, docs
from .backends import JobState, StreamHistory
from .backends.base import Finding, checked
from .backends.pauses import Pause
from .control import (
    Deployment,
    backfill,
    check_prefix_unshared,
    classic_task_queues_on_a_cluster,
    configure,
    delete_history_stream,
    history,
    history_job,
    history_streams,
    rabbitmq_backend,
    run_now,
)
from .errors import AnarchonError, BrokerError, clause
from .history import Run, fold
from .jobs import JOB_NAME_RE, Job
from .pausing import paused
from .schedule import from_ms, to_ms

__all__ = ["anarchon"]

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


#: A host whose clock is further than this from a lease store's is warned of by `check`.
CLOCK_WARNING_MS = 1_000


def _fail_cleanly(command: Callable[..., Any]) -> Callable[..., Any]:
    """Any error becomes one line on stderr and exit status 1: never a traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except click.exceptions.Exit:
            raise
        except click.ClickException:
            raise
        except AnarchonError as exc:
            raise click.ClickException(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - the command line shows one line, whatever it was
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from None

    return wrapper


#: Apps whose task modules this process has imported.
_IMPORTED: weakref.WeakSet[Any] = weakref.WeakSet()


def _app(ctx: click.Context) -> Any:
    """The app, with its task modules imported once, as ``celery beat`` and ``celery worker`` do
    (``imports``, ``include``, ``app.autodiscover_tasks()``): their ``@cron`` jobs and the tasks
    of ``beat_schedule`` are registered only then."""
    app = ctx.obj.app
    if app not in _IMPORTED:
        if not app.loader.worker_initialized:  # else beat or a worker of this process did it
            app.loader.import_default_modules()
        _IMPORTED.add(app)
    return app


@contextlib.contextmanager
def _deployment(ctx: click.Context) -> Iterator[Deployment]:
    """The app's deployment, whose connections are all closed when the command is done.

    ``Deployment.release`` leaves a backend instance held by the app's settings open, for the
    rest of a process that shares it: here the process ends with the command, so when the command
    is what connected it, the command closes it too (a kombu connection given to that instance
    included) rather than leave the broker to find the socket gone.
    """
    deployment = configure(_app(ctx))
    connection = getattr(deployment.backend, "connection", None)
    was_connected = connection is not None and connection.connected
    try:
        yield deployment
    finally:
        deployment.release()
        if connection is not None and not was_connected and connection.connected:
            deployment.backend.close()
            connection.release()


def _instant(text: str, tz: dt.tzinfo) -> int:
    """Epoch ms of an ISO 8601 time; one without an offset is a wall time of ``tz``."""
    try:
        when = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not an ISO 8601 time: write it as 2027-10-31T01:30, 2027-10-31 01:30:00 or 2027-10-30T23:30Z",
            param_hint="--after",
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=tz)  # a repeated wall time means its first occurrence (fold=0)
    return to_ms(when)


def _iso(ms: int | None, tz: dt.tzinfo = dt.timezone.utc) -> str | None:
    return None if ms is None else from_ms(ms).astimezone(tz).isoformat(timespec="seconds")


def _table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    cells = [[str(h) for h in headers]] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def _emit(as_json: bool, data: Any, rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> None:
    if as_json:
        click.echo(json.dumps(data, default=str))
    else:
        click.echo(_table(rows, headers) if rows else "(none)")


def _run_dict(run: Run) -> dict[str, Any]:
    data = run.as_dict()
    for key in ("sent_at_ms", "started_at_ms", "finished_at_ms", "slot"):
        data[key.replace("_ms", "")] = _iso(data[key])
    return data


def pause_dict(found: Pause | None, tz: Any) -> dict[str, Any] | None:
    """A pause as the commands' JSON shows it (times in the job's time zone)."""
    if found is None:
        return None
    return {"by": found.by, "at": _iso(found.at_ms, tz), "note": found.note, "until": _iso(found.until_ms, tz)}


@click.group(name="anarchon")
def anarchon() -> None:
    """anarchon_celery: the jobs, their history, manual runs, a config check and pruning."""


@anarchon.command()
@json_option
@click.pass_context
@_fail_cleanly
def jobs(ctx: click.Context, as_json: bool) -> None:
    """Every job, of the code and runtime ones: kind (code, or runtime with its version),
    schedule, time zone, state (active, or paused with by whom and why), next run, last run and
    its status. A runtime job this app cannot run is listed with why."""
    with _deployment(ctx) as deployment:
        every = {**deployment.jobs, **deployment.runtime()}
        events = deployment.backend.read_history(sorted(n for n, j in every.items() if j.history_size))
        pauses = paused(_app(ctx), deployment=deployment)
        invalid = deployment.invalid()
        defs = deployment.runtime_defs()
    now = clock.now_ms()
    data, rows = [], []
    for name, job in sorted(every.items()):
        last = fold(events.get(name, []), 1)
        next_slot = job.next_slot(now)
        pause = pauses.get(name)
        entry = {
            "job": name,
            "kind": "runtime" if job.version else "code",
            "version": job.version or None,
            "task": job.task,
            "schedule": job.schedule.display(),
            "tz": str(job.tz),
            "state": "paused" if pause else "active",
            "paused": pause_dict(pause, job.tz),
            "next_run": _iso(next_slot, job.tz),
            "next_run_utc": _iso(next_slot),
            "last_run": _run_dict(last[0]) if last else None,
        }
        data.append(entry)
        last_sent = _iso(last[0].sent_at_ms or last[0].started_at_ms, job.tz) if last else None
        state = f"paused by {pause.by}{': ' + pause.note if pause.note else ''}" if pause else "active"
        if pause and pause.until_ms is not None:
            state += f" (until {_iso(pause.until_ms, job.tz)})"
        kind = f"runtime v{job.version}" if job.version else "code"
        row = [name, kind, job.schedule.display(), str(job.tz), state, entry["next_run"], last_sent]
        rows.append([*row, last[0].status if last else None])
    for name, why in sorted(invalid.items()):
        data.append({"job": name, "kind": "runtime", "version": defs[name].version, "state": "invalid", "error": why})
        rows.append([name, f"runtime v{defs[name].version}", None, None, f"not runnable here: {why}", None, None, None])
    headers = ["JOB", "KIND", "SCHEDULE", "TZ", "STATE", "NEXT RUN", "LAST RUN", "STATUS"]
    _emit(as_json, data, rows, headers)


@anarchon.command(name="next")
@click.argument("job")
@click.option("-n", "count", type=click.IntRange(1, 1000), default=5, show_default=True, help="How many runs.")
@click.option(
    "--after",
    metavar="TIME",
    help="Start after this time instead of now: ISO 8601, such as 2027-10-31T01:30 (the job's time "
    "zone) or 2027-10-30T23:30Z (with its offset).",
)
@json_option
@click.pass_context
@_fail_cleanly
def next_runs(ctx: click.Context, job: str, count: int, after: str | None, as_json: bool) -> None:
    """The next N run times of JOB, local (the job's time zone) and UTC."""
    with _deployment(ctx) as deployment:
        spec: Job = deployment.job(job)
    slots, slot = [], clock.now_ms() if after is None else _instant(after, spec.tz)
    for _ in range(count):
        slot = spec.next_slot(slot)
        slots.append(slot)
    data = [{"slot": s, "local": _iso(s, spec.tz), "utc": _iso(s)} for s in slots]
    _emit(
        as_json, data, [[i + 1, d["local"], d["utc"]] for i, d in enumerate(data)], ["#", f"LOCAL ({spec.tz})", "UTC"]
    )


@anarchon.command(name="history")
@click.argument("job")
@click.option("-n", "count", type=click.IntRange(1, None), default=20, show_default=True, help="How many runs.")
@json_option
@click.pass_context
@_fail_cleanly
def history_command(ctx: click.Context, job: str, count: int, as_json: bool) -> None:
    """Recent runs of JOB, newest first: status, times, instance, worker, error. A run of
    catch-up shows how many missed runs it stands for (catch_up x5)."""
    with _deployment(ctx) as deployment:
        runs = history(_app(ctx), job, count, deployment=deployment)
        tz = deployment.job(job).tz
    rows = [
        [
            run.run_id,
            f"{run.trigger} x{run.coalesced}" if run.coalesced and run.coalesced > 1 else run.trigger,
            f"{run.status} ({run.reason})" if run.status == "skipped" else run.status,
            _iso(run.sent_at_ms, tz),
            _iso(run.started_at_ms, tz),
            _iso(run.finished_at_ms, tz),
            run.instance,
            run.worker,
            f"{run.error_type}: {run.error}" if run.error_type else None,
        ]
        for run in runs
    ]
    headers = ["RUN", "TRIGGER", "STATUS", "SENT", "STARTED", "FINISHED", "INSTANCE", "WORKER", "ERROR"]
    _emit(as_json, [_run_dict(run) for run in runs], rows, headers)


@anarchon.command(name="run-now")
@click.argument("job")
@json_option
@click.pass_context
@_fail_cleanly
def run_now_command(ctx: click.Context, job: str, as_json: bool) -> None:
    """Send JOB's task now, outside its schedule (recorded with trigger 'manual')."""
    with _deployment(ctx) as deployment:
        run = run_now(_app(ctx), job, deployment=deployment)
    if as_json:
        click.echo(json.dumps({"job": run.job, "run_id": run.run_id, "task_id": run.task_id}))
    else:
        click.echo(f"sent job {run.job}: run {run.run_id}, task {run.task_id}")


@anarchon.command(name="backfill")
@click.argument("job")
@click.option("--since", required=True, metavar="TIME", help="The first instant, ISO 8601 (in the job's time zone).")
@click.option("--until", required=True, metavar="TIME", help="The end (excluded), ISO 8601; not in the future.")
@click.option(
    "--rate", type=click.FloatRange(0, 1000, min_open=True), default=10.0, show_default=True, help="Runs a second."
)
@click.option("--dry-run", is_flag=True, help="Send nothing: list the runs that would be sent.")
@json_option
@click.pass_context
@_fail_cleanly
def backfill_command(
    ctx: click.Context, job: str, since: str, until: str, rate: float, dry_run: bool, as_json: bool
) -> None:
    """Send JOB's runs from --since to --until on purpose (trigger 'backfill'), whatever its
    catch-up policy: each once, however often it is asked for (Redis, PostgreSQL, SQLite)."""
    with _deployment(ctx) as deployment:
        report = backfill(_app(ctx), job, since, until, rate=rate, dry_run=dry_run, deployment=deployment)
        tz = deployment.job(job).tz
    if as_json:
        click.echo(json.dumps(report.as_dict()))
    else:
        verb = "would send" if dry_run else "sent"
        click.echo(
            f"job {report.job}: {verb} {len(report.sent)} run(s), {len(report.already)} backfilled already, "
            f"{len(report.failed)} failed"
        )
        for slot in report.sent:
            click.echo(f"  {verb} {_iso(slot, tz)}")
        for slot, error in report.failed:
            click.echo(f"  failed {_iso(slot, tz)}: {error}")
    if report.failed:
        ctx.exit(1)


@anarchon.command()
@click.option(
    "--rabbitmqctl",
    "rabbitmqctl",
    default=None,
    envvar="ANARCHON_RABBITMQCTL",
    metavar="COMMAND",
    help="How to run rabbitmqctl on a node of the cluster, to read its partition handling "
    "(or ANARCHON_RABBITMQCTL), e.g. 'ssh rabbit-1 sudo rabbitmqctl'.",
)
@json_option
@click.pass_context
@_fail_cleanly
def check(ctx: click.Context, rabbitmqctl: str | None, as_json: bool) -> None:
    """Check the configuration as the scheduler would, and the broker (every node of a cluster):
    exit 0 only if all is well."""
    deployments: list[Deployment] = []
    with contextlib.ExitStack() as opened:

        def config() -> Finding:
            deployments.append(opened.enter_context(_deployment(ctx)))
            jobs = len(deployments[0].jobs)
            return Finding("config", f"{jobs} job(s) valid: names, schedules, time zones, options, safety rule")

        findings = [checked("config", config)]
        for deployment in deployments:
            findings += _check_deployment(ctx.obj.app, deployment, rabbitmqctl)
    ok = all(finding.ok for finding in findings)
    if as_json:
        click.echo(json.dumps({"ok": ok, "checks": [finding.as_dict() for finding in findings]}))
    else:
        for finding in findings:
            status = "FAIL" if not finding.ok else "warn" if finding.warn else "ok  "
            where = f"{finding.node}: " if finding.node is not None else ""
            click.echo(f"{status}  {finding.check:<8} {where}{finding.detail}")
    if not ok:
        ctx.exit(1)


def _check_deployment(app: Any, deployment: Deployment, rabbitmqctl: str | None) -> list[Finding]:
    """The checks of a valid configuration: the nodes of a cluster, the backend (reached, runs
    decided, history kept) and the task queues of a cluster."""
    backend = deployment.backend
    findings = backend.survey_nodes(rabbitmqctl=rabbitmqctl)
    if any(finding.check == "nodes" and not finding.ok for finding in findings):
        return findings  # a list of nodes that is never safe: nothing else is worth asking
    reach, history = backend.check_names
    findings.append(checked(reach, backend.report_reach))
    if findings[-1].ok:
        findings.append(checked("claims", lambda: _claims(deployment)))
        findings.append(checked(history, backend.report_history))
    classic = classic_task_queues_on_a_cluster(app, deployment)
    if classic is not None:
        findings.append(_task_queues(classic))
    return findings


def _claims(deployment: Deployment) -> Finding:
    finding = deployment.backend.report_claims(list(deployment.jobs.values()))
    check_prefix_unshared(deployment)
    return finding


def _task_queues(classic: list[str]) -> Finding:
    if not classic:
        return Finding("tasks", "the task queues are replicated (quorum or stream): they outlive a node")
    return Finding(
        "tasks",
        f"task queue(s) {', '.join(classic)} are classic queues on a cluster: each lives on one node, and "
        "when that node is lost the beats' sends fail (404, its home node is down) and the workers "
        "consuming it exit. Declare them quorum queues: task_default_queue_type = 'quorum' (Celery 5.5), "
        f"or Queue(..., queue_arguments={{'x-queue-type': 'quorum'}}); see {docs.TASK_SIDE_OF_A_CLUSTER}",
        warn=True,
    )


@anarchon.command()
@click.pass_context
@_fail_cleanly
def schema(ctx: click.Context) -> None:
    """Print the SQL that makes the tables of the app's store (PostgreSQL, SQLite), for a DBA who
    makes them rather than grant CREATE to the backend's user. It connects to nothing."""
    with _deployment(ctx) as deployment:
        backend = deployment.backend
        ddl = getattr(backend, "schema_sql", None)
        if ddl is None:
            raise click.ClickException(f"{backend.describe()} keeps no tables: there is no SQL to run")
        click.echo(ddl().rstrip())


@anarchon.command(
    epilog="Examples: `celery -A proj anarchon prune` (on the broker's host), then `... prune --yes`; "
    "`... prune --rabbitmqctl 'ssh rabbit.internal sudo rabbitmqctl'`; `... prune old-report --yes`."
)
@click.argument("names", nargs=-1, metavar="[JOB|STREAM]...")
@click.option("--yes", is_flag=True, help="Delete the streams listed. Without it, prune only lists them.")
@click.option(
    "--rabbitmqctl",
    "rabbitmqctl",
    default="rabbitmqctl",
    show_default=True,
    envvar="ANARCHON_RABBITMQCTL",
    metavar="COMMAND",
    help="How to run rabbitmqctl to list the queues, when no JOB is given (or ANARCHON_RABBITMQCTL).",
)
@json_option
@click.pass_context
@_fail_cleanly
def prune(ctx: click.Context, names: tuple[str, ...], yes: bool, rabbitmqctl: str, as_json: bool) -> None:
    """Delete what jobs that are gone left behind: a dry run (a list) unless --yes.

    On Redis, PostgreSQL and SQLite: each removed job's cursor, run records and history under the
    deployment's prefix (JOB arguments name jobs; the --rabbitmqctl option is not used). On
    RabbitMQ, its history stream.

    A job's history is a stream <prefix><job>.history. Deleting a job's configuration leaves its
    stream, and its runs, on the broker; this finds those of the deployment's prefix whose job is
    not among the app's jobs.

    AMQP cannot list queues, so without arguments the candidates are the streams that
    `rabbitmqctl list_queues` shows in the backend's vhost: run prune where rabbitmqctl reaches
    the broker (its own host), or say how to run it, e.g. --rabbitmqctl 'ssh rabbit.internal sudo
    rabbitmqctl'. With arguments (job names, or stream names <prefix><job>.history) nothing is
    listed: each must be a job that is not configured, whose stream exists.

    Every stream is looked up, and deleted, over AMQP on the deployment's own connection. A
    configured job's stream is never deleted. Prune once every beat and worker runs the new
    configuration: one that still has the job makes its stream again. Queues of another
    deployment whose prefix starts with this one's look alike: read the list before --yes.
    """
    with _deployment(ctx) as deployment:
        state = deployment.backend.job_state
        if state is not None:
            _prune_store(deployment, state, names, yes, as_json)
            return
        streams = rabbitmq_backend(deployment)
        prefix = deployment.backend.prefix
        if names:
            jobs = sorted({_named_job(deployment, prefix, name) for name in names})
            found = history_streams(deployment, jobs)
            missing = [job for job in jobs if not found[job]]
            if missing:
                shown = ", ".join(f"{prefix}{job}.history" for job in missing)
                raise click.ClickException(f"no history stream {shown} on this broker: nothing pruned")
        else:
            listed = {history_job(prefix, queue) for queue in _listed_streams(streams, rabbitmqctl)}
            configured = deployment.names()
            found = history_streams(deployment, sorted(j for j in listed if j is not None and j not in configured))
            jobs = [job for job, exists in found.items() if exists]
            if len(jobs) < len(found):  # listed by rabbitmqctl, unknown here: another broker?
                click.echo(
                    f"note: {len(found) - len(jobs)} stream(s) that rabbitmqctl lists are not on "
                    f"{deployment.backend.describe()}: is rabbitmqctl reaching the same broker?",
                    err=True,
                )
        data = []
        for job in jobs:
            stream = delete_history_stream(deployment, job) if yes else f"{prefix}{job}.history"
            data.append({"job": job, "stream": stream, "deleted": yes})
    action = "deleted" if yes else "would delete (prune --yes)"
    _emit(as_json, data, [[d["job"], d["stream"], action] for d in data], ["JOB", "STREAM", "ACTION"])


def _prune_store(deployment: Deployment, state: JobState, names: tuple[str, ...], yes: bool, as_json: bool) -> None:
    """``prune`` on Redis, PostgreSQL or SQLite: the cursor, run records and history of jobs the
    app no longer has, under the deployment's prefix."""
    deployment.backend.open()
    stored = state.stored_jobs()
    if names:
        jobs = sorted(set(names))
        for job in jobs:
            if job in deployment.names():
                raise click.ClickException(f"job {job!r} is configured: its state is never pruned")
        missing = [job for job in jobs if job not in stored]
        if missing:
            raise click.ClickException(
                f"no state of job(s) {', '.join(map(repr, missing))} in {deployment.backend.describe()}: nothing pruned"
            )
    else:
        configured = deployment.names()
        jobs = [job for job in stored if job not in configured]
    data = []
    for job in jobs:
        if yes:
            state.forget_job(job)
        data.append({"job": job, "what": "cursor, run records, history", "deleted": yes})
    action = "deleted" if yes else "would delete (prune --yes)"
    _emit(as_json, data, [[d["job"], d["what"], action] for d in data], ["JOB", "STATE", "ACTION"])


def _named_job(deployment: Deployment, prefix: str, name: str) -> str:
    """The job a command-line name stands for: a job name, or its history stream's name."""
    job = name if JOB_NAME_RE.match(name) else history_job(prefix, name)
    if job is None:
        raise click.ClickException(
            f"{name!r} is neither a job name nor a history stream of prefix {prefix!r} ({prefix}<job>.history)"
        )
    if job in deployment.names():
        raise click.ClickException(f"job {job!r} is configured: its history stream is never pruned")
    return job


def _listed_streams(streams: StreamHistory, rabbitmqctl: str) -> list[str]:
    """The stream queues of the backend's vhost, as ``rabbitmqctl list_queues`` shows them (it
    leaves out queues too busy to answer: those wait for the next prune)."""
    try:
        return streams.listed_streams(rabbitmqctl)
    except BrokerError as exc:
        raise click.ClickException(
            f"cannot list the broker's queues: {clause(exc)}. Run prune on the broker's host, give --rabbitmqctl "
            "'ssh HOST sudo rabbitmqctl', or name the jobs: prune JOB..."
        ) from None


from . import cli_ops, cli_runtime, cli_web  # noqa: E402, F401 - their commands join the group
