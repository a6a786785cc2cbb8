"""What a task knows of its run (anarchon_celery.scheduled_run): from a request's headers or its
attributes, in a task applied eagerly, and outside a task. A real worker running runs sent by real
beats reads them the same way: the demo's tasks record their job and slot with it
(examples/demo_app.py), and tests/test_e2e.py counts each run once by them."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

import anarchon_celery
from anarchon_celery import ScheduledRun, scheduled_run

HEADERS = {
    "anarchon_job": "nightly",
    "anarchon_slot": 1_796_542_200_000,
    "anarchon_run": "6f1c4a35-0000-5000-8000-000000000000",
    "anarchon_trigger": "schedule",
    "anarchon_instance": "host:42",
}
EXPECTED = ScheduledRun(
    job="nightly",
    slot_ms=1_796_542_200_000,
    run_id="6f1c4a35-0000-5000-8000-000000000000",
    trigger="schedule",
    instance="host:42",
)


@pytest.mark.parametrize(
    "request_",
    [
        SimpleNamespace(headers=HEADERS),  # protocol 2, applied eagerly: request.headers
        SimpleNamespace(headers=None, **HEADERS),  # a worker: unknown headers become attributes
        SimpleNamespace(headers={"other": 1}, **HEADERS),
    ],
    ids=["headers", "attributes", "both"],
)
def test_a_run_is_read_from_its_request(request_: Any) -> None:
    assert scheduled_run(request_) == EXPECTED


def test_the_slot_as_a_datetime_in_utc() -> None:
    assert EXPECTED.scheduled_for == dt.datetime(2026, 12, 6, 7, 30, tzinfo=dt.timezone.utc)
    assert EXPECTED.scheduled_for.timestamp() * 1000 == EXPECTED.slot_ms


@pytest.mark.parametrize(
    "request_",
    [
        SimpleNamespace(headers=None),
        SimpleNamespace(headers={"other": 1}),
        SimpleNamespace(headers={"anarchon_run": "r"}),  # no job, no slot: not a run of ours
        SimpleNamespace(headers={k: v for k, v in HEADERS.items() if k != "anarchon_run"}),
    ],
)
def test_a_task_the_scheduler_did_not_send_has_no_run(request_: Any) -> None:
    assert scheduled_run(request_) is None


def test_outside_a_task_there_is_no_run() -> None:
    assert scheduled_run() is None


def test_in_a_task_applied_eagerly_with_and_without_its_request() -> None:
    app = Celery("task_run_test", set_as_current=False)
    seen: list[tuple[ScheduledRun | None, ScheduledRun | None]] = []

    @app.task(bind=True, shared=False, name="task_run_test.report")
    def report(self: Any) -> None:
        seen.append((anarchon_celery.scheduled_run(self.request), anarchon_celery.scheduled_run()))

    report.apply(headers={**HEADERS, "anarchon_trigger": "manual"})
    report.apply()
    manual = ScheduledRun(**{**EXPECTED.__dict__, "trigger": "manual"})
    assert seen == [(manual, manual), (None, None)]
