"""Django settings for django-celery-beat in the runtime-jobs scale benchmark: its tables in the
SQLite file RUNTIME_DJANGO_DB."""

import os

SECRET_KEY = "benchmark"
INSTALLED_APPS = ["django_celery_beat"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ.get("RUNTIME_DJANGO_DB", "dcb.db")}}
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
