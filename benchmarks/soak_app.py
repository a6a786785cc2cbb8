"""The Celery app the soak benchmarks schedule: SOAK_JOBS jobs every SOAK_PERIOD seconds, run by
anarchon_celery, plain celery beat or RedBeat (SOAK_IMPL). Every run is one `soak_app.tick(job)`
message on the queue `<SOAK_PREFIX>tasks`, counted by the benchmark's own consumer (soak.py), or
executed by a worker that appends one line per execution to SOAK_EXECUTIONS (lease_soak.py).

SOAK_BACKEND sets ``anarchon_backend`` (a store with leases), SOAK_LEASE_MS its lease,
SOAK_SKEW_MS moves this process's clock as the scheduler sees it (a host whose clock is off), and
SOAK_CATCH_UP sets ``anarchon_catch_up`` with the jobs of catch_up.py's cases, SOAK_METRICS_PORT
``anarchon_metrics_port``."""

from __future__ import annotations

import os

from celery import Celery

PREFIX = os.environ.get("SOAK_PREFIX", "soak.")
JOBS = int(os.environ.get("SOAK_JOBS", "20"))
PERIOD = float(os.environ.get("SOAK_PERIOD", "2"))
IMPL = os.environ.get("SOAK_IMPL", "anarchon")

app = Celery("soak_app", broker=os.environ.get("SOAK_BROKER", "amqp://guest:guest@127.0.0.1:5672//"))
app.conf.update(
    task_default_queue=f"{PREFIX}tasks",
    broker_connection_retry_on_startup=True,
    beat_schedule={
        f"job-{n:02d}": {"task": "soak_app.tick", "schedule": PERIOD, "args": (f"job-{n:02d}",)} for n in range(JOBS)
    },
)
if os.environ.get("SOAK_QUORUM"):  # the cluster soak: the task queue outlives a node
    from kombu import Exchange, Queue

    app.conf.task_queues = [
        Queue(
            f"{PREFIX}tasks", Exchange(f"{PREFIX}tasks"), f"{PREFIX}tasks", queue_arguments={"x-queue-type": "quorum"}
        )
    ]
if IMPL == "anarchon":
    app.conf.update(
        beat_scheduler="anarchon_celery.Scheduler",
        anarchon_prefix=PREFIX,
        anarchon_jitter_ms=int(os.environ.get("SOAK_JITTER_MS", "300")),
        anarchon_max_late_ms=int(os.environ.get("SOAK_MAX_LATE_MS", "10000")),
        # in kill mode the benchmark reads the gates of missed runs after the line ends: there
        # they outlive it; in the other modes they are kept few (see soak.py)
        anarchon_slot_ttl_ms=int(os.environ.get("SOAK_SLOT_TTL_MS", "60000")),
        anarchon_history_size=int(os.environ.get("SOAK_HISTORY_SIZE", "10")),
    )
    if os.environ.get("SOAK_METRICS_PORT"):  # metrics_soak.py: each instance's metrics, scraped
        app.conf.anarchon_metrics_port = int(os.environ["SOAK_METRICS_PORT"])
    if os.environ.get("SOAK_LEAD_MS"):
        app.conf.anarchon_lead_ms = int(os.environ["SOAK_LEAD_MS"])
    if os.environ.get("SOAK_BACKEND"):
        app.conf.anarchon_backend = os.environ["SOAK_BACKEND"]
    if os.environ.get("SOAK_LEASE_MS"):
        app.conf.anarchon_lease_ms = int(os.environ["SOAK_LEASE_MS"])
    if os.environ.get("SOAK_EXECUTIONS"):  # the worker: runs checked against their leases
        app.conf.imports = ("anarchon_celery",)
    if os.environ.get("SOAK_CATCH_UP"):  # catch_up.py: a policy for the runs missed, and its cases
        app.conf.anarchon_catch_up = os.environ["SOAK_CATCH_UP"]
        schedule = app.conf.beat_schedule
        # A job whose lateness outlasts a quick restart: no run of it is missed, none caught up.
        schedule["patient"] = {"task": "soak_app.tick", "schedule": PERIOD, "args": ("patient",), "max_late_ms": 30_000}
        if os.environ.get("SOAK_FRESH"):  # a job the store has never seen: nothing from before it
            schedule["fresh"] = {"task": "soak_app.tick", "schedule": PERIOD, "args": ("fresh",)}
        if os.environ.get("SOAK_CHANGED"):  # job-00 on another schedule: nothing of the old one
            schedule["job-00"] = dict(schedule["job-00"], schedule=PERIOD * 2)
    if os.environ.get("SOAK_SKEW_MS"):
        from anarchon_celery import clock

        _true_now_ms, _skew = clock.now_ms, int(os.environ["SOAK_SKEW_MS"])
        clock.now_ms = lambda: _true_now_ms() + _skew
elif IMPL == "redbeat":
    app.conf.update(
        beat_scheduler="redbeat.RedBeatScheduler",
        redbeat_redis_url=os.environ.get("SOAK_REDIS", "redis://127.0.0.1:6379/0"),
        redbeat_key_prefix=PREFIX,
        beat_max_loop_interval=5,
    )


_EXECUTIONS = os.environ.get("SOAK_EXECUTIONS")


@app.task(name="soak_app.tick", bind=True)
def tick(self: object, job: str) -> None:
    """Nothing to do but, under lease_soak.py, say it ran: one line per execution."""
    if not _EXECUTIONS:
        return
    import json
    import time

    request = self.request  # type: ignore[attr-defined]
    headers = request.headers or {}
    line = {
        "job": job,
        "slot": headers.get("anarchon_slot", getattr(request, "anarchon_slot", None)),
        "token": headers.get("anarchon_token", getattr(request, "anarchon_token", None)),
        "task_id": request.id,
        "at_ms": time.time_ns() // 1_000_000,
    }
    with open(_EXECUTIONS, "a") as out:  # one write per line: lines of several processes do not mix
        out.write(json.dumps(line) + "\n")
