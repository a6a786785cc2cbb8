"""The parts every page of the schedules page is made of: escaping, times, badges, the form
token, and the page around them (one stylesheet, no script)."""

from __future__ import annotations

import datetime as dt
import html
import json
from collections.abc import Iterable, Sequence
from typing import Any

from ..schedule import from_ms

__all__ = ["Context", "attr", "badge", "duration", "esc", "form", "layout", "relative", "table", "when"]


def esc(value: Any) -> str:
    """``value`` as text, escaped for HTML (quotes too)."""
    return html.escape("" if value is None else str(value), quote=True)


def attr(value: Any) -> str:
    """``value`` as a quoted attribute value."""
    return f'"{esc(value)}"'


class Context:
    """What every page needs of its request: where the page is mounted (``base``), the token
    its forms carry, the user logged in (None: nobody is), and the app's name."""

    def __init__(self, *, base: str, token: str, user: str | None, app_name: str) -> None:
        self.base = base.rstrip("/")
        self.token = token
        self.user = user
        self.app_name = app_name

    def url(self, *parts: str) -> str:
        """The path of a page of the site: ``url("jobs", name)`` is ``<base>/jobs/<name>``."""
        from urllib.parse import quote

        return self.base + "/" + "/".join(quote(part, safe="") for part in parts)


# -- times ---------------------------------------------------------------------------------------


def when(ms: int | None, tz: dt.tzinfo = dt.timezone.utc, *, short: bool = False) -> str:
    """An instant on the wall clock of ``tz``, with its abbreviation: ``2027-01-05 02:30:00 JST``
    (``short``: without it, for a table whose heading names the time zone)."""
    if ms is None:
        return "-"
    moment = from_ms(ms).astimezone(tz)
    shown = f"{moment:%Y-%m-%d %H:%M:%S}"
    return shown if short else f"{shown} {moment.tzname() or ''}".rstrip()


def duration(ms: int) -> str:
    """A length of time for a person: ``250 ms``, ``4.2 s``, ``3 min 5 s``, ``2 h 5 min``, ``3 d 4 h``."""
    sign, ms = ("-", -ms) if ms < 0 else ("", ms)
    if ms < 1_000:
        text = f"{ms} ms"
    elif ms < 60_000:
        text = f"{ms / 1000:.1f} s"
    elif ms < 3_600_000:
        text = f"{ms // 60_000} min {ms % 60_000 // 1000} s"
    elif ms < 86_400_000:
        text = f"{ms // 3_600_000} h {ms % 3_600_000 // 60_000} min"
    else:
        text = f"{ms // 86_400_000} d {ms % 86_400_000 // 3_600_000} h"
    return sign + text


def relative(ms: int | None, now_ms: int) -> str:
    """How far ``ms`` is from now: ``in 4.2 s``, ``3 min 5 s ago``."""
    if ms is None:
        return ""
    return f"in {duration(ms - now_ms)}" if ms >= now_ms else f"{duration(now_ms - ms)} ago"


def as_json(value: Any) -> str:
    """A value of a job's definition as JSON (a repr for what JSON cannot hold)."""
    return json.dumps(value, default=repr, sort_keys=True, ensure_ascii=False)


# -- parts ---------------------------------------------------------------------------------------

#: Each run status, by the colour its badge gets.
_TONES = {
    "succeeded": "good",
    "active": "good",
    "failed": "bad",
    "abandoned": "bad",
    "unsent": "bad",
    "invalid": "bad",
    "conflict": "bad",
    "paused": "warn",
    "busy": "warn",
    "revoked": "warn",
    "skipped": "muted",
}


def badge(text: str, tone: str | None = None) -> str:
    """A status as a small coloured label."""
    return f'<span class="badge {esc(tone or _TONES.get(text, "info"))}">{esc(text)}</span>'


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, css: str = "") -> str:
    """A table of cells already made HTML (escaped), with plain-text headers."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<table class="{esc(css)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def form(context: Context, action: str, fields: str, button: str, *, css: str = "") -> str:
    """A form posted to ``action``, with the page's token; ``fields`` is HTML."""
    return (
        f'<form method="post" action={attr(action)} class="{esc(css)}">'
        f'<input type="hidden" name="token" value={attr(context.token)}>{fields}'
        f'<button type="submit">{esc(button)}</button></form>'
    )


def notice(text: str, tone: str) -> str:
    """One line above a page's content: what an action did, or what went wrong."""
    return f'<p class="notice {esc(tone)}" role="{"alert" if tone == "bad" else "status"}">{esc(text)}</p>'


_STYLE = """
:root { color-scheme: light; --fg: #1d2330; --muted: #667085; --line: #e3e6ec; --bg: #f6f7f9;
  --good: #137333; --bad: #b3261e; --warn: #9a6700; --info: #1a56c4; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
  background: var(--bg); }
header { background: #1d2330; color: #fff; padding: 10px 24px; display: flex; gap: 16px; align-items: baseline;
  flex-wrap: wrap; }
header a { color: #fff; text-decoration: none; font-weight: 600; }
header .where { color: #c4c9d4; font-size: 12px; }
header .who { margin-left: auto; color: #c4c9d4; font-size: 12px; }
main { padding: 16px 24px 40px; max-width: 1400px; }
h1 { font-size: 20px; margin: 4px 0 12px; }
h2 { font-size: 15px; margin: 24px 0 8px; }
a { color: var(--info); }
table { border-collapse: collapse; background: #fff; border: 1px solid var(--line); width: 100%; }
th, td { text-align: left; padding: 6px 10px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: #eef0f4; font-weight: 600; font-size: 12px; color: #3b4352; white-space: nowrap; }
td small, .muted { color: var(--muted); }
table.definition { width: auto; min-width: 420px; }
table.next { width: auto; }
table.jobs td:not(:nth-child(3)):not(:nth-child(5)), table.runs td:not(:nth-child(11)), table.next td {
  white-space: nowrap; }
.columns { display: flex; gap: 32px; flex-wrap: wrap; align-items: flex-start; }
.columns > section { min-width: 0; }
.columns > section:last-child { flex: 1 1 520px; max-width: 860px; }
table.jobs td:nth-child(5) { min-width: 280px; }
p.state { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 8px 12px; margin: 0;
  max-width: 640px; }
table.definition th { width: 170px; }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12.5px; }
.badge { display: inline-block; padding: 1px 7px; border-radius: 9px; font-size: 12px; font-weight: 600;
  border: 1px solid currentColor; white-space: nowrap; }
.badge.good { color: var(--good); } .badge.bad { color: var(--bad); } .badge.warn { color: var(--warn); }
.badge.info { color: var(--info); } .badge.muted { color: var(--muted); }
.notice { padding: 8px 12px; border-radius: 6px; margin: 8px 0; border: 1px solid; background: #fff; }
.notice.good { border-color: var(--good); color: var(--good); }
.notice.bad { border-color: var(--bad); color: var(--bad); }
.notice.warn { border-color: var(--warn); color: var(--warn); }
.actions { display: flex; gap: 12px; flex-wrap: wrap; align-items: flex-start; }
.actions form, details.edit { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 10px 12px; }
details.edit { margin-top: 12px; }
form label { display: block; font-size: 12px; color: #3b4352; margin: 0 0 8px; }
form input[type=text], form input[type=datetime-local] { display: block; margin-top: 2px; padding: 4px 6px;
  border: 1px solid #c9ced8; border-radius: 4px; font: inherit; min-width: 220px; }
.grid input[type=text] { width: 100%; min-width: 0; }
button { font: inherit; padding: 5px 12px; border-radius: 4px; border: 1px solid #1a56c4; background: #1a56c4;
  color: #fff; cursor: pointer; }
form.quiet button { background: #fff; color: #1a56c4; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(220px, 1fr)); gap: 0 16px; }
details.edit summary { cursor: pointer; font-weight: 600; }
svg.chart { background: #fff; border: 1px solid var(--line); max-width: 100%; height: auto; }
svg.chart text { font: 11px system-ui, sans-serif; fill: var(--muted); }
svg.chart .axis { stroke: #c9ced8; } svg.chart .median { stroke: var(--info); stroke-dasharray: 4 3; }
svg.chart rect.run { fill: #6f95dd; } svg.chart rect.run.good { fill: #3a9a5b; }
svg.chart rect.run.bad { fill: #d0453b; } svg.chart rect.run.warn { fill: #d8a31a; }
"""


def layout(context: Context, title: str, body: str, *, backend: str = "") -> str:
    """A whole page: ``title`` (plain text) and ``body`` (HTML)."""
    who = f"signed in as {esc(context.user)}" if context.user else ""
    where = f" on {esc(backend)}" if backend else ""
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · anarchon</title><style>{_STYLE}</style></head><body>"
        f"<header><a href={attr(context.url())}>{esc(context.app_name)} schedules</a>"
        f'<span class="where">{where.strip()}</span><span class="who">{who}</span></header>'
        f"<main>{body}</main></body></html>\n"
    )
