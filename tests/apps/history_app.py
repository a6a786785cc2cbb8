"""A Celery app for the history and command-line tests. It does not import anarchon_celery itself
(but for HISTORY_APP_BAD_CRON's job): the worker side is enabled by Celery's ``imports`` setting,
as documented."""

from __future__ import annotations

import os
import time

from celery import Celery

PREFIX = os.environ.get("HISTORY_APP_PREFIX", "histapp.")

app = Celery(
    os.environ.get("HISTORY_APP_MAIN", "history_app"),  # another project's name
    broker=os.environ.get("HISTORY_APP_BROKER")
    or os.environ.get("ANARCHON_TEST_BROKER", "amqp://guest:guest@127.0.0.1:5672//"),
)
app.conf.update(
    imports=("anarchon_celery",),
    task_default_queue=f"{PREFIX}tasks",
    anarchon_slot_ttl_ms=int(os.environ.get("HISTORY_APP_SLOT_TTL_MS", "60000")),
    anarchon_max_late_ms=int(os.environ.get("HISTORY_APP_MAX_LATE_MS", "5000")),
    anarchon_lead_ms=int(os.environ.get("HISTORY_APP_LEAD_MS", "10000")),
    anarchon_jitter_ms=int(os.environ.get("HISTORY_APP_JITTER_MS", "0")),
    anarchon_history_size=int(os.environ.get("HISTORY_APP_HISTORY_SIZE", "5")),
    beat_schedule={
        "fine": {
            "task": "history_app.fine",
            "schedule": "0 3 * * *",
            "tz": os.environ.get("HISTORY_APP_FINE_TZ", "Asia/Tokyo"),
        },
        "boom": {"task": "history_app.boom", "schedule": 3600},
        "sleepy": {"task": "history_app.sleepy", "schedule": "@daily"},
    },
)
if os.environ.get("HISTORY_APP_EVERY"):  # a job every N seconds, for the process tests
    app.conf.beat_schedule["every"] = {"task": "history_app.fine", "schedule": float(os.environ["HISTORY_APP_EVERY"])}
if os.environ.get("HISTORY_APP_ANARCHON_PREFIX") != "default":  # else the app's own default
    app.conf.anarchon_prefix = os.environ.get("HISTORY_APP_ANARCHON_PREFIX") or PREFIX
if os.environ.get("HISTORY_APP_TASK_QUEUE_TYPE"):  # Celery's task_default_queue_type (5.5)
    app.conf.task_default_queue_type = os.environ["HISTORY_APP_TASK_QUEUE_TYPE"]
if os.environ.get("HISTORY_APP_CLUSTER_WORKER"):  # the README's settings for a worker on a cluster
    app.conf.worker_enable_remote_control = False
    app.conf.broker_connection_retry_on_startup = True
if os.environ.get("HISTORY_APP_FIVE_TZ"):  # every 5 minutes on a wall clock with DST
    app.conf.beat_schedule["five"] = {
        "task": "history_app.fine",
        "schedule": "*/5 * * * *",
        "tz": os.environ["HISTORY_APP_FIVE_TZ"],
    }
if os.environ.get("HISTORY_APP_BACKEND"):  # claims through another URL (a proxy) than the tasks
    app.conf.anarchon_backend = os.environ["HISTORY_APP_BACKEND"]
if os.environ.get("HISTORY_APP_CONNECT_TIMEOUT"):  # seconds a connection attempt may take
    app.conf.broker_connection_timeout = float(os.environ["HISTORY_APP_CONNECT_TIMEOUT"])
if os.environ.get("HISTORY_APP_LEASE_MS"):  # a backend with leases
    app.conf.anarchon_lease_ms = int(os.environ["HISTORY_APP_LEASE_MS"])
if os.environ.get("HISTORY_APP_CATCH_UP"):  # a policy for the runs missed: latest or all
    app.conf.anarchon_catch_up = os.environ["HISTORY_APP_CATCH_UP"]
if os.environ.get("HISTORY_APP_RUNTIME_CHECK_MS"):  # how soon a change not told is found
    app.conf.anarchon_runtime_check_ms = int(os.environ["HISTORY_APP_RUNTIME_CHECK_MS"])
if os.environ.get("HISTORY_APP_METRICS_PORT"):  # health probes served
    app.conf.anarchon_metrics_port = int(os.environ["HISTORY_APP_METRICS_PORT"])
if os.environ.get("HISTORY_APP_WORKER_METRICS_PORT"):  # a worker's metrics served
    app.conf.anarchon_worker_metrics_port = int(os.environ["HISTORY_APP_WORKER_METRICS_PORT"])
if os.environ.get("HISTORY_APP_HEALTH_STALL_MS"):
    app.conf.anarchon_health_stall_ms = int(os.environ["HISTORY_APP_HEALTH_STALL_MS"])
if os.environ.get("HISTORY_APP_REDIS_TIMEOUT"):  # the Redis backend, its answers awaited this long
    from anarchon_celery.backends.redis import RedisBackend

    app.conf.anarchon_backend = RedisBackend(
        os.environ["HISTORY_APP_BACKEND"],
        prefix=app.conf.anarchon_prefix,
        slot_ttl_ms=app.conf.anarchon_slot_ttl_ms,
        timeout=float(os.environ["HISTORY_APP_REDIS_TIMEOUT"]),
    )
if os.environ.get("HISTORY_APP_BAD"):
    app.conf.beat_schedule["bad"] = {"task": "history_app.fine", "schedule": "61 * * * *"}
if os.environ.get("HISTORY_APP_BAD_ARGS"):  # arguments that do not fit the task's parameters
    app.conf.beat_schedule["sum"] = {"task": "history_app.add", "schedule": 3600, "args": (1,)}


@app.task(name="history_app.fine", shared=False)
def fine() -> str:
    return "fine"


@app.task(name="history_app.add", shared=False)
def add(x: int, y: int) -> int:
    return x + y


@app.task(name="history_app.boom", shared=False)
def boom() -> None:
    raise ValueError("boom " + "x" * 2000)


@app.task(name="history_app.sleepy", shared=False)
def sleepy() -> None:
    time.sleep(120)


if os.environ.get("HISTORY_APP_OUTAGE_REMINDER_S"):  # an outage reminded sooner than every minute
    from anarchon_celery.backends.store import StoreBackend

    StoreBackend.outage_reminder_s = float(os.environ["HISTORY_APP_OUTAGE_REMINDER_S"])

if os.environ.get("HISTORY_APP_BAD_CRON"):  # a @cron with an option that is refused
    import anarchon_celery

    @anarchon_celery.cron("* * * * *", hand_over=True)
    @app.task(name="history_app.caught", shared=False)
    def caught() -> None: ...
