"""A real django-celery-beat database, made by its own migrations and models in a process of their
own (Django is never imported by the suite's processes): a row of each kind of schedule, or the
rows a test makes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

#: Sets Django up in its own process and makes django-celery-beat's tables; rows are added after it.
SETUP = """
import datetime, os, sys, zoneinfo
sys.path.insert(0, os.environ["DCB_DIR"])
os.environ["DJANGO_SETTINGS_MODULE"] = "dcb_settings"
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django.utils import timezone
from django_celery_beat.models import (
    ClockedSchedule, CrontabSchedule, IntervalSchedule, PeriodicTask, SolarSchedule)
"""

#: Made by Django's models: every kind of schedule django-celery-beat has, a row expired and one
#: that starts later (at fixed instants, the latter given in Tokyo time), two names that come out
#: alike, and arguments that do not fit their task.
MAKE_ROWS = """
nightly = CrontabSchedule.objects.create(minute="30", hour="2", timezone="Asia/Tokyo")
ten = IntervalSchedule.objects.create(every=10, period=IntervalSchedule.MINUTES)
half = IntervalSchedule.objects.create(every=30, period=IntervalSchedule.SECONDS)
tens = IntervalSchedule.objects.create(every=10, period=IntervalSchedule.SECONDS)
PeriodicTask.objects.create(name="Nightly report (daily)", task="history_app.fine", crontab=nightly)
PeriodicTask.objects.create(name="every ten", task="history_app.add", interval=ten, queue="reports",
                            priority=5, expire_seconds=60, kwargs='{"x": 1, "y": 2}')
PeriodicTask.objects.create(name="switched off", task="history_app.fine", interval=half, enabled=False)
PeriodicTask.objects.create(name="once", task="history_app.fine", one_off=True,
                            clocked=ClockedSchedule.objects.create(clocked_time=timezone.now()))
PeriodicTask.objects.create(name="sunrise", task="history_app.fine",
                            solar=SolarSchedule.objects.create(event="sunrise", latitude=48.85, longitude=2.35))
PeriodicTask.objects.create(name="gone", task="nope.missing", crontab=nightly)
PeriodicTask.objects.create(name="once every ten", task="history_app.fine", interval=ten, one_off=True)
PeriodicTask.objects.create(name="expired", task="history_app.fine", interval=half,
                            expires=datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc))
PeriodicTask.objects.create(name="starts later", task="history_app.fine", interval=half,
                            start_time=datetime.datetime(2099, 1, 1, 9, tzinfo=zoneinfo.ZoneInfo("Asia/Tokyo")))
PeriodicTask.objects.create(name="every-10s-dup", task="history_app.fine", interval=tens)
PeriodicTask.objects.create(name="every 10s dup", task="history_app.fine", interval=tens)
PeriodicTask.objects.create(name="short of one", task="history_app.add", interval=ten, args="[1]")
"""


def make_database(directory: Path, engine: dict[str, Any], rows: str = MAKE_ROWS) -> None:
    """Migrate the database ``engine`` describes (Django's ``DATABASES`` entry) and add ``rows``
    (by default :data:`MAKE_ROWS`: Python after :data:`SETUP`), with a settings module written in
    ``directory``."""
    settings = f"""
        SECRET_KEY = "test"
        INSTALLED_APPS = ["django_celery_beat"]
        DATABASES = {{"default": {engine!r}}}
        USE_TZ = True
        TIME_ZONE = "UTC"
        DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
    """
    (directory / "dcb_settings.py").write_text(textwrap.dedent(settings))
    made = subprocess.run(
        [sys.executable, "-c", SETUP + textwrap.dedent(rows)],
        env={"DCB_DIR": str(directory), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert made.returncode == 0, made.stderr
