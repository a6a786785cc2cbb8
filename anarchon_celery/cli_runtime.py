"""``celery -A proj anarchon pause|resume|add|edit|remove``: act on jobs at runtime, for every
instance at once. A part of :mod:`.cli`, whose group it adds its commands to."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from .backends.definitions import JobDef
from .cli import _app, _deployment, _emit, _fail_cleanly, _iso, anarchon, json_option, pause_dict
from .importing import import_django_celery_beat, shown_time
from .pausing import pause, resume
from .runtime import add_job, remove_job, update_job

__all__ = ["add_command", "edit_command", "import_command", "pause_command", "remove_command", "resume_command"]


@anarchon.command(name="pause")
@click.argument("job")
@click.option("--note", default="", help="Why: shown by 'jobs' with the pause.")
@click.option(
    "--until",
    metavar="TIME",
    help="Resume by itself then: ISO 8601, such as 2027-10-31T06:00 (the job's time zone) or 2027-10-31T05:00Z.",
)
@click.option("--by", help="Who pauses it (default: user@host).")
@json_option
@click.pass_context
@_fail_cleanly
def pause_command(ctx: click.Context, job: str, note: str, until: str | None, by: str | None, as_json: bool) -> None:
    """Pause JOB for every instance: its runs are recorded 'paused', not sent, until 'resume' (or
    --until). A paused job's pause is replaced."""
    with _deployment(ctx) as deployment:
        kept = pause(_app(ctx), job, note=note, until=until, by=by, deployment=deployment)
        tz = deployment.job(job).tz
    if as_json:
        click.echo(json.dumps({"job": job, "paused": pause_dict(kept, tz)}))
    else:
        until_text = f" until {_iso(kept.until_ms, tz)}" if kept.until_ms is not None else ""
        click.echo(f"paused job {job}{until_text} (by {kept.by}{': ' + kept.note if kept.note else ''})")


@anarchon.command(name="resume")
@click.argument("job")
@json_option
@click.pass_context
@_fail_cleanly
def resume_command(ctx: click.Context, job: str, as_json: bool) -> None:
    """Resume JOB: its next run is sent as scheduled; the runs due while it was paused are not."""
    with _deployment(ctx) as deployment:
        ended = resume(_app(ctx), job, deployment=deployment)
        tz = deployment.job(job).tz
    if as_json:
        click.echo(json.dumps({"job": job, "resumed": ended is not None, "pause": pause_dict(ended, tz)}))
    elif ended is None:
        click.echo(f"job {job} was not paused")
    else:
        click.echo(f"resumed job {job} (paused by {ended.by} at {_iso(ended.at_ms, tz)})")


# -- runtime jobs ---------------------------------------------------------------------------------

#: The per-job keys the commands take as options of their own (--jitter-ms ...).
_KEY_OPTIONS = {
    "jitter_ms": int,
    "max_late_ms": int,
    "history_size": int,
    "backup_runners": int,
    "catch_up": str,
    "catch_up_window_ms": int,
    "overlap": str,
}


def _job_options(*, edit: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The options that define a job, for ``add`` (task and schedule required) and ``edit``."""
    options = [
        click.option("--task", required=not edit, help="The Celery task's name."),
        click.option(
            "--schedule",
            required=not edit,
            metavar="SPEC",
            help="A cron spec or macro (such as '@daily'), a number of seconds (an interval aligned to the epoch), "
            'or a Celery crontab as JSON, {"crontab": "0 9 1-7 0 1"} (both day fields must match).',
        ),
        click.option("--args", "args_json", metavar="JSON", help="The task's positional arguments: a JSON list."),
        click.option("--kwargs", "kwargs_json", metavar="JSON", help="The task's keyword arguments: a JSON object."),
        click.option("--tz", help="The time zone of a cron spec (an IANA name; default: the app's)."),
        click.option(
            "--option",
            "options",
            multiple=True,
            metavar="KEY=VALUE",
            help="An apply_async option (queue=reports, priority=5, expires=60); VALUE is JSON, or else text.",
        ),
        *(
            click.option(f"--{key.replace('_', '-')}", key, type=kind, help=f"The job's {key} (see the job keys).")
            for key, kind in _KEY_OPTIONS.items()
        ),
        click.option("--by", help="Who makes the change (default: user@host)."),
    ]
    if edit:
        options += [
            click.option("--if-version", type=click.IntRange(1), help="Change it only if it is at this version."),
            click.option("--unset", multiple=True, metavar="KEY", help="Take a key out (back to its default)."),
        ]

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def _json(value: str, what: str, kind: type) -> Any:
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise click.BadParameter(f"{value!r} is not JSON ({exc})", param_hint=what) from None
    if not isinstance(parsed, kind):
        raise click.BadParameter(f"{value!r} is not a JSON {kind.__name__}", param_hint=what)
    return parsed


def _schedule(text: str) -> Any:
    """A number of seconds, a JSON object (``{"crontab": "0 9 1-7 * 1"}``), or a cron spec."""
    if text.lstrip().startswith("{"):
        return _json(text, "--schedule", dict)
    try:
        number = float(text)
    except ValueError:
        return text
    return int(number) if number.is_integer() else number


def _entry(given: dict[str, Any]) -> dict[str, Any]:
    """The entry keys the options give (those not given left out)."""
    entry: dict[str, Any] = {}
    if given.get("task") is not None:
        entry["task"] = given["task"]
    if given.get("schedule") is not None:
        entry["schedule"] = _schedule(given["schedule"])
    if given.get("args_json") is not None:
        entry["args"] = _json(given["args_json"], "--args", list)
    if given.get("kwargs_json") is not None:
        entry["kwargs"] = _json(given["kwargs_json"], "--kwargs", dict)
    if given.get("tz") is not None:
        entry["tz"] = given["tz"]
    if given.get("options"):
        options = {}
        for pair in given["options"]:
            key, sep, value = pair.partition("=")
            if not sep or not key:
                raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--option")
            try:
                options[key] = json.loads(value)
            except ValueError:
                options[key] = value
        entry["options"] = options
    entry.update({key: given[key] for key in _KEY_OPTIONS if given.get(key) is not None})
    return entry


def _said(kept: JobDef, verb: str, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(kept.as_dict()))
    else:
        click.echo(f"{verb} job {kept.name}: version {kept.version}")


@anarchon.command(name="add")
@click.argument("job")
@_job_options(edit=False)
@json_option
@click.pass_context
@_fail_cleanly
def add_command(ctx: click.Context, job: str, by: str | None, as_json: bool, **given: Any) -> None:
    """Add the runtime job JOB, for every instance, without a restart: its task on a schedule,
    validated as a job of the code (the task must be registered in this app)."""
    entry = _entry(given)
    task, schedule = entry.pop("task"), entry.pop("schedule")
    with _deployment(ctx) as deployment:
        kept = add_job(_app(ctx), job, task=task, schedule=schedule, by=by, deployment=deployment, **entry)
    _said(kept, "added", as_json)


@anarchon.command(name="edit")
@click.argument("job")
@_job_options(edit=True)
@json_option
@click.pass_context
@_fail_cleanly
def edit_command(
    ctx: click.Context,
    job: str,
    by: str | None,
    if_version: int | None,
    unset: tuple[str, ...],
    as_json: bool,
    **given: Any,
) -> None:
    """Change the runtime job JOB: the options given replace its keys. Refused when it changed
    meanwhile (or is not at --if-version): nothing is overwritten. The next run follows the new
    definition on every instance; a changed schedule starts now."""
    changes: dict[str, Any] = {key: None for key in unset}
    changes.update(_entry(given))
    if not changes:
        raise click.UsageError("nothing to change: give an option (--schedule, --args, ...) or --unset KEY")
    with _deployment(ctx) as deployment:
        kept = update_job(_app(ctx), job, if_version=if_version, by=by, deployment=deployment, **changes)
    _said(kept, "changed", as_json)


@anarchon.command(name="remove")
@click.argument("job")
@click.option("--if-version", type=click.IntRange(1), help="Remove it only if it is at this version.")
@json_option
@click.pass_context
@_fail_cleanly
def remove_command(ctx: click.Context, job: str, if_version: int | None, as_json: bool) -> None:
    """Remove the runtime job JOB (its history stays until 'prune'): no instance claims a run of
    it from then on."""
    with _deployment(ctx) as deployment:
        gone = remove_job(_app(ctx), job, if_version=if_version, deployment=deployment)
    _said(gone, "removed", as_json)


@anarchon.command(name="import-django-celery-beat")
@click.option(
    "--database",
    required=True,
    metavar="URL",
    help="django-celery-beat's database: sqlite:///PATH or postgresql://USER@HOST/DB.",
)
@click.option("--yes", is_flag=True, help="Add the jobs. Without it, list what would be added (a dry run).")
@click.option("--by", help="Who makes the change (default: user@host).")
@json_option
@click.pass_context
@_fail_cleanly
def import_command(ctx: click.Context, database: str, yes: bool, by: str | None, as_json: bool) -> None:
    """Make runtime jobs of django-celery-beat's PeriodicTask rows (a dry run unless --yes). Each row
    is listed with what becomes of it: a crontab or an interval becomes a job (a disabled task is
    added paused, one whose start_time is to come paused until then); what cannot map (expired,
    one-off, clocked, solar, a task this app does not have) is listed with why, never dropped
    silently. Times are shown in UTC, with their offset."""
    with _deployment(ctx) as deployment:
        found = import_django_celery_beat(_app(ctx), database, apply=yes, by=by, deployment=deployment)
    rows = []
    for item in found:
        action = f"{item.action}: {item.reason}" if item.reason else item.action
        if item.paused and item.entry is not None:
            action += " (paused: disabled there)"
        elif item.until_ms is not None and item.entry is not None:
            action += f" (paused until {shown_time(item.until_ms)}: its start_time)"
        schedule = None if item.entry is None else item.entry["schedule"]
        rows.append([item.source, item.job, schedule, action, "; ".join(item.notes) or None])
    _emit(as_json, [item.as_dict() for item in found], rows, ["PERIODIC TASK", "JOB", "SCHEDULE", "ACTION", "NOTES"])
