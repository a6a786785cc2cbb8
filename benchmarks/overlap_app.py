"""The Celery app of the overlap soak (overlap_soak.py): OV_JOBS jobs every OV_PERIOD seconds, each
run one ``overlap_app.work(job, n)`` whose task takes longer than the period now and then, protected
from overlap by anarchon_celery (``overlap="skip"``), by celery-once (``QueueOnce``, a Redis lock
taken at enqueue), by celery-singleton (``Singleton``, the same idea), or by nothing (OV_IMPL
``anarchon``, ``once``, ``singleton``, ``plain``). Every execution appends its start and its end to
OV_LOG, one JSON line each, with the worker process's pid.

How long a run takes is drawn from its slot, the same for every implementation: most take 0.3 to
2.5 s, one in OV_LONG_EVERY takes OV_LONG_S (longer than the peers' lock expiry, OV_LOCK_S, and
than anarchon's lease, OV_LEASE_MS, which the worker renews)."""

from __future__ import annotations

import json
import os
import random
import time

from celery import Celery, Task

PREFIX = os.environ.get("OV_PREFIX", "ov.")
IMPL = os.environ.get("OV_IMPL", "anarchon")
JOBS = int(os.environ.get("OV_JOBS", "4"))
PERIOD = float(os.environ.get("OV_PERIOD", "1"))
REDIS = os.environ.get("OV_REDIS", "redis://127.0.0.1:6379/6")
LOCK_S = int(os.environ.get("OV_LOCK_S", "10"))
LONG_EVERY = int(os.environ.get("OV_LONG_EVERY", "15"))
LONG_S = float(os.environ.get("OV_LONG_S", "14"))

app = Celery("overlap_app", broker=os.environ.get("BENCH_BROKER", "amqp://guest:guest@127.0.0.1:5672//"))
app.conf.update(
    task_default_queue=f"{PREFIX}tasks",
    broker_connection_retry_on_startup=True,
    task_acks_late=True,  # a killed worker's message is delivered again
    worker_prefetch_multiplier=1,
    beat_schedule={
        f"job-{n}": {"task": "overlap_app.work", "schedule": PERIOD, "args": (f"job-{n}",)} for n in range(JOBS)
    },
)
base: type[Task] = Task
if IMPL == "anarchon":
    import anarchon_celery  # noqa: F401 - the worker's side: start check, heartbeat, history

    app.conf.update(
        beat_scheduler="anarchon_celery.Scheduler",
        anarchon_prefix=PREFIX,
        anarchon_backend=os.environ["OV_BACKEND"],
        anarchon_overlap="skip",
        anarchon_overlap_lease_ms=int(os.environ.get("OV_LEASE_MS", "10000")),
        anarchon_jitter_ms=200,
        anarchon_history_size=0,
    )
elif IMPL == "once":
    from celery_once import QueueOnce

    app.conf.ONCE = {
        "backend": "celery_once.backends.Redis",
        "settings": {"url": REDIS, "default_timeout": LOCK_S, "blocking": False},
    }
    base = QueueOnce
elif IMPL == "singleton":
    from celery_singleton import Singleton

    app.conf.update(
        singleton_backend_url=REDIS, singleton_key_prefix=f"{PREFIX}singleton:", singleton_lock_expiry=LOCK_S
    )
    base = Singleton


def duration(job: str, at: float) -> float:
    """How long the run of ``job`` due at ``at`` takes (the same whoever runs it)."""
    draw = random.Random(f"{job}:{round(at / PERIOD)}")
    return LONG_S if draw.randrange(LONG_EVERY) == 0 else draw.uniform(0.3, 2.5)


def _log(**line: object) -> None:
    with open(os.environ["OV_LOG"], "a") as out:  # one short write: whole lines
        out.write(json.dumps(line) + "\n")


@app.task(
    name="overlap_app.work",
    bind=True,
    base=base,
    shared=False,
    **({"once": {"graceful": True}} if IMPL == "once" else {}),
)
def work(self: Task, job: str) -> None:
    started = time.time()
    _log(job=job, id=self.request.id, event="start", t=started, pid=os.getpid())
    time.sleep(duration(job, started))
    _log(job=job, id=self.request.id, event="end", t=time.time(), pid=os.getpid())
