"""Sending a run's Celery task: once, with its deterministic id and headers.

A send is repeated only when it certainly did not reach a queue: the connection could not be
made (nothing was written), or the broker refused the message (a nack). A connection lost or a
confirm missing after the message was written is not repeated, since the broker may have queued
it already: a second copy would run the task twice.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from amqp.exceptions import MessageNacked

from . import clock
from .jobs import Job

__all__ = ["instance_id", "run_headers", "send_run"]

#: Seconds to wait for the broker's confirm of a task message.
CONFIRM_TIMEOUT = 5.0
#: Seconds between two sends of a message the broker refused.
NACK_BACKOFF = 0.5


def instance_id() -> str:
    """Who this process is, as written in claims and history: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def run_headers(job: Job, *, slot: int, run_id: str, trigger: str) -> dict[str, Any]:
    """The headers a run's task message carries, on top of the job's own."""
    return {
        **dict(job.options.get("headers") or {}),
        "anarchon_job": job.name,
        "anarchon_slot": slot,
        "anarchon_run": run_id,
        "anarchon_trigger": trigger,
    }


def send_run(
    app: Any,
    connection: Any,
    job: Job,
    *,
    slot: int,
    task_id: str,
    run_id: str,
    trigger: str,
    deadline_ms: int,
) -> Any:
    """Send the job's task over ``connection`` (made with ``confirm_publish``); return its result.

    Raises the last error when it could not be sent by ``deadline_ms`` (epoch milliseconds).
    """
    options = dict(job.options)
    options["headers"] = run_headers(job, slot=slot, run_id=run_id, trigger=trigger)
    task = app.tasks[job.task]
    while True:
        remaining = (deadline_ms - clock.now_ms()) / 1000
        # Safe to retry: nothing is written before the connection is up.
        connection.ensure_connection(
            max_retries=None, interval_start=0, interval_step=0.5, interval_max=2, timeout=max(0.5, remaining)
        )
        producer = app.amqp.Producer(connection, auto_declare=False)
        try:
            return task.apply_async(
                job.args,
                dict(job.kwargs),
                task_id=task_id,
                producer=producer,
                retry=False,
                confirm_timeout=CONFIRM_TIMEOUT,
                **options,
            )
        except MessageNacked:
            # Refused by the broker (a full queue with reject-publish): nothing was queued.
            if clock.now_ms() + NACK_BACKOFF * 1000 > deadline_ms:
                raise
            time.sleep(NACK_BACKOFF)
        except BaseException:
            connection.collect()  # never reuse a connection whose state is unknown
            raise
