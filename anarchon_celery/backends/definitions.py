"""Runtime jobs, as every backend keeps them: a job added, changed or removed without a restart is
a :class:`JobDef` (its ``beat_schedule`` entry, in JSON) with a version, kept where its runs are
decided. Pure: the backends store the JSON form and apply :func:`put` and :func:`remove` in one
atomic step (RabbitMQ: in the order of its control log, which every instance reads alike).

Every change names the version it is based on (None: the job is new); a change based on another
version than the one kept is refused (:class:`JobConflict`), so that two operators never overwrite
each other silently (Temporal's conflict token). The version kept goes up by one at each change.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError

__all__ = ["JobConflict", "JobDef", "check_change", "entry_of", "removed"]


class JobConflict(ConfigError):
    """A change of a runtime job based on a version that is not the one kept."""

    def __init__(self, job: str, base: int | None, current: int | None) -> None:
        self.job, self.base, self.current = job, base, current
        if base is None:
            text = f"job {job!r} exists already (version {current}): edit it, or remove it first"
        elif current is None:
            text = f"job {job!r} is not a runtime job (any more): nothing to change (add it again)"
        else:
            text = (
                f"job {job!r} is at version {current}, not {base}: it was changed meanwhile. Read it again "
                f"(celery anarchon jobs) and make your change on version {current}"
            )
        super().__init__(text)


@dataclass(frozen=True)
class JobDef:
    """A runtime job: its name, the version kept, its ``beat_schedule`` entry (JSON values only),
    who made this version and when (epoch milliseconds)."""

    name: str
    version: int
    entry: Mapping[str, Any] = field(default_factory=dict)
    by: str = ""
    at_ms: int = 0

    def encode(self) -> str:
        return json.dumps({"v": self.version, "e": dict(self.entry), "by": self.by, "at": self.at_ms}, sort_keys=True)

    @classmethod
    def decode(cls, name: str, text: str | bytes | None) -> JobDef | None:
        """A definition from its JSON form; None for none, or anything that is not one."""
        if not text:
            return None
        try:
            record = json.loads(text)
        except (TypeError, ValueError):
            return None
        if (
            not isinstance(record, dict)
            or not isinstance(record.get("v"), int)
            or record["v"] < 1
            or not isinstance(record.get("e"), dict)
        ):
            return None
        at = record.get("at")
        return cls(name, record["v"], record["e"], str(record.get("by", "")), at if isinstance(at, int) else 0)

    def as_dict(self) -> dict[str, Any]:
        return {
            "job": self.name,
            "version": self.version,
            "entry": dict(self.entry),
            "by": self.by,
            "at_ms": self.at_ms,
        }


def check_change(job: str, kept: JobDef | None, base: int | None) -> int:
    """The version a change based on ``base`` makes of ``job`` (``kept``: the version kept, None
    when there is none); JobConflict when ``base`` is not the version kept."""
    current = None if kept is None else kept.version
    if base != current:
        raise JobConflict(job, base, current)
    return 1 if current is None else current + 1


def entry_of(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A ``beat_schedule`` entry as a runtime job keeps it: JSON values only (a tuple of arguments
    becomes a list); ConfigError naming the key that JSON cannot hold."""
    kept: dict[str, Any] = {}
    for key, value in entry.items():
        try:
            kept[key] = json.loads(json.dumps(value))
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"{key} {value!r} cannot be kept as JSON, which a runtime job needs: give JSON values ({exc})"
            ) from None
    return kept


def removed(job: str, kept: JobDef | None, base: int | None) -> JobDef:
    """Check the removal of ``job`` based on ``base`` (None: whatever its version); the definition
    removed. JobConflict when there is none, or ``base`` is not its version."""
    if kept is None:
        raise JobConflict(job, base if base is not None else 0, None)
    if base is not None and base != kept.version:
        raise JobConflict(job, base, kept.version)
    return kept
