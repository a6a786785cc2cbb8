"""Schedules: when a job runs, as *slots*.

A slot is a run's scheduled instant in integer milliseconds since the Unix epoch (UTC). Every
instance computes the same slots from the same configuration, whenever it started: that is what
lets several beat instances race for the same run. This module is pure (no clock, no I/O).

Intervals are aligned to the Unix epoch: a job every 10 minutes runs at :00, :10, :20..., not
10 minutes after the process started as plain celery beat does.

Cron schedules are evaluated on the wall clock of the job's time zone. Around daylight saving
time changes they follow cron's own rule (Debian's cron(8), "daylight savings time"):

* a wall time skipped by a spring-forward change (02:30 on the night clocks jump from 02:00 to
  03:00) runs at the first instant after the gap (03:00 new time). Several matches inside one gap
  collapse into that single run, which is also the run of a match at 03:00 itself;
* at a fall-back change (02:00-03:00 happens twice), a job whose minute or hour field has a
  wildcard, a step or a range (``*/5 * * * *``, ``30 * * * *``, ``0 1-3 * * *``) runs by the new
  time at once: it runs in both passes of the repeated hour and keeps its rhythm. A job at fixed
  times of day (``30 2 * * *``, ``0 2,14 * * *``) runs once, at the first occurrence.
"""

from __future__ import annotations

import abc
import collections
import copy
import datetime as dt
from collections.abc import Iterator, Mapping
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from .errors import ConfigError

__all__ = ["Cron", "Interval", "Schedule", "parse_schedule", "resolve_tz"]

UTC = dt.timezone.utc
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
_MS = dt.timedelta(milliseconds=1)
_SECOND = dt.timedelta(seconds=1)
_DAY_MS = 86_400_000

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


def _naive(ms: int, offset: dt.timedelta) -> dt.datetime:
    """The wall time of an instant under a UTC offset, without a tzinfo."""
    return (from_ms(ms) + offset).replace(tzinfo=None)


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
        """A short human-readable form, e.g. ``cron '*/5 * * * *' Europe/Paris``: the text every
        instance compares (a job's definition, its catch-up key), so it never changes for a
        schedule that runs the same slots."""

    def display(self) -> str:
        """The schedule as people read it where jobs are listed (``jobs``, the schedules page):
        in the form it was written in, where :meth:`describe` would read otherwise (a Celery
        ``crontab``). By default, :meth:`describe`."""
        return self.describe()

    def slots(self, start_ms: int, end_ms: int) -> Iterator[int]:
        """Every slot in ``[start_ms, end_ms)``, in order."""
        slot = self.next_slot(start_ms - 1)
        while slot < end_ms:
            yield slot
            slot = self.next_slot(slot)

    def last_slot(self, start_ms: int, end_ms: int) -> int | None:
        """The latest slot in ``[start_ms, end_ms)``, or None. Looks back from ``end_ms`` over
        spans that double, so that it costs about the slots of the last span, not of the range."""
        span = 60_000
        while True:
            low = max(start_ms, end_ms - span)
            found = collections.deque(self.slots(low, end_ms), maxlen=1)
            if found or low == start_ms:
                return found[0] if found else None
            span *= 2


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

    def last_slot(self, start_ms: int, end_ms: int) -> int | None:
        last = (end_ms - 1) // self.every_ms * self.every_ms
        return last if last >= start_ms else None

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

    __slots__ = ("spec", "tz", "day_or", "wildcard", "crontab", "_seconds", "_parsed")

    def __init__(
        self,
        spec: str,
        tz: Any = "UTC",
        *,
        day_or: bool = True,
        wildcard: bool | None = None,
        crontab: Mapping[str, str] | None = None,
    ) -> None:
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
        minute, hour = fields[1:3] if self._seconds else fields[0:2]
        #: Whether the job runs in both passes of a repeated hour (see the module docstring):
        #: cron's "wildcard" job, from the spec unless given (a Celery crontab's own fields).
        self.wildcard = any(c in minute + hour for c in "*/-") if wildcard is None else wildcard
        if not croniter.is_valid(text, second_at_beginning=self._seconds):
            raise ConfigError(f"invalid cron spec {spec!r}: see `man 5 crontab` for the syntax")
        self.spec = text
        self.tz = resolve_tz(tz)
        self.day_or = day_or
        #: The fields of the Celery ``crontab`` this was made from, as written (``{"day_of_month":
        #: "1-7", ...}``), for :meth:`display`; None for a cron string. Not part of its identity.
        self.crontab = dict(crontab) if crontab is not None else None
        self._parsed: croniter | None = None
        try:  # is_valid() does not catch everything (e.g. "0 0 31 2 *" never matches)
            self.next_slot(0)
        except (ValueError, KeyError, OverflowError) as exc:
            raise ConfigError(f"invalid cron spec {spec!r}: {exc}") from exc

    def next_slot(self, after_ms: int) -> int:
        # Walk the wall clock from `after_ms`, one stretch of constant UTC offset at a time: a
        # match is an instant only if no offset change lies between; otherwise the change
        # decides (spring forward: the gap's matches run at the change; fall back: the repeated
        # hour is walked again by wildcard jobs, skipped by the others).
        t, offset = after_ms, self._offset(after_ms)
        wall_from, inclusive = _naive(t, offset), False
        if not self.wildcard:
            repeat_end = self._end_of_second_pass(t, offset)
            if repeat_end is not None:
                wall_from, inclusive = repeat_end, True
        while True:
            match = self._match(wall_from, inclusive)
            candidate = to_ms(match.replace(tzinfo=UTC) - offset)
            change = self._change(t, candidate, offset)
            if change is None:
                return candidate
            new_offset = self._offset(change)
            if new_offset > offset:  # spring forward: the walls in [old, new) never happen
                gap_end = _naive(change, new_offset)
                if match <= gap_end:
                    return change
                wall_from = gap_end
            else:  # fall back: the walls in [new, old) happen again
                wall_from = _naive(change, new_offset if self.wildcard else offset)
            t, offset, inclusive = change, new_offset, True

    def _offset(self, ms: int) -> dt.timedelta:
        return from_ms(ms).astimezone(self.tz).utcoffset() or dt.timedelta(0)

    def _match(self, wall: dt.datetime, inclusive: bool) -> dt.datetime:
        """The first wall time matching the spec after ``wall`` (or at it, when inclusive)."""
        if self._parsed is None:
            self._parsed = croniter(
                self.spec,
                wall,
                day_or=self.day_or,
                second_at_beginning=self._seconds,
                max_years_between_matches=50,
            )
        # Parsing the spec is most of a fresh croniter's cost: a copy of the parsed one, set to
        # `wall`, finds the same matches (and leaves it to other callers unchanged).
        it = copy.copy(self._parsed)
        it.set_current(wall - _SECOND if inclusive else wall, force=True)
        match: dt.datetime = it.get_next(dt.datetime)
        return match

    def _change(self, lo: int, hi: int, offset: dt.timedelta) -> int | None:
        """The first instant in ``(lo, hi]`` whose UTC offset is not ``offset``, if any."""
        while lo < hi:
            step = min(hi, lo + _DAY_MS)  # no zone changes its offset twice within a day
            if self._offset(step) != offset:
                while step - lo > 1:
                    mid = (lo + step) // 2
                    if self._offset(mid) == offset:
                        lo = mid
                    else:
                        step = mid
                return step
            lo = step
        return None

    def _end_of_second_pass(self, t: int, offset: dt.timedelta) -> dt.datetime | None:
        """Where the repeated walls end, when ``t`` is in the second pass of a fall-back hour."""
        wall = _naive(t, offset)
        first = to_ms(wall.replace(tzinfo=self.tz, fold=0))
        if first >= t:
            return None
        before = self._offset(first)
        change = self._change(first, t, before)
        return None if change is None else _naive(change, before)

    def describe(self) -> str:
        return f"cron '{self.spec}' {self.tz}"

    def display(self) -> str:
        """A cron string as written; a Celery crontab (``day_or`` False: day of month *and* day of
        week must match, where cron's rule takes either) as the crontab it is, with the fields
        given: ``crontab(minute='0', hour='9', day_of_week='1', day_of_month='1-7') UTC``."""
        if self.day_or:
            return self.describe()
        fields = self.crontab
        if fields is None:
            if self._seconds:
                return f"{self.describe()} (day of month and day of week must both match)"
            fields = dict(zip(_CRONTAB_ORDER, self.spec.split(" ")))
        given = ", ".join(f"{key}={fields[key]!r}" for key in _CRONTAB_ARGS if fields.get(key, "*") != "*")
        return f"crontab({given}) {self.tz}"

    def __eq__(self, other: object) -> bool:
        # The time zones themselves, not their names: two fixed offsets may share a name.
        return isinstance(other, Cron) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(("cron", *self._key()))

    def _key(self) -> tuple[Any, ...]:
        return (self.spec, self.tz, self.day_or, self.wildcard)

    def __repr__(self) -> str:
        return f"Cron({self.spec!r}, tz={str(self.tz)!r}, day_or={self.day_or}, wildcard={self.wildcard})"


#: A crontab's fields in cron's order, and in the order of ``crontab()``'s arguments.
_CRONTAB_ORDER = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
_CRONTAB_ARGS = ("minute", "hour", "day_of_week", "day_of_month", "month_of_year")


def _as_written(value: Any) -> str:
    """A crontab field as its ``crontab()`` argument was given: text, a number, or a collection."""
    if isinstance(value, str):
        return "".join(value.split())
    if isinstance(value, int):
        return str(value)
    try:
        return ",".join(str(item) for item in sorted(value))
    except TypeError:
        return str(value)


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
    # The fields as written decide cron's DST rule: minute="*/15" is a step, even as a list here.
    written = f"{entry._orig_minute} {entry._orig_hour}"
    wildcard = any(c in written for c in "*/-")
    given = {key: _as_written(getattr(entry, f"_orig_{key}", "*")) for key in _CRONTAB_ORDER}
    # Celery's crontab needs both day fields to match.
    return Cron(spec, tz, day_or=False, wildcard=wildcard, crontab=given)


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
    if isinstance(value, Mapping) and set(value) == {"crontab"}:  # a Celery crontab, as JSON holds it
        value = _crontab_of(value["crontab"])
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
        f"unsupported schedule {value!r}: use a cron string, a Celery crontab ({{'crontab': 'm h dom mon dow'}} "
        "in JSON), a timedelta or a number of seconds"
    )


def _crontab_of(fields: Any) -> Any:
    """A Celery ``crontab`` of its five fields, written as a cron string (``"0 9 1-7 * 1"``): day of
    month and day of week must then both match, as in Celery (a cron string runs on either)."""
    from celery import schedules as celery_schedules

    parts = fields.split() if isinstance(fields, str) else []
    if len(parts) != 5:
        raise ConfigError(f"a crontab is five fields, minute hour day-of-month month day-of-week, not {fields!r}")
    minute, hour, day_of_month, month_of_year, day_of_week = parts
    try:
        return celery_schedules.crontab(
            minute=minute, hour=hour, day_of_month=day_of_month, month_of_year=month_of_year, day_of_week=day_of_week
        )
    except ValueError as exc:
        raise ConfigError(f"crontab {fields!r}: {exc}") from None
