"""Slots from cron specs, crontabs and intervals: tables and properties, no broker."""

from __future__ import annotations

import datetime as dt
import itertools
from zoneinfo import ZoneInfo

import pytest
from celery.schedules import crontab, schedule, solar
from croniter import croniter
from hypothesis import given, settings
from hypothesis import strategies as st

from anarchon_celery import ConfigError, Cron, Interval
from anarchon_celery.schedule import from_ms, parse_schedule, to_ms

UTC = dt.timezone.utc


def at(*args: int, tz: str = "UTC") -> int:
    """Epoch ms of a wall time; for UTC or an unambiguous local time."""
    return to_ms(dt.datetime(*args, tzinfo=ZoneInfo(tz)))


def utc(ms: int) -> dt.datetime:
    return from_ms(ms).replace(tzinfo=UTC)


def run_times(sched, start: dt.datetime, count: int, tz: str) -> list[str]:
    """The next `count` runs after `start`, as local ISO times with offsets."""
    out, slot = [], to_ms(start)
    for _ in range(count):
        slot = sched.next_slot(slot)
        out.append(from_ms(slot).astimezone(ZoneInfo(tz)).isoformat())
    return out


# -- intervals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "after, every, expected",
    [
        (0, 1000, 1000),
        (999, 1000, 1000),
        (1000, 1000, 2000),
        (-1, 1000, 0),
        (at(2026, 1, 1, 0, 4, 59), 300_000, at(2026, 1, 1, 0, 5)),
        (at(2026, 1, 1, 0, 5), 300_000, at(2026, 1, 1, 0, 10)),
        (1_796_227_653_001, 7000, 1_796_227_653_001 // 7000 * 7000 + 7000),
    ],
)
def test_interval_slots_are_aligned_to_the_epoch(after: int, every: int, expected: int) -> None:
    assert Interval(every).next_slot(after) == expected


@pytest.mark.parametrize(
    "value, every_ms",
    [
        (dt.timedelta(seconds=10), 10_000),
        (dt.timedelta(minutes=5), 300_000),
        (30, 30_000),
        (2.5, 2_500),
        (schedule(dt.timedelta(seconds=15)), 15_000),
    ],
)
def test_interval_forms(value: object, every_ms: int) -> None:
    assert parse_schedule(value) == Interval(every_ms)


@pytest.mark.parametrize(
    "value, message",
    [
        (dt.timedelta(milliseconds=500), "too short"),
        (0, "too short"),
        (-5, "too short"),
        (1.0005, "whole number of milliseconds"),
        (dt.timedelta(microseconds=1_000_500), "whole number of milliseconds"),
        (True, "unsupported schedule"),
        (None, "unsupported schedule"),
        ([1, 2], "unsupported schedule"),
        (schedule(dt.timedelta(seconds=5), relative=True), "relative"),
        (solar.__new__(solar), "solar"),  # built bare: solar() needs the ephem package
    ],
)
def test_bad_schedules_are_refused(value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_schedule(value)


# -- cron -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, start, expected",
    [
        ("*/15 * * * *", dt.datetime(2026, 1, 1, 0, 7), ["00:15", "00:30", "00:45", "01:00"]),
        ("0 9 * * 1-5", dt.datetime(2026, 1, 2, 10, 0), ["01-05T09:00", "01-06T09:00"]),
        ("@hourly", dt.datetime(2026, 1, 1, 0, 0), ["01:00", "02:00"]),
        ("@daily", dt.datetime(2026, 1, 1, 0, 0), ["01-02T00:00", "01-03T00:00"]),
        ("*/20 * * * * *", dt.datetime(2026, 1, 1, 0, 0, 5), ["00:00:20", "00:00:40", "00:01:00"]),
        ("0 0 1 * *", dt.datetime(2026, 1, 15), ["02-01T00:00", "03-01T00:00"]),
        # cron's rule: both day fields restricted means either may match
        ("0 0 13 * 5", dt.datetime(2026, 2, 1), ["02-06T00:00", "02-13T00:00", "02-20T00:00"]),
    ],
)
def test_cron_table(spec: str, start: dt.datetime, expected: list[str]) -> None:
    got = run_times(Cron(spec), start.replace(tzinfo=UTC), len(expected), "UTC")
    for iso, want in zip(got, expected):
        assert want in iso, (got, expected)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("61 * * * *", "invalid cron spec"),
        ("* * *", "expected 5 fields"),
        ("* * * * * * *", "expected 5 fields"),
        ("", "expected 5 fields"),
        ("H * * * *", "hashed or random"),
        ("R * * * *", "hashed or random"),
        ("@reboot", "unsupported cron macro"),
        ("@fortnightly", "unsupported cron macro"),
        ("0 0 31 2 *", "invalid cron spec"),
        ("x y z w v", "invalid cron spec"),
    ],
)
def test_bad_cron_specs_are_refused(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Cron(spec)


def test_unknown_time_zone_is_refused() -> None:
    with pytest.raises(ConfigError, match="unknown time zone 'Mars/Olympus'"):
        Cron("* * * * *", "Mars/Olympus")


def test_cron_in_a_time_zone() -> None:
    got = run_times(Cron("0 9 * * *", "Asia/Tokyo"), dt.datetime(2026, 5, 31, 12, tzinfo=UTC), 1, "UTC")
    assert got == ["2026-06-01T00:00:00+00:00"]  # 09:00 in Tokyo


def test_celery_crontab_needs_both_day_fields() -> None:
    # Celery's crontab matches when day_of_month AND day_of_week match (cron would take either).
    sched = parse_schedule(crontab(minute=0, hour=0, day_of_month=13, day_of_week=5), "UTC")
    got = run_times(sched, dt.datetime(2026, 1, 1, tzinfo=UTC), 2, "UTC")
    assert got == ["2026-02-13T00:00:00+00:00", "2026-03-13T00:00:00+00:00"]  # Fridays the 13th


def test_celery_crontab_forms() -> None:
    sched = parse_schedule(crontab(minute="*/15", hour="9-17", day_of_week="mon-fri"), "Europe/Paris")
    spec = "0,15,30,45 9,10,11,12,13,14,15,16,17 * * 1,2,3,4,5"
    assert sched == Cron(spec, "Europe/Paris", day_or=False, wildcard=True)  # "*/15" is a step
    got = run_times(sched, dt.datetime(2026, 1, 2, 16, 50, tzinfo=UTC), 2, "Europe/Paris")
    assert got == ["2026-01-05T09:00:00+01:00", "2026-01-05T09:15:00+01:00"]  # Friday 17:50 -> Monday


@pytest.mark.parametrize(
    ("value", "shown", "described"),
    [
        (  # a django-celery-beat crontab, as its JSON holds it: both day fields restrict
            {"crontab": "0 9 1-7 * 1"},
            "crontab(minute='0', hour='9', day_of_week='1', day_of_month='1-7') Europe/Paris",
            "cron '0 9 1,2,3,4,5,6,7 * 1' Europe/Paris",
        ),
        (
            crontab(minute="*/15", hour="9-17", day_of_week="mon-fri"),
            "crontab(minute='*/15', hour='9-17', day_of_week='mon-fri') Europe/Paris",
            "cron '0,15,30,45 9,10,11,12,13,14,15,16,17 * * 1,2,3,4,5' Europe/Paris",
        ),
        (crontab(minute=0, hour={2, 14}), "crontab(minute='0', hour='2,14') Europe/Paris", None),
        (crontab(), "crontab() Europe/Paris", "cron '* * * * *' Europe/Paris"),
        (
            Cron("0 9 1-7 * 1", "UTC", day_or=False),
            "crontab(minute='0', hour='9', day_of_week='1', day_of_month='1-7') UTC",
            None,
        ),
        (  # cron strings and intervals read as written, as before
            "0 9 1-7 * 1",
            "cron '0 9 1-7 * 1' Europe/Paris",
            "cron '0 9 1-7 * 1' Europe/Paris",
        ),
        (90, "every 90s", "every 90s"),
    ],
)
def test_a_schedule_is_shown_in_the_form_it_was_written(value: object, shown: str, described: str | None) -> None:
    """A Celery crontab is shown as one, not as a cron string (whose day fields are or-ed). What
    instances compare, describe(), is unchanged: the same slots, the same text."""
    sched = parse_schedule(value, "Europe/Paris")
    assert sched.display() == shown
    if described is not None:
        assert sched.describe() == described


# -- daylight saving time -------------------------------------------------------------------------

DST_CASES = [
    # Spring forward: 02:00 -> 03:00 local. Skipped wall times run at the first instant after
    # the gap (03:00 new time); several matches in the gap collapse into that one run.
    (
        "Europe/Berlin",
        "30 2 * * *",
        dt.datetime(2026, 3, 28, 12),
        ["2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"],
    ),
    (
        "Europe/Berlin",
        "*/20 * * * *",
        dt.datetime(2026, 3, 29, 0, 30),
        ["2026-03-29T01:40:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-29T03:20:00+02:00"],
    ),
    (
        "America/New_York",
        "30 2 * * *",
        dt.datetime(2026, 3, 7, 12),
        ["2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00"],
    ),
    (
        "America/New_York",
        "0,30 2,3 * * *",
        dt.datetime(2026, 3, 8, 5),
        ["2026-03-08T03:00:00-04:00", "2026-03-08T03:30:00-04:00", "2026-03-09T02:00:00-04:00"],
    ),
    # Fall back: 03:00 -> 02:00 (Berlin), 02:00 -> 01:00 (New York). A job at a fixed time of day
    # runs once, at the first occurrence of a repeated wall time; a job with a wildcard, step or
    # range in its minute or hour field runs by the new time at once (cron's rule), through both
    # passes of the repeated hour.
    (
        "Europe/Berlin",
        "30 2 * * *",
        dt.datetime(2026, 10, 24, 12),
        ["2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"],
    ),
    (
        "Europe/Berlin",
        "0 2,14 * * *",
        dt.datetime(2026, 10, 24, 23),
        ["2026-10-25T02:00:00+02:00", "2026-10-25T14:00:00+01:00"],
    ),
    (
        "Europe/Berlin",
        "*/30 * * * *",
        dt.datetime(2026, 10, 24, 23, 10),
        [
            "2026-10-25T01:30:00+02:00",
            "2026-10-25T02:00:00+02:00",
            "2026-10-25T02:30:00+02:00",
            "2026-10-25T02:00:00+01:00",
            "2026-10-25T02:30:00+01:00",
            "2026-10-25T03:00:00+01:00",
        ],
    ),
    (
        "Europe/Paris",
        "*/5 * * * *",
        dt.datetime(2026, 10, 25, 0, 50),
        [
            "2026-10-25T02:55:00+02:00",
            "2026-10-25T02:00:00+01:00",
            "2026-10-25T02:05:00+01:00",
        ],
    ),
    (
        "Europe/Paris",
        "30 * * * *",
        dt.datetime(2026, 10, 24, 23, 40),
        ["2026-10-25T02:30:00+02:00", "2026-10-25T02:30:00+01:00", "2026-10-25T03:30:00+01:00"],
    ),
    (
        "Europe/Paris",
        "0 1-3 * * *",
        dt.datetime(2026, 10, 24, 22),
        [
            "2026-10-25T01:00:00+02:00",
            "2026-10-25T02:00:00+02:00",
            "2026-10-25T02:00:00+01:00",
            "2026-10-25T03:00:00+01:00",
            "2026-10-26T01:00:00+01:00",
        ],
    ),
    (
        "Europe/Paris",
        "0 3 * * *",
        dt.datetime(2026, 10, 24, 12),
        ["2026-10-25T03:00:00+01:00", "2026-10-26T03:00:00+01:00"],
    ),
    (
        "America/New_York",
        "30 1 * * *",
        dt.datetime(2026, 10, 31, 12),
        ["2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"],
    ),
    (
        "America/New_York",
        "*/30 * * * *",
        dt.datetime(2026, 11, 1, 4, 50),
        [
            "2026-11-01T01:00:00-04:00",
            "2026-11-01T01:30:00-04:00",
            "2026-11-01T01:00:00-05:00",
            "2026-11-01T01:30:00-05:00",
            "2026-11-01T02:00:00-05:00",
        ],
    ),
    (
        "Europe/Paris",
        "*/20 * * * * *",
        dt.datetime(2026, 10, 25, 0, 59, 30),
        ["2026-10-25T02:59:40+02:00", "2026-10-25T02:00:00+01:00", "2026-10-25T02:00:20+01:00"],
    ),
    # A 30-minute change.
    (
        "Australia/Lord_Howe",
        "0 3 * * *",
        dt.datetime(2026, 4, 3, 12),
        ["2026-04-04T03:00:00+11:00", "2026-04-05T03:00:00+10:30"],
    ),
]


@pytest.mark.parametrize("tz, spec, start, expected", DST_CASES)
def test_dst_transitions(tz: str, spec: str, start: dt.datetime, expected: list[str]) -> None:
    assert run_times(Cron(spec, tz), start.replace(tzinfo=UTC), len(expected), tz) == expected


def test_a_fixed_time_job_started_in_the_repeated_hour_resumes_after_it() -> None:
    # 01:10 UTC on 2026-10-25 is 02:10 CET, the second pass of Berlin's repeated hour (02:00-03:00
    # wall): 02:30 ran in the first pass, and 03:00 is the next run of a job at fixed times.
    second_pass = dt.datetime(2026, 10, 25, 1, 10, tzinfo=UTC)
    got = run_times(Cron("30 2,3 * * *", "Europe/Berlin"), second_pass, 2, "Europe/Berlin")
    assert got == ["2026-10-25T03:30:00+01:00", "2026-10-26T02:30:00+01:00"]
    got = run_times(Cron("0 2,3 * * *", "Europe/Berlin"), second_pass, 1, "Europe/Berlin")
    assert got == ["2026-10-25T03:00:00+01:00"]


def test_a_wildcard_job_started_in_the_repeated_hour_runs_by_the_new_time() -> None:
    second_pass = dt.datetime(2026, 10, 25, 1, 10, tzinfo=UTC)
    got = run_times(Cron("*/30 * * * *", "Europe/Berlin"), second_pass, 2, "Europe/Berlin")
    assert got == ["2026-10-25T02:30:00+01:00", "2026-10-25T03:00:00+01:00"]


@pytest.mark.parametrize(
    "spec, wildcard",
    [
        ("*/5 * * * *", True),
        ("30 * * * *", True),
        ("0 1-3 * * *", True),
        ("@hourly", True),
        ("* 2 * * *", True),
        ("0 */2 * * *", True),
        ("30 2 * * *", False),
        ("0 2,14 * * *", False),
        ("@daily", False),
        ("0 30 2 * * *", False),
        ("*/10 30 2 * * *", False),  # the seconds field does not count, as cron has none
        ("0 */5 2 * * *", True),
    ],
)
def test_which_jobs_follow_the_new_time(spec: str, wildcard: bool) -> None:
    assert Cron(spec, "Europe/Paris").wildcard is wildcard


@pytest.mark.parametrize(
    "entry, wildcard",
    [
        (crontab(minute="*/15"), True),
        (crontab(minute=0, hour="9-17"), True),
        (crontab(minute=0, hour=2), False),
        (crontab(minute="0,30", hour="2"), False),
        (crontab(minute=0, hour="*/3"), True),
    ],
)
def test_a_celery_crontab_follows_the_fields_as_written(entry: crontab, wildcard: bool) -> None:
    assert parse_schedule(entry, "Europe/Paris").wildcard is wildcard  # type: ignore[attr-defined]


# -- properties -----------------------------------------------------------------------------------

SPECS = st.sampled_from(
    [
        "* * * * *",
        "*/7 * * * *",
        "30 2 * * *",
        "0 1-3 * * *",
        "15,45 * * * 0,6",
        "0 0 29 2 *",
        "*/10 * * * * *",
        "30 */5 2 * * *",
        "@hourly",
        "0 0 13 * 5",
    ]
)
ZONES = st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"])
INSTANTS = st.integers(min_value=at(2024, 1, 1), max_value=at(2030, 12, 31))


@settings(max_examples=300, deadline=None)
@given(SPECS, ZONES, INSTANTS)
def test_next_slot_is_later_and_every_start_agrees(spec: str, tz: str, after: int) -> None:
    sched = Cron(spec, tz)
    first = sched.next_slot(after)
    second = sched.next_slot(first)
    assert after < first < second
    # An instance that starts anywhere between two slots computes the same next slot.
    for start in (after + 1, (after + first) // 2, first - 1):
        if start < first:
            assert sched.next_slot(start) == first


@settings(max_examples=150, deadline=None)
@given(
    SPECS | st.sampled_from(["0 0 L * *", "0 12 15W * *", "0 9 * * 5#3", "30 6 * * 1#1,3#2", "0 0 13 * 5"]),
    ZONES,
    st.booleans(),
    st.lists(INSTANTS, min_size=2, max_size=6),
)
def test_a_cron_asked_again_answers_as_a_new_one(spec: str, tz: str, day_or: bool, instants: list[int]) -> None:
    # A Cron keeps its parsed spec between calls: no earlier call may change a later answer.
    shared = Cron(spec, tz, day_or=day_or)
    for after in instants:
        fresh = Cron(spec, tz, day_or=day_or)
        fresh._parsed = None  # the spec parsed again, for this call alone
        assert shared.next_slot(after) == fresh.next_slot(after)


@settings(max_examples=100, deadline=None)
@given(SPECS, ZONES, INSTANTS)
def test_each_wall_clock_match_of_a_fixed_time_job_fires_at_most_once(spec: str, tz: str, start: int) -> None:
    sched = Cron(spec, tz, wildcard=False)
    slots = list(itertools.islice(sched.slots(start, start + 3 * 86_400_000), 300))
    assert slots == sorted(set(slots))
    walls = [from_ms(s).astimezone(ZoneInfo(tz)).replace(tzinfo=None) for s in slots]
    assert len(walls) == len(set(walls))


TRANSITIONS = st.sampled_from(
    [
        ("Europe/Paris", at(2026, 10, 25, 1)),
        ("Europe/Paris", at(2027, 3, 28, 1)),
        ("America/New_York", at(2026, 11, 1, 6)),
        ("America/New_York", at(2026, 3, 8, 7)),
        ("Australia/Lord_Howe", at(2026, 4, 4, 15)),
        ("Australia/Lord_Howe", at(2026, 10, 3, 15, 30)),
    ]
)
MINUTE_SPECS = st.sampled_from(["* * * * *", "*/7 * * * *", "*/5 * * * *", "15,45 * * * *", "0 1-3 * * *", "@hourly"])


@settings(max_examples=60, deadline=None)
@given(MINUTE_SPECS, TRANSITIONS, st.integers(min_value=-4 * 60, max_value=60))
def test_a_wildcard_job_runs_at_every_instant_whose_wall_time_matches(
    spec: str, change: tuple[str, int], minutes: int
) -> None:
    # Checked minute by minute against croniter's own match, around a change of either kind: a
    # wildcard job's slots are the instants whose wall time (as the clock shows it then) matches,
    # with the matches inside a spring-forward gap moved to the first instant after it.
    tz, at_change = change
    sched = Cron(spec, tz)
    start = at_change + minutes * 60_000
    end = start + 6 * 3_600_000
    expected = []
    zone = ZoneInfo(tz)
    for minute in range(start - start % 60_000 + 60_000, end, 60_000):
        wall = from_ms(minute).astimezone(zone).replace(tzinfo=None)
        before = from_ms(minute - 60_000).astimezone(zone).replace(tzinfo=None)
        jumped = wall - before > dt.timedelta(minutes=1)
        skipped = jumped and any(
            croniter.match(spec, before + dt.timedelta(minutes=k)) for k in range(1, (wall - before).seconds // 60)
        )
        if croniter.match(spec, wall) or skipped:
            expected.append(minute)
    assert list(sched.slots(start + 1, end)) == expected


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1000, max_value=86_400_000), INSTANTS)
def test_interval_slots_are_multiples(every: int, after: int) -> None:
    slot = Interval(every).next_slot(after)
    assert slot % every == 0 and after < slot <= after + every
