"""``celery anarchon import-django-celery-beat``: the mapping and naming of ``PeriodicTask`` rows
(pure), the command against real django-celery-beat databases (SQLite and PostgreSQL), made by
Django's own migrations and models in a process of their own, and a real beat running an imported
row that starts later."""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from anarchon_celery.importing import job_names, map_row

from .support.django_beat import make_database
from .support.stores import history_app_on
from .test_cli import celery
from .test_faults import Fleet
from .test_runtime_jobs import sent_runs

ROW = {"id": 1, "name": "n", "task": "t", "enabled": True, "args": "[]", "kwargs": "{}", "headers": "{}"}
CRONTAB = {"crontab_id": 3, "c_minute": "30", "c_hour": "2", "c_day_of_month": "*"}
CRONTAB |= {"c_month_of_year": "*", "c_day_of_week": "1-5", "c_timezone": "Europe/Paris"}
#: The instant the rows are read at: 2026-06-01 00:00 UTC.
NOW_MS = 1_780_272_000_000


@pytest.mark.parametrize(
    "row, entry, notes",
    [
        (CRONTAB, {"schedule": {"crontab": "30 2 * * 1-5"}, "tz": "Europe/Paris"}, []),
        ({"interval_id": 2, "i_every": 10, "i_period": "minutes"}, {"schedule": 600}, ["aligned to the Unix epoch"]),
        (
            {"interval_id": 2, "i_every": 2, "i_period": "days", "args": '[1, "a"]', "kwargs": '{"k": null}'},
            {"schedule": 172_800, "args": [1, "a"], "kwargs": {"k": None}},
            ["aligned"],
        ),
        (
            {**CRONTAB, "queue": "reports", "priority": 5, "expire_seconds": 60, "headers": '{"h": 1}', "exchange": ""},
            {
                "schedule": {"crontab": "30 2 * * 1-5"},
                "tz": "Europe/Paris",
                "options": {"queue": "reports", "priority": 5, "headers": {"h": 1}, "expires": 60},
            },
            [],
        ),
        (
            {**CRONTAB, "expires": "2030-01-01 00:00:00", "start_time": "2026-01-01 00:00:00"},
            {"schedule": {"crontab": "30 2 * * 1-5"}, "tz": "Europe/Paris"},
            ["expires 2030-01-01T00:00:00+00:00 is not kept: remove the job then"],  # (started already)
        ),
    ],
)
def test_a_periodic_task_becomes_a_runtime_job(row: dict[str, Any], entry: dict[str, Any], notes: list[str]) -> None:
    found = map_row({**ROW, **row}, "n", NOW_MS)
    assert found.entry == {"task": "t", **entry} and not found.reason
    assert len(found.notes) == len(notes) and all(note in said for note, said in zip(notes, found.notes))
    assert found.until_ms is None and not found.paused


@pytest.mark.parametrize(
    "start, enabled, until, note",
    [
        # SQLite keeps Django's times as text without a zone (UTC); PostgreSQL as aware datetimes.
        ("2027-01-01 00:00:00", True, "2027-01-01T00:00:00+00:00", "paused until then, when it resumes by itself"),
        ("2027-01-01 00:00:00.250000", True, "2027-01-01T00:00:00+00:00", "paused until then"),
        (dt.datetime(2027, 1, 1, 9, tzinfo=ZoneInfo("Asia/Tokyo")), True, "2027-01-01T00:00:00+00:00", "paused"),
        ("2026-06-01 00:00:01", True, "2026-06-01T00:00:01+00:00", "paused until then"),
        ("2027-01-01 00:00:00", False, None, "is to come: to run it from then, pause it --until 2027-01-01T00:00"),
    ],
)
def test_a_task_that_starts_later_is_paused_until_its_start(
    start: Any, enabled: bool, until: str | None, note: str
) -> None:
    found = map_row({**ROW, **CRONTAB, "start_time": start, "enabled": enabled}, "n", NOW_MS)
    assert found.entry is not None and found.paused is not enabled
    assert found.as_dict()["paused_until"] == until
    assert len(found.notes) == 1 and note in found.notes[0] and "start_time 20" in found.notes[0], found.notes


@pytest.mark.parametrize(
    "expires",
    ["2026-06-01 00:00:00", "2020-01-01 00:00:00", dt.datetime(2026, 6, 1, 9, tzinfo=ZoneInfo("Asia/Tokyo"))],
)
def test_a_task_whose_expires_has_passed_is_not_imported(expires: Any) -> None:
    found = map_row({**ROW, **CRONTAB, "expires": expires, "start_time": "2027-01-01 00:00:00"}, "n", NOW_MS)
    assert found.entry is None and found.reason.startswith("expired at 20")
    assert found.reason.endswith("+00:00 (its expires): django-celery-beat never runs it again")


@pytest.mark.parametrize(
    "row, reason",
    [
        ({"clocked_id": 1, "one_off": True}, "a clocked task (one run at a set time)"),
        ({**CRONTAB, "one_off": True}, "a one-off crontab task (django-celery-beat runs it once, then disables it)"),
        ({"interval_id": 2, "i_every": 10, "i_period": "minutes", "one_off": True}, "a one-off interval task ("),
        ({**CRONTAB, "start_time": "soon"}, "its start_time 'soon' is not a date"),
        ({"solar_id": 1}, "a solar schedule"),
        ({}, "no schedule"),
        ({"interval_id": 2, "i_every": 5, "i_period": "microseconds"}, "an interval of 5 microseconds"),
        ({**CRONTAB, "args": "not json"}, "its args are not JSON"),
        ({**CRONTAB, "kwargs": "[1]"}, "its kwargs are not a JSON dict"),
        ({**CRONTAB, "headers": "{"}, "its headers are not JSON"),
    ],
)
def test_what_cannot_map_says_why(row: dict[str, Any], reason: str) -> None:
    found = map_row({**ROW, **row}, "n", NOW_MS)
    assert found.entry is None and reason in found.reason


def test_a_disabled_task_is_added_paused() -> None:
    assert map_row({**ROW, **CRONTAB, "enabled": 0}, "n").paused


@pytest.mark.parametrize(
    "rows, names",
    [
        (
            [(1, "Nightly report (daily)"), (2, "Nightly report [daily]"), (3, "été"), (4, "!!!")],
            ["Nightly-report-daily", "Nightly-report-daily-2", "t", "periodic-task-4"],
        ),
        # A valid name keeps it, whichever row comes first (the rows come in the order of their names).
        ([(7, "every 10s dup"), (15, "every-10s-dup")], ["every-10s-dup-7", "every-10s-dup"]),
        ([(3, "a b"), (4, "a-b-3"), (5, "a-b")], ["a-b-3-1", "a-b-3", "a-b"]),
        ([(1, "a b"), (2, "a.b"), (3, "a_b")], ["a-b", "a-b-2", "a_b"]),
    ],
)
def test_names_become_job_names_each_once_valid_ones_first(rows: list[tuple[int, str]], names: list[str]) -> None:
    found = job_names(rows)
    assert [found[row_id] for row_id, _ in rows] == names


# -- a real django-celery-beat database -----------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
def dcb_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a django-celery-beat database made by its own migrations, with a row of each kind."""
    pytest.importorskip("django_celery_beat", reason="needs django-celery-beat (the test extra)")
    if request.param == "sqlite":
        path = tmp_path / "django.sqlite3"
        engine, url, cleanup = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(path)}, f"sqlite:///{path}", None
    else:
        import psycopg

        server = request.getfixturevalue("postgres_url")
        name = f"dcb_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(server, autocommit=True) as db:
            db.execute(f"CREATE DATABASE {name}")
        url = server.rsplit("/", 1)[0] + f"/{name}"
        engine = {"ENGINE": "django.db.backends.postgresql", "NAME": name, "USER": "postgres", "HOST": "127.0.0.1"}

        def cleanup() -> None:
            with psycopg.connect(server, autocommit=True) as db:
                db.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    try:
        make_database(tmp_path, engine)
        yield url
    finally:
        if cleanup is not None:
            cleanup()


@pytest.mark.processes
@pytest.mark.broker
def test_import_from_a_real_django_celery_beat_database(
    dcb_database: str, beat_env: dict[str, str], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    env = history_app_on("sqlite", beat_env, tmp_path, request)
    dry = celery(env, "anarchon", "import-django-celery-beat", "--database", dcb_database, "--json")
    assert dry.returncode == 0, dry.stderr
    listed = {item["source"]: item for item in json.loads(dry.stdout)}
    assert {name: item["action"] for name, item in listed.items()} == {
        "Nightly report (daily)": "would create",
        "every ten": "would create",
        "switched off": "would create",
        "once": "not imported",
        "sunrise": "not imported",
        "gone": "not imported",
        "once every ten": "not imported",
        "expired": "not imported",
        "starts later": "would create",
        "every-10s-dup": "would create",
        "every 10s dup": "would create",
        "short of one": "not imported",
    }
    assert "a clocked task (one run at a set time)" in listed["once"]["reason"]
    assert listed["once every ten"]["reason"].startswith("a one-off interval task (django-celery-beat runs it once")
    assert "a solar schedule" in listed["sunrise"]["reason"]
    assert "task 'nope.missing' is not registered" in listed["gone"]["reason"]
    assert listed["expired"]["reason"] == (
        "expired at 2020-01-01T00:00:00+00:00 (its expires): django-celery-beat never runs it again"
    )
    assert "its arguments do not fit task 'history_app.add'(x, y): called as (1)" in listed["short of one"]["reason"]
    assert listed["every ten"]["entry"] == {
        "task": "history_app.add",
        "schedule": 600,
        "kwargs": {"x": 1, "y": 2},
        "options": {"queue": "reports", "priority": 5, "expires": 60},
    }
    # Given in Tokyo time, kept in UTC, shown with its offset.
    assert (
        listed["starts later"]["paused_until"] == "2099-01-01T00:00:00+00:00" and not listed["starts later"]["paused"]
    )
    # A valid name keeps it; the one rewritten to it gets its row id.
    assert listed["every-10s-dup"]["job"] == "every-10s-dup"
    assert listed["every 10s dup"]["job"].startswith("every-10s-dup-") and listed["every 10s dup"]["job"][14:].isdigit()
    assert celery(env, "anarchon", "jobs", "--json").stdout.count('"runtime"') == 0  # a dry run adds nothing
    text = celery(env, "anarchon", "import-django-celery-beat", "--database", dcb_database)
    line = next(line for line in text.stdout.splitlines() if line.startswith("starts later"))
    assert "would create (paused until 2099-01-01T00:00:00+00:00: its start_time)" in line, text.stdout
    done = celery(env, "anarchon", "import-django-celery-beat", "--database", dcb_database, "--yes")
    assert done.returncode == 0 and done.stdout.count("created") == 6, done.stdout + done.stderr
    jobs = {job["job"]: job for job in json.loads(celery(env, "anarchon", "jobs", "--json").stdout)}
    assert jobs["Nightly-report-daily"]["schedule"] == "crontab(minute='30', hour='2') Asia/Tokyo"
    assert jobs["every-ten"]["schedule"] == "every 600s" and jobs["every-ten"]["version"] == 1
    assert jobs["switched-off"]["state"] == "paused" and jobs["Nightly-report-daily"]["state"] == "active"
    assert jobs["switched-off"]["paused"]["until"] is None
    assert jobs["starts-later"]["state"] == "paused", jobs["starts-later"]
    assert jobs["starts-later"]["paused"]["until"] == "2099-01-01T00:00:00+00:00"
    assert "start_time" in jobs["starts-later"]["paused"]["note"]
    assert "expired" not in jobs and "once-every-ten" not in jobs and "short-of-one" not in jobs
    again = celery(env, "anarchon", "import-django-celery-beat", "--database", dcb_database, "--yes", "--json")
    actions = {item["source"]: item["action"] for item in json.loads(again.stdout)}
    expected = {name: "exists" if "create" in item["action"] else item["action"] for name, item in listed.items()}
    assert actions == expected


#: A row every second that starts at ``{start}`` (epoch ms), in a database of its own.
LATER = """
every_second = IntervalSchedule.objects.create(every=1, period=IntervalSchedule.SECONDS)
PeriodicTask.objects.create(name="later", task="history_app.fine", interval=every_second,
                            start_time=datetime.datetime.fromtimestamp({start} / 1000, datetime.timezone.utc))
"""


@pytest.mark.processes
@pytest.mark.broker
@pytest.mark.timeout(300)
@pytest.mark.parametrize("where", ["rabbitmq", "sqlite", "redis", "postgres"])
def test_a_beat_does_not_send_an_imported_row_before_its_start_time(
    where: str, beat_env: dict[str, str], broker_url: str, prefix: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A row every second, imported while a beat runs, 15 s before its start_time: no run of it
    is sent before then, and it runs from then on by itself."""
    pytest.importorskip("django_celery_beat", reason="needs django-celery-beat (the test extra)")
    env = dict(beat_env)
    env.pop("HISTORY_APP_EVERY", None)
    env = history_app_on(where, env, tmp_path, request)
    fleet = Fleet(tmp_path, [env])
    runs: list[tuple[str, int]] = []
    try:
        fleet.wait_ready()
        start = int(time.time()) * 1000 + 15_500  # (between two slots)
        path = tmp_path / "django.sqlite3"
        engine = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(path)}
        make_database(tmp_path, engine, LATER.format(start=start))
        done = celery(
            env, "anarchon", "import-django-celery-beat", "--database", f"sqlite:///{path}", "--yes", "--json"
        )
        assert done.returncode == 0, done.stderr
        assert [(item["action"], item["paused_until"]) for item in json.loads(done.stdout)] == [
            ("created", dt.datetime.fromtimestamp(start / 1000, dt.timezone.utc).isoformat(timespec="seconds"))
        ]
        deadline = time.monotonic() + 120
        while not any(job == "later" for job, _ in runs):  # until it runs by itself, after its start
            assert time.monotonic() < deadline, f"no run of 'later' sent:\n{fleet.text(0)[-3000:]}"
            time.sleep(0.5)
            runs += sent_runs(broker_url, f"{prefix}tasks")
        time.sleep(2)
        fleet.stop()
    finally:
        fleet.kill()
    slots = [slot for job, slot in runs + sent_runs(broker_url, f"{prefix}tasks") if job == "later"]
    assert slots and min(slots) > start, (start, slots)
    assert "job 'later' slot" in fleet.text(0) and "the job is paused; not sent" in fleet.text(0)


def test_an_unknown_database_is_a_clear_error(beat_env: dict[str, str], tmp_path: Path) -> None:
    env = dict(beat_env, HISTORY_APP_BACKEND=f"sqlite:///{tmp_path / 'anarchon.db'}")
    done = celery(env, "anarchon", "import-django-celery-beat", "--database", "mysql://u:secret@db/x")
    assert done.returncode == 1 and "is not a database this reads" in done.stderr and "secret" not in done.stderr
    missing = celery(env, "anarchon", "import-django-celery-beat", "--database", f"sqlite:///{tmp_path / 'none.db'}")
    assert missing.returncode == 1 and "django-celery-beat" in missing.stderr, missing.stderr
