"""``celery -A proj anarchon pause|resume``: act on a job at runtime, for every instance at once.
A part of :mod:`.cli`, whose group it adds its commands to."""

from __future__ import annotations

import json

import click

from .cli import _app, _deployment, _fail_cleanly, _iso, anarchon, json_option, pause_dict
from .pausing import pause, resume

__all__ = ["pause_command", "resume_command"]


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
