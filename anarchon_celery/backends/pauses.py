"""A job's pause, as every backend keeps it: who paused it, when, why, and until when. Pure: the
backends store its JSON form and decide with :meth:`Pause.in_effect` on their own clock.

A paused job's runs are decided as usual (exactly one instance decides each), but not sent: the
instance that decides a run records it ``paused``. On the stores (Redis, PostgreSQL, SQLite) the
pause is read inside the claim itself, so no run is sent once the pause is written; a resume moves
the job's cursor up to the resume, so that catch-up never replays the paused range.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..errors import ConfigError

__all__ = ["MAX_NOTE_CHARS", "PAUSED", "Pause", "check_note"]

#: The state of a run decided while its job was paused (a store's run record), and its history event.
PAUSED = "paused"
#: A pause's note is cut to this many characters.
MAX_NOTE_CHARS = 500


def check_note(note: object) -> str:
    """A note as kept (one line of text, at most :data:`MAX_NOTE_CHARS`), or ConfigError."""
    if not isinstance(note, str):
        raise ConfigError(f"a pause's note is text, not {note!r}")
    return " ".join(note.split())[:MAX_NOTE_CHARS]


@dataclass(frozen=True, slots=True)
class Pause:
    """A job paused by ``by`` at ``at_ms`` (epoch milliseconds), with a ``note``; until
    ``until_ms`` (the job resumes by itself then), or until resumed when None."""

    by: str
    at_ms: int
    note: str = ""
    until_ms: int | None = None

    def in_effect(self, now_ms: int) -> bool:
        """Whether the job is paused at ``now_ms``."""
        return self.until_ms is None or now_ms < self.until_ms

    def encode(self) -> str:
        record: dict[str, object] = {"by": self.by, "at": self.at_ms}
        if self.note:
            record["note"] = self.note
        if self.until_ms is not None:
            record["until"] = self.until_ms
        return json.dumps(record, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | bytes | None) -> Pause | None:
        """A pause from its JSON form; None for none, or for anything that is not one."""
        if not text:
            return None
        try:
            record = json.loads(text)
        except (TypeError, ValueError):
            return None
        if not isinstance(record, dict) or not isinstance(record.get("at"), int):
            return None
        until = record.get("until")
        return cls(
            str(record.get("by", "")),
            record["at"],
            str(record.get("note", "")),
            until if isinstance(until, int) else None,
        )

    def as_dict(self) -> dict[str, object]:
        return {"by": self.by, "at_ms": self.at_ms, "note": self.note, "until_ms": self.until_ms}
