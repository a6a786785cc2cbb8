"""The pages: the index of every job, and a job's own page (its definition, state, actions,
next runs, lateness chart and recent runs). Each is HTML made from what :mod:`.reading` read,
every value escaped."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

from ..backends.pauses import Pause
from ..history import Run
from ..jobs import Job
from .actions import EDIT_KEYS, LEASE_KEYS, field_text
from .busy import Busy
from .chart import lateness, lateness_chart
from .reading import JobView, Overview
from .render import Context, as_json, attr, badge, duration, esc, form, layout, notice, relative, table, when

__all__ = ["index_page", "job_page", "message_page"]


def _state(pause: Pause | None, busy: Busy | None, tz: dt.tzinfo, now_ms: int, *, said: bool = True) -> str:
    """A job's state: active, or paused (by whom, when, why, until when); and busy when a run
    holds it. ``said`` False: the badges only."""
    parts = []
    if pause is None:
        parts.append(badge("active"))
    else:
        text = f" by {pause.by} at {when(pause.at_ms, tz)}"
        text += f": {pause.note}" if pause.note else ""
        text += f" (until {when(pause.until_ms, tz)})" if pause.until_ms is not None else ""
        parts.append(badge("paused") + (esc(text) if said else ""))
    if busy is not None:
        parts.append(badge("busy") + (esc(" " + _busy_text(busy, tz, now_ms)) if said else ""))
    return ("<br>" if said else " ").join(parts)


def _busy_text(busy: Busy, tz: dt.tzinfo, now_ms: int) -> str:
    """Which run holds the job, where, and how much longer its lease lasts unless renewed."""
    node = busy.worker.split("#", 1)[0]  # (the holder is node#process)
    if busy.state == "running":
        text = f"its run of {when(busy.slot, tz)} runs on {node or 'a worker'}"
    else:
        text = f"its run of {when(busy.slot, tz)} was sent, no worker started it yet"
    text += f" (lease held {duration(busy.until_ms - now_ms)} more)"
    if busy.pending:
        text += f"; {busy.pending} run(s) wait for it"
    return text


def _kind(version: int) -> str:
    """A job's kind: ``code``, or ``runtime`` with its version."""
    return f"runtime v{version}" if version else "code"


def _last(run: Run | None, tz: dt.tzinfo, now_ms: int) -> tuple[str, str]:
    if run is None:
        return "-", "-"
    at = run.sent_at_ms or run.started_at_ms or run.finished_at_ms
    shown = f"{esc(when(at, tz))}<br><small>{esc(relative(at, now_ms))}</small>"
    return shown, badge(run.status)


def index_page(context: Context, view: Overview) -> str:
    """Every job: kind, schedule, time zone, state, next run, last run and its status."""
    rows = []
    for row in view.rows:
        link = f"<a href={attr(context.url('jobs', row.name))}>{esc(row.name)}</a>"
        if row.job is None:
            why = badge("invalid") + esc(f" not runnable here: {row.invalid}")
            rows.append([link, esc(_kind(row.version)), "-", "-", why, "-", "-", "-"])
            continue
        job = row.job
        upcoming = job.next_slot(view.now_ms)
        last, status = _last(row.last, job.tz, view.now_ms)
        rows.append(
            [
                f"{link}<br><small>{esc(job.task)}</small>",
                esc(_kind(row.version)),
                f"<code>{esc(job.schedule.display())}</code>",
                esc(job.tz),
                _state(row.pause, row.busy, job.tz, view.now_ms),
                f"{esc(when(upcoming, job.tz))}<br><small>{esc(relative(upcoming, view.now_ms))}</small>",
                last,
                status,
            ]
        )
    headers = ["Job", "Kind", "Schedule", "Time zone", "State", "Next run", "Last run", "Status"]
    body = "<h1>Jobs</h1>" + _problems(view.problems)
    body += table(headers, rows, css="jobs") if rows else '<p class="muted">No jobs.</p>'
    body += f'<p class="muted">Read at {esc(when(view.now_ms))}. Reload the page to read again.</p>'
    return layout(context, "Jobs", body, backend=view.backend)


def _problems(problems: Sequence[str]) -> str:
    return "".join(notice(problem, "warn") for problem in problems)


def _definition(view: JobView) -> str:
    rows: list[tuple[str, str]] = []
    job, kept = view.job, view.definition
    if job is not None:
        rows += [("task", job.task), ("schedule", job.schedule.display()), ("tz", str(job.tz))]
        rows += [("args", as_json(list(job.args))), ("kwargs", as_json(dict(job.kwargs)))]
        rows += [("options", as_json(dict(job.options)))] if job.options else []
        rows += [(key, str(getattr(job, key))) for key in ("jitter_ms", "max_late_ms", "history_size")]
        if view.leases:
            rows.append(("backup_runners", str(job.backup_runners)))
            rows.append(("catch_up", f"{job.catch_up} within {job.catch_up_window_ms} ms" if job.catch_up else "off"))
            rows.append(("overlap", job.overlap))
    elif kept is not None:
        rows += [(key, as_json(value)) for key, value in sorted(kept.entry.items())]
    if kept is not None:
        rows.append(("version", f"{kept.version}, by {kept.by or '?'} at {when(kept.at_ms)}"))
    cells = "".join(f"<tr><th>{esc(key)}</th><td><code>{esc(value)}</code></td></tr>" for key, value in rows)
    return f'<table class="definition"><tbody>{cells}</tbody></table>'


def _actions(context: Context, view: JobView) -> str:
    if view.job is None:
        return ""
    name = view.name
    parts = [
        form(context, context.url("jobs", name, "run-now"), "", "Run now"),
        form(
            context,
            context.url("jobs", name, "pause"),
            '<label>Note (why)<input type="text" name="note" maxlength="500"></label>'
            f"<label>Until (optional, {esc(view.job.tz)})"
            '<input type="datetime-local" name="until" step="1"></label>',
            "Pause" if view.pause is None else "Pause again (replaces the pause)",
        ),
    ]
    if view.pause is not None:
        parts.append(form(context, context.url("jobs", name, "resume"), "", "Resume", css="quiet"))
    return f'<h2>Actions</h2><div class="actions">{"".join(parts)}</div>'


def _edit(context: Context, view: JobView, values: Mapping[str, str] | None, opened: bool) -> str:
    """The edit form of a runtime job: its entry's keys (or the values sent, shown again after an
    error), with the version read as the conflict token, and each key's value as read (``was.``
    fields: what the person changed, said when a conflict refuses it)."""
    kept = view.definition
    if kept is None:
        return ""
    sent = values or {}
    version = sent.get("version") or str(kept.version)
    fields = f'<input type="hidden" name="version" value={attr(version)}>'
    for spec in EDIT_KEYS:
        if spec.key in LEASE_KEYS and not view.leases:
            continue
        read = field_text(kept.entry, spec.key)
        value, was = (sent[spec.key], sent.get(f"was.{spec.key}", read)) if spec.key in sent else (read, read)
        fields += (
            f'<label>{esc(spec.label)}<input type="text" name={attr(spec.key)} value={attr(value)}'
            f"{_placeholder(view.job, spec.key)}>"
            f'<input type="hidden" name={attr("was." + spec.key)} value={attr(was)}></label>'
        )
    note = (
        f'<p class="muted">Based on version {esc(version)}: a change made meanwhile is not overwritten. '
        "An empty field takes its key out (back to its default).</p>"
    )
    body = form(context, context.url("jobs", view.name, "edit"), f'<div class="grid">{fields}</div>{note}', "Save")
    return f'<details class="edit"{" open" if opened else ""}><summary>Edit this runtime job</summary>{body}</details>'


def _placeholder(job: Job | None, key: str) -> str:
    """What an empty field of the edit form stands for: the job's value by default."""
    if job is None or key not in ("tz", "jitter_ms", "max_late_ms", "history_size", "backup_runners"):
        return ""
    return f" placeholder={attr('default: ' + str(getattr(job, key)))}"


def _next_runs(view: JobView) -> str:
    if view.job is None or not view.next_slots:
        return ""
    tz = view.job.tz
    rows = [
        [str(i + 1), esc(when(slot, tz)), esc(when(slot)), f"<small>{esc(relative(slot, view.now_ms))}</small>"]
        for i, slot in enumerate(view.next_slots)
    ]
    return "<h2>Next runs</h2>" + table(["#", f"Local ({tz})", "UTC", ""], rows, css="next")


def _same_day(ms: int | None, tz: dt.tzinfo, slot: str) -> str:
    """An instant of a run, its time alone when it is on the day of the run's ``slot`` (as shown)."""
    shown = when(ms, tz, short=True)
    return shown[11:] if shown[:10] == slot[:10] else shown


def _run_rows(runs: Sequence[Run], tz: dt.tzinfo) -> list[list[str]]:
    rows = []
    for run in runs:
        trigger = f"{run.trigger} x{run.coalesced}" if run.coalesced and run.coalesced > 1 else (run.trigger or "-")
        status = badge(run.status) + (f" <small>{esc(run.reason)}</small>" if run.reason else "")
        late = lateness(run)
        error = f"{run.error_type}: {run.error}" if run.error_type else (run.error or "")
        slot = when(run.slot, tz, short=True)
        rows.append(
            [
                f'<span class="mono run-id" title={attr(run.run_id)}>{esc(run.run_id[:8])}</span>',
                esc(trigger),
                status,
                esc(slot),
                esc(_same_day(run.sent_at_ms, tz, slot)),
                esc(duration(late)) if late is not None else "-",
                esc(_same_day(run.started_at_ms, tz, slot)),
                esc(_same_day(run.finished_at_ms, tz, slot)),
                esc(run.instance or "-"),
                esc(run.worker or "-"),
                esc(error),
            ]
        )
    return rows


def _history(view: JobView) -> str:
    if view.job is None:
        return ""
    if view.runs is None:
        return (
            '<h2>Recent runs</h2><p class="muted">This job keeps no history (history_size 0): its runs are '
            "sent, and not recorded.</p>"
        )
    tz = view.job.tz
    chart = "<h2>Lateness</h2>" + lateness_chart(view.runs, tz)
    if not view.runs:
        return chart + '<h2>Recent runs</h2><p class="muted">No run recorded yet.</p>'
    headers = ["Run", "Trigger", "Status", "Slot", "Sent", "Late", "Started", "Finished", "Instance", "Worker", "Error"]
    heading = f"<h2>Recent runs ({len(view.runs)}, times in {esc(tz)})</h2>"
    return chart + heading + table(headers, _run_rows(view.runs, tz), css="runs")


def job_page(
    context: Context,
    view: JobView,
    *,
    done: str | None = None,
    error: str | None = None,
    conflict: bool = False,
    values: Mapping[str, str] | None = None,
) -> str:
    """A job's page; ``done`` or ``error`` is what the action just posted did. After an edit's
    error, ``values`` are the fields sent, shown again; after a conflict, the definition kept is
    shown, and the change that was not made is said."""
    title = ""
    if view.job is not None or view.definition is not None:
        title = badge(_kind(view.definition.version if view.definition else 0), "muted")
    if view.invalid is not None:
        title += " " + badge("invalid")
    elif view.job is not None:
        title += " " + _state(view.pause, view.busy, view.job.tz, view.now_ms, said=False)
    body = f"<h1>{esc(view.name)} {title}</h1>"
    if done:
        body += notice(done, "good")
    if error:
        body += notice(("Conflict: " if conflict else "") + error, "bad")
    if conflict and values is not None and view.definition is not None:
        body += _not_made(view.definition.entry, view.definition.version, values)
    body += _problems(view.problems)
    if view.invalid is not None:
        body += notice(view.invalid, "bad")  # (it says the app cannot run the job, and why)
    if view.job is None and view.definition is None:
        return layout(context, view.name, body, backend=view.backend)
    state = ""
    if view.job is not None and (view.pause is not None or view.busy is not None):
        state = f'<h2>State</h2><p class="state">{_state(view.pause, view.busy, view.job.tz, view.now_ms)}</p>'
    edit_values = None if conflict else values
    edit = _edit(context, view, edit_values, opened=bool(error) or view.invalid is not None)
    body += (
        f'<div class="columns"><section><h2>Definition</h2>{_definition(view)}</section>'
        f"<section>{state}{_actions(context, view)}{edit}</section></div>"
    )
    body += _next_runs(view) + _history(view)
    return layout(context, view.name, body, backend=view.backend)


def _not_made(entry: Mapping[str, object], version: int, values: Mapping[str, str]) -> str:
    """The change a conflict refused: the fields the person changed (from the value the form
    showed; from the definition kept, for a form without those)."""
    sent = [
        f"{spec.key} {values[spec.key].strip()!r}" if values[spec.key].strip() else f"{spec.key} taken out"
        for spec in EDIT_KEYS
        if spec.key in values
        and values[spec.key].strip() != values.get(f"was.{spec.key}", field_text(entry, spec.key)).strip()
    ]
    if not sent:
        return ""
    return notice(f"Your change, not made: {'; '.join(sent)}. Make it again on version {version}, below.", "warn")


def message_page(context: Context, title: str, text: str, *, backend: str = "") -> str:
    """A page that only says one thing: a job not found, a request refused."""
    body = f"<h1>{esc(title)}</h1>" + notice(text, "bad") + f"<p><a href={attr(context.url())}>Every job</a></p>"
    return layout(context, title, body, backend=backend)
