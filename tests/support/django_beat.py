"""A real django-celery-beat database, made by its own migrations and models in a process of their
own (Django is never imported by the suite's processes): a row of each kind of schedule."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

#: Made by Django's models in their own process: every kind of schedule django-celery-beat has.
MAKE_ROWS = """
import os, sys
sys.path.insert(0, os.environ["DCB_DIR"])
os.environ["DJANGO_SETTINGS_MODULE"] = "dcb_settings"
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django.utils import timezone
from django_celery_beat.models import (
    ClockedSchedule, CrontabSchedule, IntervalSchedule, PeriodicTask, SolarSchedule)
nightly = CrontabSchedule.objects.create(minute="30", hour="2", timezone="Asia/Tokyo")
ten = IntervalSchedule.objects.create(every=10, period=IntervalSchedule.MINUTES)
half = IntervalSchedule.objects.create(every=30, period=IntervalSchedule.SECONDS)
PeriodicTask.objects.create(name="Nightly report (daily)", task="history_app.fine", crontab=nightly)
PeriodicTask.objects.create(name="every ten", task="history_app.add", interval=ten, queue="reports",
                            priority=5, expire_seconds=60, kwargs='{"x": 1, "y": 2}')
PeriodicTask.objects.create(name="switched off", task="history_app.fine", interval=half, enabled=False)
PeriodicTask.objects.create(name="once", task="history_app.fine", one_off=True,
                            clocked=ClockedSchedule.objects.create(clocked_time=timezone.now()))
PeriodicTask.objects.create(name="sunrise", task="history_app.fine",
                            solar=SolarSchedule.objects.create(event="sunrise", latitude=48.85, longitude=2.35))
PeriodicTask.objects.create(name="gone", task="nope.missing", crontab=nightly)
"""


def make_database(directory: Path, engine: dict[str, Any]) -> None:
    """Migrate the database ``engine`` describes (Django's ``DATABASES`` entry) and add the rows of
    :data:`MAKE_ROWS`, with a settings module written in ``directory``."""
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
        [sys.executable, "-c", MAKE_ROWS],
        env={"DCB_DIR": str(directory), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert made.returncode == 0, made.stderr
