"""``celery anarchon import-django-celery-beat``: the mapping of a ``PeriodicTask`` row (pure), and
the command against real django-celery-beat databases (SQLite and PostgreSQL), made by Django's
own migrations and models in a process of their own."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from anarchon_celery.importing import job_name, map_row

from .support.django_beat import make_database
from .support.stores import history_app_on
from .test_cli import celery

ROW = {"id": 1, "name": "n", "task": "t", "enabled": True, "args": "[]", "kwargs": "{}", "headers": "{}"}
CRONTAB = {"crontab_id": 3, "c_minute": "30", "c_hour": "2", "c_day_of_month": "*"}
CRONTAB |= {"c_month_of_year": "*", "c_day_of_week": "1-5", "c_timezone": "Europe/Paris"}


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
            {**CRONTAB, "expires": "2030-01-01 00:00:00", "start_time": "2027-01-01 00:00:00"},
            {"schedule": {"crontab": "30 2 * * 1-5"}, "tz": "Europe/Paris"},
            ["expires 2030-01-01 00:00:00 is not kept", "start_time 2027-01-01 00:00:00 is not kept"],
        ),
    ],
)
def test_a_periodic_task_becomes_a_runtime_job(row: dict[str, Any], entry: dict[str, Any], notes: list[str]) -> None:
    found = map_row({**ROW, **row}, "n")
    assert found.entry == {"task": "t", **entry} and not found.reason
    assert len(found.notes) == len(notes) and all(note in said for note, said in zip(notes, found.notes))


@pytest.mark.parametrize(
    "row, reason",
    [
        ({"clocked_id": 1, "one_off": True}, "a one-off (clocked) task"),
        ({**CRONTAB, "one_off": True}, "a one-off (clocked) task"),
        ({"solar_id": 1}, "a solar schedule"),
        ({}, "no schedule"),
        ({"interval_id": 2, "i_every": 5, "i_period": "microseconds"}, "an interval of 5 microseconds"),
        ({**CRONTAB, "args": "not json"}, "its args are not JSON"),
        ({**CRONTAB, "kwargs": "[1]"}, "its kwargs are not a JSON dict"),
        ({**CRONTAB, "headers": "{"}, "its headers are not JSON"),
    ],
)
def test_what_cannot_map_says_why(row: dict[str, Any], reason: str) -> None:
    found = map_row({**ROW, **row}, "n")
    assert found.entry is None and reason in found.reason


def test_a_disabled_task_is_added_paused() -> None:
    assert map_row({**ROW, **CRONTAB, "enabled": 0}, "n").paused


def test_names_become_job_names_each_once() -> None:
    taken: set[str] = set()
    assert job_name("Nightly report (daily)", 1, taken) == "Nightly-report-daily"
    assert job_name("Nightly report [daily]", 2, taken) == "Nightly-report-daily-2"
    assert job_name("été", 3, taken) == "t"
    assert job_name("!!!", 4, taken) == "periodic-task-4"


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
    }
    assert "a one-off (clocked) task" in listed["once"]["reason"]
    assert "a solar schedule" in listed["sunrise"]["reason"]
    assert "task 'nope.missing' is not registered" in listed["gone"]["reason"]
    assert listed["every ten"]["entry"] == {
        "task": "history_app.add",
        "schedule": 600,
        "kwargs": {"x": 1, "y": 2},
        "options": {"queue": "reports", "priority": 5, "expires": 60},
    }
    assert celery(env, "anarchon", "jobs", "--json").stdout.count('"runtime"') == 0  # a dry run adds nothing
    done = celery(env, "anarchon", "import-django-celery-beat", "--database", dcb_database, "--yes")
    assert done.returncode == 0 and done.stdout.count("created") == 3, done.stdout + done.stderr
    jobs = {job["job"]: job for job in json.loads(celery(env, "anarchon", "jobs", "--json").stdout)}
    assert jobs["Nightly-report-daily"]["schedule"] == "cron '30 2 * * *' Asia/Tokyo"
    assert jobs["every-ten"]["schedule"] == "every 600s" and jobs["every-ten"]["version"] == 1
    assert jobs["switched-off"]["state"] == "paused" and jobs["Nightly-report-daily"]["state"] == "active"
    again = celery(env, "anarchon", "import-django-celery-beat", "--database", dcb_database, "--yes", "--json")
    actions = {item["source"]: item["action"] for item in json.loads(again.stdout)}
    expected = {name: "exists" if "create" in item["action"] else item["action"] for name, item in listed.items()}
    assert actions == expected


def test_an_unknown_database_is_a_clear_error(beat_env: dict[str, str], tmp_path: Path) -> None:
    env = dict(beat_env, HISTORY_APP_BACKEND=f"sqlite:///{tmp_path / 'anarchon.db'}")
    done = celery(env, "anarchon", "import-django-celery-beat", "--database", "mysql://u:secret@db/x")
    assert done.returncode == 1 and "is not a database this reads" in done.stderr and "secret" not in done.stderr
    missing = celery(env, "anarchon", "import-django-celery-beat", "--database", f"sqlite:///{tmp_path / 'none.db'}")
    assert missing.returncode == 1 and "django-celery-beat" in missing.stderr, missing.stderr
