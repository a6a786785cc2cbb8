"""Real `celery beat` processes deciding their runs in one SQLite file (the tasks go to the
suite's RabbitMQ): every run sent once, and hosts whose clocks are a minute off win nothing."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from anarchon_celery import SQLiteBackend

from .test_faults import Fleet, assert_each_run_once, sent_slots

pytestmark = [pytest.mark.broker, pytest.mark.processes, pytest.mark.stores]


@pytest.mark.timeout(180)
def test_three_beats_on_one_sqlite_file_send_every_run_once(
    beat_env: dict[str, str],
    broker_url: str,
    prefix: str,
    tmp_path: Path,
) -> None:
    database = tmp_path / "anarchon.db"
    env = dict(beat_env, HISTORY_APP_BACKEND=f"sqlite:///{database}", HISTORY_APP_EVERY="1")
    fleet = Fleet(tmp_path, [env] * 3)
    try:
        fleet.wait_ready()
        fleet.wait_any("won, sent")
        time.sleep(8)
        fleet.stop()
    finally:
        fleet.kill()
    slots = sent_slots(broker_url, f"{prefix}tasks")
    assert_each_run_once(slots)
    assert len(slots) >= 6, slots
    backend = SQLiteBackend(database, prefix=prefix)
    holders = Counter(backend.holder("every", slot) for slot in slots)
    backend.close()
    assert None not in holders and len(holders) > 1, holders  # a real race, won by several


@pytest.mark.timeout(180)
def test_beats_whose_clocks_are_a_minute_off_never_win_a_run(
    beat_env: dict[str, str],
    broker_url: str,
    prefix: str,
    tmp_path: Path,
) -> None:
    """One beat on time, one a minute ahead, one a minute behind: the database's clock decides,
    so the one ahead is told its runs are not due yet and the one behind that they are past
    their deadline; the beat on time sends every run, once (none early, as only it sends)."""
    env = dict(beat_env, HISTORY_APP_BACKEND=f"sqlite:///{tmp_path / 'anarchon.db'}", HISTORY_APP_EVERY="1")
    ahead = dict(env, HISTORY_APP_SKEW_MS="60000")
    behind = dict(env, HISTORY_APP_SKEW_MS="-60000")
    fleet = Fleet(tmp_path, [env, ahead, behind], app="tests.apps.skewed_app")
    try:
        fleet.wait_ready()
        fleet.wait_any("won, sent")
        time.sleep(8)
        fleet.stop()
    finally:
        fleet.kill()
    assert_each_run_once(sent_slots(broker_url, f"{prefix}tasks"))
    assert "won, sent" in fleet.text(0)
    assert "won, sent" not in fleet.text(1) and "won, sent" not in fleet.text(2)
    assert "the store's clock says it is not due yet" in fleet.text(1)
    assert "past its deadline by" in fleet.text(2) and "on the database's clock" in fleet.text(2)
