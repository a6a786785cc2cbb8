"""A Celery app for the overlap process tests: job ``slow`` every ``OVERLAP_APP_EVERY`` seconds,
whose task takes ``OVERLAP_APP_SLEEP`` seconds and writes its start and end to the file
``OVERLAP_APP_LOG`` (one JSON line per run), under ``anarchon_overlap`` = ``OVERLAP_APP_POLICY``."""

from __future__ import annotations

import json
import os
import time

from celery import Celery

PREFIX = os.environ["OVERLAP_APP_PREFIX"]

app = Celery("overlap_app", broker=os.environ.get("ANARCHON_TEST_BROKER", "amqp://guest:guest@127.0.0.1:5672//"))
app.conf.update(
    imports=("anarchon_celery",),
    task_default_queue=f"{PREFIX}tasks",
    worker_prefetch_multiplier=1,
    task_acks_late=os.environ.get("OVERLAP_APP_ACKS_LATE") == "1",
    anarchon_prefix=PREFIX,
    anarchon_backend=os.environ["OVERLAP_APP_BACKEND"],
    anarchon_overlap=os.environ.get("OVERLAP_APP_POLICY", "skip"),
    anarchon_overlap_lease_ms=int(os.environ.get("OVERLAP_APP_LEASE_MS", "3000")),
    anarchon_max_late_ms=5_000,
    anarchon_jitter_ms=200,
    anarchon_history_size=500,
    beat_schedule={"slow": {"task": "overlap_app.slow", "schedule": float(os.environ.get("OVERLAP_APP_EVERY", "1"))}},
)
if os.environ.get("OVERLAP_APP_METRICS_PORT"):  # a beat's probes and metrics
    app.conf.anarchon_metrics_port = int(os.environ["OVERLAP_APP_METRICS_PORT"])
if os.environ.get("OVERLAP_APP_WORKER_METRICS_PORT"):  # a worker's metrics
    app.conf.anarchon_worker_metrics_port = int(os.environ["OVERLAP_APP_WORKER_METRICS_PORT"])


def _log(**line: object) -> None:
    with open(os.environ["OVERLAP_APP_LOG"], "a") as out:  # one short write: whole lines
        out.write(json.dumps(line) + "\n")


@app.task(name="overlap_app.slow", bind=True, shared=False)
def slow(self) -> None:
    import anarchon_celery

    run = anarchon_celery.scheduled_run(self.request)
    slot = run.slot_ms if run else None
    _log(slot=slot, event="start", t=time.time(), pid=os.getpid(), trigger=run.trigger if run else None)
    if os.environ.get("OVERLAP_APP_GIL"):  # one C call that holds the GIL throughout (no sleep)
        sum(range(int(os.environ["OVERLAP_APP_GIL"])))
    else:
        time.sleep(float(os.environ.get("OVERLAP_APP_SLEEP", "2.5")))
    _log(slot=slot, event="end", t=time.time(), pid=os.getpid())
