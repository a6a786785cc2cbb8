"""Backfill: a past range of a job's runs sent on purpose, each once however often it is asked
for, on each store; the tasks go to the suite's RabbitMQ, where they are counted."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from kombu import Connection

import anarchon_celery
from anarchon_celery import ConfigError
from anarchon_celery.backfilling import MAX_BACKFILL_RUNS, backfill_task_id, instant_ms
from anarchon_celery.schedule import resolve_tz

from .support import races
from .support.races import open_kind
from .test_backends import make_backend  # noqa: F401 - the contract's backends
from .test_backup_runners import lease_store  # noqa: F401 - a store with leases, cleaned up

pytestmark = pytest.mark.broker

DAY = 86_400_000
#: 2026-12-01T00:00Z and the day after.
SINCE = 1_796_083_200_000


def _app(broker_url: str, prefix: str, backend: str, **conf: Any) -> Celery:
    app = Celery(f"backfill-{prefix}", broker=broker_url, set_as_current=False)
    app.conf.update(
        task_default_queue=f"{prefix}tasks",
        anarchon_backend=backend,
        anarchon_prefix=prefix,
        timezone="UTC",
        beat_schedule={"hourly": {"task": "t.work", "schedule": "0 * * * *", "args": (1,)}},
        **conf,
    )

    @app.task(name="t.work", shared=False)
    def work(n: int) -> None: ...

    return app


def _sent(broker_url: str, prefix: str) -> list[tuple[int, str, str]]:
    """The messages in the task queue (drained): slot, trigger, task id."""
    found = []
    with Connection(broker_url) as conn:
        while (message := conn.default_channel.basic_get(f"{prefix}tasks", no_ack=True)) is not None:
            headers = message.headers
            found.append((headers["anarchon_slot"], headers["anarchon_trigger"], headers["id"]))
    return sorted(found)


def test_a_range_is_sent_once_however_often_it_is_asked_for(
    lease_store: str,  # noqa: F811
    beat_env: dict[str, str],
    broker_url: str,
    prefix: str,
) -> None:
    app = _app(broker_url, prefix, lease_store)
    until = SINCE + 6 * 3_600_000
    dry = anarchon_celery.backfill(app, "hourly", SINCE, until, dry_run=True)
    assert dry.dry_run and dry.sent == list(range(SINCE, until, 3_600_000)) and _sent(broker_url, prefix) == []
    first = anarchon_celery.backfill(app, "hourly", SINCE, until, rate=1000)
    assert first.sent == list(range(SINCE, until, 3_600_000)) and first.already == [] and first.failed == []
    sent = _sent(broker_url, prefix)
    assert [(slot, trigger) for slot, trigger, _ in sent] == [(slot, "backfill") for slot in first.sent]
    assert [task_id for _, _, task_id in sent] == [backfill_task_id(prefix, "hourly", slot) for slot in first.sent]
    # Asked again, and for a range that overlaps it: only the new runs are sent.
    again = anarchon_celery.backfill(
        app, "hourly", "2026-12-01T03:00:00+00:00", dt.datetime(2026, 12, 1, 8, tzinfo=dt.timezone.utc), rate=1000
    )
    assert again.already == first.sent[3:] and again.sent == [until, until + 3_600_000]
    assert [slot for slot, _, _ in _sent(broker_url, prefix)] == again.sent
    runs = anarchon_celery.history(app, "hourly", limit=20)
    assert sorted((run.slot, run.trigger, run.status) for run in runs) == [
        (slot, "backfill", "sent") for slot in first.sent + again.sent
    ]


def test_bad_ranges_are_refused_with_why(tmp_path: Path, broker_url: str, prefix: str) -> None:
    app = _app(broker_url, prefix, f"sqlite:///{tmp_path / 'b.db'}")
    cases = [
        ((SINCE, 4_000_000_000_000), "until (.*) is in the future"),
        ((SINCE, SINCE), "since must come before until"),
        ((SINCE - 2 * 400 * DAY, SINCE), f"more than {MAX_BACKFILL_RUNS} runs"),
        (("yesterday", SINCE), "'yesterday' is not an ISO 8601 date and time"),
    ]
    for (since, until), message in cases:
        with pytest.raises(ConfigError, match=message):
            anarchon_celery.backfill(app, "hourly", since, until)
    with pytest.raises(ConfigError, match="rate must be"):
        anarchon_celery.backfill(app, "hourly", SINCE, SINCE + DAY, rate=0)
    with pytest.raises(ConfigError, match="no job 'nightly'|unknown job|'nightly'"):
        anarchon_celery.backfill(app, "nightly", SINCE, SINCE + DAY)


def test_backfill_is_refused_on_rabbitmq(broker_url: str, prefix: str) -> None:
    app = _app(broker_url, prefix, broker_url)
    with pytest.raises(ConfigError, match="backfill is not available: the RabbitMQ backend is claim only"):
        anarchon_celery.backfill(app, "hourly", SINCE, SINCE + DAY, dry_run=True)


def test_naive_times_are_in_the_jobs_time_zone() -> None:
    paris = resolve_tz("Europe/Paris")
    assert instant_ms("2026-12-01T01:00", paris, "since") == SINCE
    assert instant_ms(dt.datetime(2026, 12, 1, 1), paris, "since") == SINCE
    assert instant_ms("2026-12-01T00:00+00:00", paris, "since") == SINCE
    assert instant_ms(SINCE, paris, "since") == SINCE


# -- the contract, on each store -------------------------------------------------------------------


def test_a_store_marks_each_run_backfilled_once(make_backend: Any) -> None:  # noqa: F811
    a, b = make_backend(), make_backend()
    if not a.leases:
        pytest.skip("claim only: backfill is refused there")
    store_a, store_b = a.lease_store, b.lease_store
    assert store_a.mark_backfilled("j", [10, 20], "a") == [True, True]
    assert store_b.mark_backfilled("j", [20, 30], "b") == [False, True]
    assert store_b.backfilled("j", [10, 20, 30, 40]) == {10, 20, 30}
    assert store_a.backfilled("other", [10]) == set()
    store_a.unmark_backfilled("j", [20])  # its send failed: asked again, it is sent
    assert store_b.mark_backfilled("j", [20], "b") == [True]
    a.forget_job("j")
    assert store_b.backfilled("j", [10, 20, 30]) == set()


def _mark_race(args: tuple[str, str, str, int, Any]) -> list[bool]:
    kind, target, prefix, me, start = args
    backend = open_kind(kind, target, prefix)
    start.wait()
    try:
        store = backend.lease_store
        assert store is not None
        return [store.mark_backfilled("race", [slot], f"p{me}")[0] for slot in range(1_000, 1_060)]
    finally:
        backend.close()


@pytest.mark.stores
@pytest.mark.parametrize("kind", ["sqlite", "redis", "postgres"])
def test_processes_backfilling_one_range_at_once_mark_each_run_once(
    kind: str, request: pytest.FixtureRequest, prefix: str, tmp_path: Path
) -> None:
    target, prefix = races.place(kind, request, tmp_path, prefix)
    results = races.race(_mark_race, 4, kind, target, prefix)
    assert Counter(sum(marks) for marks in zip(*results)) == {1: 60}
