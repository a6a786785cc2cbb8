"""The Celery app of the runtime-jobs scale benchmark (runtime_scale.py): one task, no job in code;
the jobs are made at runtime, by anarchon_celery (RUNTIME_IMPL=anarchon, its runs decided in
RUNTIME_BACKEND), django-celery-beat (``django``: its DatabaseScheduler on the SQLite file
RUNTIME_DJANGO_DB) or RedBeat (``redbeat``: entries in the Redis at RUNTIME_REDIS)."""

from __future__ import annotations

import logging
import os

from celery import Celery

PREFIX = os.environ.get("RUNTIME_PREFIX", "runtime.")
IMPL = os.environ.get("RUNTIME_IMPL", "anarchon")

app = Celery("runtime_app", broker=os.environ.get("BENCH_BROKER", "amqp://guest:guest@127.0.0.1:5672//"))
app.conf.update(task_default_queue=f"{PREFIX}tasks", broker_connection_retry_on_startup=True)

if IMPL == "anarchon":
    app.conf.update(
        beat_scheduler="anarchon_celery.Scheduler",
        anarchon_prefix=PREFIX,
        anarchon_backend=os.environ["RUNTIME_BACKEND"],
        anarchon_history_size=int(os.environ.get("RUNTIME_HISTORY_SIZE", "10")),
    )
elif IMPL == "django":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "runtime_django_settings")
    import django
    from celery.signals import after_setup_logger

    django.setup()
    app.conf.beat_scheduler = "django_celery_beat.schedulers:DatabaseScheduler"

    @after_setup_logger.connect
    def _no_schedule_dumps(**_: object) -> None:
        """Its debug level prints every entry at each reload: the beat runs at debug (for
        celery's "Ticking" line), django-celery-beat at info, as in production."""
        logging.getLogger("django_celery_beat").setLevel(logging.INFO)
elif IMPL == "redbeat":
    app.conf.update(
        beat_scheduler="redbeat.RedBeatScheduler",
        redbeat_redis_url=os.environ.get("RUNTIME_REDIS", "redis://127.0.0.1:6379/7"),
        redbeat_key_prefix=PREFIX,
    )


@app.task(name="runtime_app.tick")
def tick(name: str) -> None:
    """One run of a job (never executed here: the benchmark has no worker)."""
