"""The page's actions, each a form posted to ``/jobs/<job>/<action>``: run now, pause, resume,
and edit a runtime job. Each is done by the package's own function (:func:`~.control.run_now`,
:func:`~.pausing.pause`, :func:`~.pausing.resume`, :func:`~.runtime.update_job`) on the
request's deployment, and raises its errors as they are. What an action did is told by the job's
page, from the words of a redirect's query (:func:`done_text`), never from text the query
carries."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..control import Deployment, run_now
from ..errors import ConfigError
from ..pausing import pause, resume
from ..runtime import update_job
from ..settings import LEASE_SETTINGS

__all__ = ["ACTIONS", "EDIT_KEYS", "LEASE_KEYS", "EditKey", "act", "done_text", "edit_changes", "field_text"]


@dataclass(frozen=True)
class EditKey:
    """A key of a runtime job's entry, as the edit form shows it: its label and how its text is
    read (``text``, ``schedule``, ``int``, ``list`` or ``dict``: a JSON list or object)."""

    key: str
    label: str
    kind: str


#: The keys the edit form changes: those ``celery anarchon edit`` takes.
EDIT_KEYS = (
    EditKey("task", "task: the Celery task's name", "text"),
    EditKey("schedule", 'schedule: a cron spec, a number of seconds, or {"crontab": "0 9 1-7 * 1"}', "schedule"),
    EditKey("args", "args: a JSON list", "list"),
    EditKey("kwargs", "kwargs: a JSON object", "dict"),
    EditKey("options", "options: apply_async options, a JSON object", "dict"),
    EditKey("tz", "tz: an IANA time zone (empty: the app's)", "text"),
    EditKey("jitter_ms", "jitter_ms", "int"),
    EditKey("max_late_ms", "max_late_ms", "int"),
    EditKey("history_size", "history_size", "int"),
    EditKey("backup_runners", "backup_runners", "int"),
    EditKey("catch_up", "catch_up: latest or all (empty: off)", "text"),
    EditKey("catch_up_window_ms", "catch_up_window_ms", "int"),
    EditKey("overlap", "overlap: allow, skip, buffer_one or buffer_all", "text"),
)
#: The keys only a backend with leases takes: the form leaves them out on another.
LEASE_KEYS = frozenset(LEASE_SETTINGS) & {edit.key for edit in EDIT_KEYS}
_REQUIRED = ("task", "schedule")


def field_text(entry: Mapping[str, Any], key: str) -> str:
    """A key of a runtime job's entry as its field shows it (empty when the entry has none)."""
    value = entry.get(key)
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _read(job: str, spec: EditKey, text: str) -> Any:
    """A field's text as the key's value; None for an empty field (the key taken out)."""
    text = text.strip()
    if not text:
        if spec.key in _REQUIRED:
            raise ConfigError(f"job {job!r}: {spec.key} cannot be empty: a job needs one")
        return None
    if spec.kind == "int":
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"job {job!r}: {spec.key} must be a whole number, not {text!r}") from None
    if spec.kind == "schedule" and not text.startswith("{"):
        try:
            number = float(text)
        except ValueError:
            return text  # a cron spec
        return int(number) if number.is_integer() else number
    if spec.kind in ("list", "dict", "schedule"):
        kind = list if spec.kind == "list" else dict
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"job {job!r}: {spec.key} {text!r} is not JSON ({exc})") from None
        if not isinstance(value, kind):
            raise ConfigError(f"job {job!r}: {spec.key} {text!r} is not a JSON {'list' if kind is list else 'object'}")
        return value
    return text


def edit_changes(job: str, entry: Mapping[str, Any], form: Mapping[str, str]) -> dict[str, Any]:
    """The changes the edit form makes to ``entry``: each key whose field differs from it (None
    for a key taken out). A key whose field the form lacks is left as it is."""
    changes: dict[str, Any] = {}
    for spec in EDIT_KEYS:
        if spec.key not in form:
            continue
        value = _read(job, spec, form[spec.key])
        if value is None:
            if spec.key in entry:
                changes[spec.key] = None
        elif value != entry.get(spec.key):
            changes[spec.key] = value
    return changes


def _version(job: str, form: Mapping[str, str]) -> int:
    text = form.get("version", "")
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"job {job!r}: the form names no version to change ({text!r}): load the job's page again")
    return int(text)


#: An action's work: (app, deployment, job, form, by) to the words of the page it leads to.
Action = Callable[[Any, Deployment, str, Mapping[str, str], str], dict[str, str]]


def _run_now(app: Any, deployment: Deployment, job: str, form: Mapping[str, str], by: str) -> dict[str, str]:
    run = run_now(app, job, deployment=deployment)
    return {"done": "run-now", "run": run.run_id}


def _pause(app: Any, deployment: Deployment, job: str, form: Mapping[str, str], by: str) -> dict[str, str]:
    until = form.get("until", "").strip() or None
    pause(app, job, note=form.get("note", ""), until=until, by=by, deployment=deployment)
    return {"done": "paused"}


def _resume(app: Any, deployment: Deployment, job: str, form: Mapping[str, str], by: str) -> dict[str, str]:
    ended = resume(app, job, deployment=deployment)
    return {"done": "resumed" if ended is not None else "not-paused"}


def _edit(app: Any, deployment: Deployment, job: str, form: Mapping[str, str], by: str) -> dict[str, str]:
    base = _version(job, form)
    kept = deployment.backend.runtime_jobs([job]).get(job)
    entry = kept.entry if kept is not None else {}
    changes = edit_changes(job, entry, form)
    if not changes and kept is not None and kept.version == base:
        return {"done": "unchanged"}
    changed = update_job(app, job, if_version=base, by=by, deployment=deployment, **changes)
    return {"done": "edited", "version": str(changed.version)}


#: Every action, by the last part of its path.
ACTIONS: dict[str, Action] = {"run-now": _run_now, "pause": _pause, "resume": _resume, "edit": _edit}


def act(action: str, app: Any, deployment: Deployment, job: str, form: Mapping[str, str], by: str) -> dict[str, str]:
    """Do ``action`` on ``job``; the query of the job's page that tells what it did."""
    return ACTIONS[action](app, deployment, job, form, by)


_RUN_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")


def done_text(job: str, query: Mapping[str, str]) -> str | None:
    """What an action did, from the words of the page's query; None when they say nothing known."""
    done = query.get("done")
    if done == "run-now" and _RUN_ID.match(query.get("run", "")):
        return f"Sent job {job} now: run {query['run']} (trigger manual)."
    if done == "edited" and query.get("version", "").isdigit():
        return f"Changed job {job}: version {query['version']}. Every instance follows it from its next run."
    return {
        "paused": f"Paused job {job} for every instance: its runs are recorded paused, not sent.",
        "resumed": f"Resumed job {job}: its next run is sent as scheduled; the runs due while it was paused are not.",
        "not-paused": f"Job {job} was not paused.",
        "unchanged": f"Nothing to change: the form is job {job}'s definition as kept.",
    }.get(done or "")
