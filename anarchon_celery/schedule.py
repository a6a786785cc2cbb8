"""Schedules: when a job runs, as *slots*.

A slot is a run's scheduled instant in integer milliseconds since the Unix epoch (UTC). Every
instance computes the same slots from the same configuration, whenever it started: that is what
lets several beat instances race for the same run. This module is pure (no clock, no I/O).

Intervals are aligned to the Unix epoch: a job every 10 minutes runs at :00, :10, :20..., not
10 minutes after the process started as plain celery beat does.

Cron schedules are evaluated on the wall clock of the job's time zone. Around daylight saving
time changes:

* a wall time skipped by a spring-forward change (02:30 on the night clocks jump from 02:00 to
  03:00) runs at the first instant after the gap (03:00 new time). Several matches inside one gap
  collapse into that single run, which is also the run of a match at 03:00 itself;
* a wall time repeated by a fall-back change (01:30 happens twice) runs once, at its first
  occurrence (still summer time). A job matching every few minutes therefore pauses for the
  repeated hour; use ``tz='UTC'`` or an interval for jobs that must not.
"""

from __future__ import annotations

import abc
import copy
import datetime as dt
from collections.abc import Iterator
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from .errors import ConfigError

__all__ = ["Cron", "Interval", "Schedule", "parse_schedule", "resolve_tz"]

UTC = dt.timezone.utc
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
_MS = dt.timedelta(milliseconds=1)

#: The usual macros, as 5-field specs. ``@reboot`` has no slot and is refused.
MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

MIN_INTERVAL_MS = 1000


def to_ms(instant: dt.datetime) -> int:
    """An aware datetime as integer epoch milliseconds (exact, no float rounding)."""
    return (instant - EPOCH) // _MS


def from_ms(ms: int) -> dt.datetime:
    """Integer epoch milliseconds as an aware UTC datetime."""
    return EPOCH + dt.timedelta(milliseconds=ms)


def resolve_tz(tz: Any) -> dt.tzinfo:
    """A time zone from an IANA name or a tzinfo; ConfigError for anything else."""
    if isinstance(tz, dt.tzinfo):
        return tz
    if isinstance(tz, str) and tz:
        try:
            return ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ConfigError(f"unknown time zone {tz!r}: use an IANA name such as 'Europe/Paris' or 'UTC'") from exc
    raise ConfigError(f"time zone must be an IANA name or a tzinfo, not {tz!r}")


class Schedule(abc.ABC):
    """Maps time to slots. Implementations are immutable and deterministic."""

    @abc.abstractmethod
    def next_slot(self, after_ms: int) -> int:
        """The first slot strictly later than ``after_ms`` (epoch milliseconds)."""

    @abc.abstractmethod
    def describe(self) -> str:
        """A short human-readable form, e.g. ``cron '*/5 * * * *' Europe/Paris``."""

    def slots(self, start_ms: int, end_ms: int) -> Iterator[int]:
        """Every slot in ``[start_ms, end_ms)``, in order."""
        slot = self.next_slot(start_ms - 1)
        while slot < end_ms:
            yield slot
            slot = self.next_slot(slot)


class Interval(Schedule):
    """Every ``every_ms`` milliseconds, aligned to the Unix epoch: slots are ``k * every_ms``."""

    __slots__ = ("every_ms",)

    def __init__(self, every_ms: int) -> None:
        if isinstance(every_ms, bool) or not isinstance(every_ms, int):
            raise ConfigError(f"interval must be an integer number of milliseconds, not {every_ms!r}")
        if every_ms < MIN_INTERVAL_MS:
            raise ConfigError(f"interval of {every_ms} ms is too short: the minimum is {MIN_INTERVAL_MS} ms")
        self.every_ms = every_ms

    def next_slot(self, after_ms: int) -> int:
        return (after_ms // self.every_ms + 1) * self.every_ms

    def describe(self) -> str:
        seconds, ms = divmod(self.every_ms, 1000)
        return f"every {seconds}.{ms:03d}s" if ms else f"every {seconds}s"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Interval) and other.every_ms == self.every_ms

    def __hash__(self) -> int:
        return hash(("interval", self.every_ms))

    def __repr__(self) -> str:
        return f"Interval(every_ms={self.every_ms})"


class Cron(Schedule):
    """A cron spec on the wall clock of a time zone.

    Five fields (minute hour day-of-month month day-of-week), or six with *seconds first*
    (``*/10 * * * * *`` is every 10 seconds), or a macro such as ``@hourly``. ``day_or`` is cron's
    rule when both day fields are restricted (a day matches if either does); Celery ``crontab``
    entries use ``day_or=False`` (both must match), as Celery does.
    """

    __slots__ = ("spec", "tz", "day_or", "_seconds", "_parsed")

    def __init__(self, spec: str, tz: Any = "UTC", *, day_or: bool = True) -> None:
        if not isinstance(spec, str):
            raise ConfigError(f"cron spec must be a string, not {spec!r}")
        text = " ".join(spec.split())
        text = MACROS.get(text.lower(), text)
        if text.startswith("@"):
            raise ConfigError(f"unsupported cron macro {spec!r}: use one of {', '.join(sorted(MACROS))}")
        fields = text.split(" ")
        if len(fields) not in (5, 6):
            raise ConfigError(
                f"invalid cron spec {spec!r}: expected 5 fields (minute hour day month weekday) "
                f"or 6 with seconds first, got {len(fields)}"
            )
        for field in fields:
            upper = field.upper()
            if upper.startswith(("H", "R")):
                # croniter's hashed (H) and random (R) fields would differ between instances.
                raise ConfigError(
                    f"invalid cron spec {spec!r}: hashed or random fields ({field!r}) would give "
                    "each instance different slots; write the values out"
                )
        self._seconds = len(fields) == 6
        if not croniter.is_valid(text, second_at_beginning=self._seconds):
            raise ConfigError(f"invalid cron spec {spec!r}: see `man 5 crontab` for the syntax")
        self.spec = text
        self.tz = resolve_tz(tz)
        self.day_or = day_or
        self._parsed: croniter | None = None
        try:  # is_valid() does not catch everything (e.g. "0 0 31 2 *" never matches)
            self.next_slot(0)
        except (ValueError, KeyError, OverflowError) as exc:
            raise ConfigError(f"invalid cron spec {spec!r}: {exc}") from exc

    def next_slot(self, after_ms: int) -> int:
        after = from_ms(after_ms)
        wall = after.astimezone(self.tz).replace(tzinfo=None)
        if self._parsed is None:
            self._parsed = croniter(
                self.spec,
                wall,
                day_or=self.day_or,
                second_at_beginning=self._seconds,
                max_years_between_matches=50,
            )
        # Parsing the spec is most of a fresh croniter's cost: a copy of the parsed one, set to
        # `after`, finds the same matches (and leaves it to other callers unchanged).
        it = copy.copy(self._parsed)
        it.set_current(wall, force=True)
        # Usually the first match is it; inside the second pass of a repeated (fall-back) hour,
        # matches map to their first occurrence, which is earlier than `after`, so skip them.
        while True:
            candidate = it.get_next(dt.datetime)
            slot = self._to_slot(candidate)
            if slot > after_ms:
                return slot

    def _to_slot(self, wall: dt.datetime) -> int:
        """The instant of a wall time under the DST rules in the module docstring."""
        first = wall.replace(tzinfo=self.tz, fold=0)
        slot = to_ms(first)
        if first.astimezone(UTC).astimezone(self.tz).replace(tzinfo=None) == wall:
            return slot  # exists (a repeated wall time gets fold=0: its first occurrence)
        # In a spring-forward gap. fold=0 used the offset from before the change, which lands
        # after the change; fold=1 used the later offset, which lands before it. The change lies
        # between: find it, to the second.
        lo = to_ms(wall.replace(tzinfo=self.tz, fold=1)) // 1000
        hi = slot // 1000
        offset_after = from_ms(slot).astimezone(self.tz).utcoffset()
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if from_ms(mid * 1000).astimezone(self.tz).utcoffset() == offset_after:
                hi = mid
            else:
                lo = mid
        return hi * 1000

    def describe(self) -> str:
        return f"cron '{self.spec}' {self.tz}"

    def __eq__(self, other: object) -> bool:
        # The time zones themselves, not their names: two fixed offsets may share a name.
        return isinstance(other, Cron) and (other.spec, other.tz, other.day_or) == (self.spec, self.tz, self.day_or)

    def __hash__(self) -> int:
        return hash(("cron", self.spec, self.tz, self.day_or))

    def __repr__(self) -> str:
        return f"Cron({self.spec!r}, tz={str(self.tz)!r}, day_or={self.day_or})"


def _crontab_field(values: set[int], full: range) -> str:
    if set(full) <= values:
        return "*"
    return ",".join(str(v) for v in sorted(values))


def _from_crontab(entry: Any, tz: dt.tzinfo) -> Cron:
    spec = " ".join(
        (
            _crontab_field(entry.minute, range(60)),
            _crontab_field(entry.hour, range(24)),
            _crontab_field(entry.day_of_month, range(1, 32)),
            _crontab_field(entry.month_of_year, range(1, 13)),
            _crontab_field(entry.day_of_week, range(7)),
        )
    )
    return Cron(spec, tz, day_or=False)  # Celery's crontab needs both day fields to match


def parse_schedule(value: Any, tz: Any = "UTC") -> Schedule:
    """A Schedule from what users write.

    Accepts a cron string or macro, a Celery ``crontab``, a Celery ``schedule`` (interval), a
    ``timedelta``, a number of seconds, or a Schedule. ``tz`` applies to cron forms only.
    """
    from celery import schedules as celery_schedules

    if isinstance(value, Schedule):
        return value
    if isinstance(value, str):
        return Cron(value, tz)
    if isinstance(value, celery_schedules.crontab):
        return _from_crontab(value, resolve_tz(tz))
    if isinstance(value, celery_schedules.solar):
        raise ConfigError("solar schedules are not supported: use a cron spec in the place's time zone")
    if isinstance(value, celery_schedules.schedule):
        if getattr(value, "relative", False):
            raise ConfigError("relative intervals are not supported: intervals align to the epoch")
        value = value.run_every
    if isinstance(value, dt.timedelta):
        every_ms, rest = divmod(value, _MS)
        if rest:
            raise ConfigError(f"interval {value} is not a whole number of milliseconds")
        return Interval(every_ms)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        every_ms = round(value * 1000)
        if abs(every_ms - value * 1000) > 1e-6:
            raise ConfigError(f"interval of {value!r} s is not a whole number of milliseconds")
        return Interval(every_ms)
    raise ConfigError(
        f"unsupported schedule {value!r}: use a cron string, a Celery crontab, a timedelta or a number of seconds"
    )
