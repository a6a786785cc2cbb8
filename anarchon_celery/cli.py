"""``celery -A proj anarchon ...``: see and act on the app's schedules.

Registered through Celery's ``celery.commands`` entry point, so it runs with the app's own
configuration. Tables by default, JSON with ``--json``; errors are one line and exit 1.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Callable, Sequence
from typing import Any

import click

from . import clock
from .control import Deployment, configure, history, run_now
from .errors import AnarchonError
from .history import Run, fold
from .jobs import Job
from .schedule import from_ms

__all__ = ["anarchon"]

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


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


def _app(ctx: click.Context) -> Any:
    return ctx.obj.app


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


@click.group(name="anarchon")
def anarchon() -> None:
    """anarchon_celery: the jobs, their history, manual runs and a config check."""


@anarchon.command()
@json_option
@click.pass_context
@_fail_cleanly
def jobs(ctx: click.Context, as_json: bool) -> None:
    """Every job: schedule, time zone, next run, last run and its status."""
    deployment = configure(_app(ctx))
    try:
        events = deployment.backend.read_history(sorted(n for n, j in deployment.jobs.items() if j.history_size))
    finally:
        deployment.release()
    now = clock.now_ms()
    data, rows = [], []
    for name, job in sorted(deployment.jobs.items()):
        last = fold(events.get(name, []), 1)
        next_slot = job.next_slot(now)
        entry = {
            "job": name,
            "task": job.task,
            "schedule": job.schedule.describe(),
            "tz": str(job.tz),
            "next_run": _iso(next_slot, job.tz),
            "next_run_utc": _iso(next_slot),
            "last_run": _run_dict(last[0]) if last else None,
        }
        data.append(entry)
        last_sent = _iso(last[0].sent_at_ms or last[0].started_at_ms, job.tz) if last else None
        rows.append(
            [name, job.schedule.describe(), str(job.tz), entry["next_run"], last_sent, last[0].status if last else None]
        )
    _emit(as_json, data, rows, ["JOB", "SCHEDULE", "TZ", "NEXT RUN", "LAST RUN", "STATUS"])


@anarchon.command(name="next")
@click.argument("job")
@click.option("-n", "count", type=click.IntRange(1, 1000), default=5, show_default=True, help="How many runs.")
@json_option
@click.pass_context
@_fail_cleanly
def next_runs(ctx: click.Context, job: str, count: int, as_json: bool) -> None:
    """The next N run times of JOB, local (the job's time zone) and UTC."""
    deployment = configure(_app(ctx))
    spec: Job = deployment.job(job)
    slots, slot = [], clock.now_ms()
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
    """Recent runs of JOB, newest first: status, times, instance, worker, error."""
    deployment: Deployment = configure(_app(ctx))
    runs = history(_app(ctx), job, count, deployment=deployment)
    tz = deployment.job(job).tz
    rows = [
        [
            run.run_id,
            run.trigger,
            run.status,
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
    run = run_now(_app(ctx), job)
    if as_json:
        click.echo(json.dumps({"job": run.job, "run_id": run.run_id, "task_id": run.task_id}))
    else:
        click.echo(f"sent job {run.job}: run {run.run_id}, task {run.task_id}")


@anarchon.command()
@json_option
@click.pass_context
@_fail_cleanly
def check(ctx: click.Context, as_json: bool) -> None:
    """Check the configuration as the scheduler would, and the broker: exit 0 only if all is well."""
    checks: list[dict[str, Any]] = []

    def step(name: str, action: Callable[[], str]) -> bool:
        try:
            checks.append({"check": name, "ok": True, "detail": action()})
            return True
        except Exception as exc:  # noqa: BLE001 - every failure is reported, as one line
            detail = str(exc) if isinstance(exc, AnarchonError) else f"{type(exc).__name__}: {exc}"
            checks.append({"check": name, "ok": False, "detail": detail})
            return False

    holder: dict[str, Deployment] = {}

    def config() -> str:
        holder["d"] = configure(_app(ctx))
        return f"{len(holder['d'].jobs)} job(s) valid: names, schedules, time zones, options, safety rule"

    def broker() -> str:
        backend = holder["d"].backend
        backend.open()
        version = getattr(backend, "server_version", None)
        shown = f"RabbitMQ {'.'.join(map(str, version))}" if version else "reachable"
        return f"{backend.describe()}: {shown}"

    def streams() -> str:
        holder["d"].backend.check_history()
        return "history streams can be created"

    if step("config", config):
        try:
            if step("broker", broker):
                step("streams", streams)
        finally:
            holder["d"].release()
    ok = all(c["ok"] for c in checks)
    if as_json:
        click.echo(json.dumps({"ok": ok, "checks": checks}))
    else:
        for c in checks:
            click.echo(f"{'ok  ' if c['ok'] else 'FAIL'}  {c['check']:<8} {c['detail']}")
    if not ok:
        ctx.exit(1)
