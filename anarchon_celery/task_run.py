"""What a task sent by the scheduler knows of its run: the job, and the instant it was scheduled
for, without reading message headers by hand.

The scheduler sends each run with ``anarchon_*`` headers; Celery shows them to the task as
attributes of its request (a message's headers that Celery does not know become request
attributes) or, for a task applied eagerly, in ``request.headers``. The slot is the same for every
message of a run, whichever instance sent it, so it is the natural key of an idempotent task:
"the report for 02:30", not "the report for whenever this message arrived".
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

__all__ = ["ScheduledRun", "run_headers_of", "scheduled_run"]


def run_headers_of(request: Any) -> dict[str, Any] | None:
    """The ``anarchon_*`` headers of a task request, or None for tasks the scheduler did not send."""
    headers = getattr(request, "headers", None) or {}
    run = headers.get("anarchon_run") or getattr(request, "anarchon_run", None)
    if not run:
        return None

    def get(key: str) -> Any:
        return headers.get(key, getattr(request, key, None))

    return {
        "run": run,
        "job": get("anarchon_job"),
        "slot": get("anarchon_slot"),
        "trigger": get("anarchon_trigger"),
        "instance": get("anarchon_instance"),
        "place": get("anarchon_place"),
        "token": get("anarchon_token"),  # on a backend with leases: the run's fencing token
        "coalesced": get("anarchon_coalesced"),  # a run of catch-up: the missed runs it stands for
        "overlap": get("anarchon_overlap"),  # its job's overlap policy, when it is protected
        "history_size": get("anarchon_history_size"),  # a runtime job's (the worker's code lacks it)
    }


@dataclass(frozen=True)
class ScheduledRun:
    """The run a task is executing, as the scheduler sent it."""

    #: The job's name.
    job: str
    #: The instant the run was scheduled for, in milliseconds since the Unix epoch (UTC). For a run
    #: sent by ``run_now`` (trigger ``manual``), the instant it was asked for.
    slot_ms: int
    #: The run's id: the task id of a scheduled run, the same on every instance.
    run_id: str
    #: ``schedule``, ``catch_up`` (a run missed while no instance could claim it, sent late by a
    #: job's catch-up policy), ``buffered`` (due while its job's last run was busy, kept pending by
    #: its overlap policy and sent once that run ended), ``backfill`` (sent by
    #: ``celery anarchon backfill``) or ``manual``.
    trigger: str
    #: The instance (``host:pid``) that sent this message, when it said.
    instance: str | None = None
    #: How many missed runs this one stands for: with ``catch_up="latest"``, the newest missed run
    #: is sent once for all of them (:attr:`slot_ms` is its own slot); 1 for any other run.
    coalesced: int = 1

    @property
    def scheduled_for(self) -> dt.datetime:
        """:attr:`slot_ms` as an aware datetime in UTC."""
        return dt.datetime.fromtimestamp(self.slot_ms / 1000, dt.timezone.utc)


def scheduled_run(request: Any = None) -> ScheduledRun | None:
    """The run the task of ``request`` is executing (``self.request`` in a bound task; by default,
    the request of the task running now), or None for a task the scheduler did not send, and
    outside a task::

        @app.task(bind=True)
        def nightly_report(self):
            run = anarchon_celery.scheduled_run(self.request)
            day = (run.scheduled_for if run else datetime.now(timezone.utc)).date()
    """
    if request is None:
        from celery import current_task  # the task running in this thread, if any

        request = getattr(current_task, "request", None)
        if request is None:
            return None
    found = run_headers_of(request)
    if found is None or found["job"] is None or found["slot"] is None:
        return None
    return ScheduledRun(
        job=str(found["job"]),
        slot_ms=int(found["slot"]),
        run_id=str(found["run"]),
        trigger=str(found["trigger"] or "schedule"),
        instance=found["instance"],
        coalesced=int(found["coalesced"] or 1),
    )
