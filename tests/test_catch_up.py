"""Catch-up (``catch_up="latest"`` or ``"all"``): the pure rules (the store's decision of
catch-up claims, the runs of a gap, the settings), the contract on each store, and real beats all
stopped, then started again together."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection

from anarchon_celery import Claim, ConfigError, Outcome, Settings, SQLiteBackend
from anarchon_celery.backends import Backend
from anarchon_celery.backends.base import CATCH_UP, GAP, Gap
from anarchon_celery.backends.ordered import decide
from anarchon_celery.catching_up import ALL_CAP, runs_of_gap
from anarchon_celery.history import encode_event, fold
from anarchon_celery.jobs import catch_up_key, collect_jobs
from anarchon_celery.planning import Plan
from anarchon_celery.runqueue import ClaimAgain

from .support import races
from .support.races import open_kind
from .test_backends import make_backend  # noqa: F401 - the contract's backends
from .test_backup_runners import lease_store  # noqa: F401 - a store with leases, cleaned up
from .test_faults import Fleet
from .test_jobs import make_app

KEPT = 300_000
NOW = 1_800_000_000_000
DAY_MS = 86_400_000


def _decide(claims: list[Claim], cursors: dict[str, int | None], keys: dict[str, str], recorded=()) -> Any:
    gaps: dict[int, int] = {}
    results = decide(claims, NOW, cursors, set(recorded), KEPT, keys, gaps)
    return [outcome for outcome, _ in results], gaps


# -- the store's decision, pure ----------------------------------------------------------------


@pytest.mark.parametrize(
    "cursor, kept, claim_slot, won, gap, cursor_after, key_after",
    [
        (None, "", NOW - 10_000, False, None, NOW - 10_000, "k"),  # a new job: nothing from before it
        (NOW - 30_000, "old", NOW - 10_000, False, None, NOW - 10_000, "k"),  # changed: from the change
        (NOW - 30_000, "", NOW - 10_000, False, None, NOW - 10_000, "k"),  # catch-up just enabled
        (NOW - 30_000, "k", NOW - 10_000, True, NOW - 30_000, NOW - 10_000, "k"),  # a gap: won
        (NOW - 10_000, "k", NOW - 10_000, False, None, NOW - 10_000, "k"),  # decided already
        (NOW - 5_000, "k", NOW - 10_000, False, None, NOW - 5_000, "k"),  # inside another win's gap
    ],
)
def test_a_catch_up_claim_wins_only_a_gap_of_the_same_schedule(
    cursor: int | None, kept: str, claim_slot: int, won: bool, gap: int | None, cursor_after: int, key_after: str
) -> None:
    cursors = {"j": cursor}
    keys = {"j": kept} if cursor is not None else {}
    outcomes, gaps = _decide([Claim("j", claim_slot, key="k", kind=CATCH_UP)], cursors, keys)
    assert outcomes == [Outcome.WON if won else Outcome.LOST]
    assert gaps.get(0) == gap
    assert (cursors["j"], keys["j"]) == (cursor_after, key_after)


@pytest.mark.parametrize(
    "kept, key, gap, key_after",
    [
        ("k", "k", NOW - 30_000, "k"),  # the same schedule: the gap is reported
        ("old", "k", None, "k"),  # changed: no gap before the change
        ("k", "", None, ""),  # catch-up turned off: nothing reported, and the key forgotten
        ("", "", None, ""),  # a job without catch-up
    ],
)
def test_a_regular_win_reports_the_gap_it_leaves_when_the_key_is_kept(
    kept: str, key: str, gap: int | None, key_after: str
) -> None:
    cursors: dict[str, int | None] = {"j": NOW - 30_000}
    keys = {"j": kept}
    outcomes, gaps = _decide([Claim("j", NOW - 1_000, key=key)], cursors, keys)
    assert outcomes == [Outcome.WON]
    assert gaps.get(0) == gap
    assert keys["j"] == key_after


def test_runs_inside_a_gap_are_won_unless_decided_and_leave_the_cursor_be() -> None:
    cursors: dict[str, int | None] = {"j": NOW - 1_000}
    claims = [Claim("j", NOW - 20_000, kind=GAP), Claim("j", NOW - 10_000, kind=GAP)]
    outcomes, gaps = _decide(claims, cursors, {"j": "k"}, recorded=[("j", NOW - 10_000)])
    assert outcomes == [Outcome.WON, Outcome.LOST]
    assert gaps == {}
    assert cursors["j"] == NOW - 1_000


def test_instances_back_together_decide_each_gap_once() -> None:
    """Whatever order the claims of instances back at once come in, the missed runs' gaps do not
    overlap: the cursor moves once past each."""
    rng = random.Random(7)
    for _ in range(200):
        cursors: dict[str, int | None] = {"j": 0}
        keys = {"j": "k"}
        recorded: set[tuple[str, int]] = set()
        owned: list[tuple[int, int]] = []
        claims = [Claim("j", slot, key="k", kind=rng.choice([CATCH_UP, ""])) for slot in range(1_000, 10_001, 1_000)]
        for _instance in range(3):
            batch = rng.sample(claims, rng.randint(1, len(claims)))
            gaps: dict[int, int] = {}
            results = decide(batch, 20_000, cursors, recorded, KEPT * 1_000, keys, gaps)
            for i, (outcome, _) in enumerate(results):
                if outcome is Outcome.WON:
                    recorded.add(("j", batch[i].slot))
                    if i in gaps:
                        end = batch[i].slot + (1 if batch[i].kind == CATCH_UP else 0)
                        owned.append((gaps[i] + 1, end))
        covered = Counter(slot for low, high in owned for slot in range(1_000, 10_001, 1_000) if low <= slot < high)
        assert all(count == 1 for count in covered.values()), covered


# -- the runs of a gap, pure -----------------------------------------------------------------------


def _job(tmp_path: Path, **keys: Any) -> Any:
    app = make_app(beat_schedule={"j": {"task": "tasks.work", "schedule": 2.0, "max_late_ms": 1_000, **keys}})
    backend = SQLiteBackend(tmp_path / "rules.db")  # its rules only: not opened
    return {job.name: job for job in collect_jobs(app, Settings.from_app(app), backend)}["j"]


def test_latest_sends_the_newest_missed_run_for_all_of_them(tmp_path: Path) -> None:
    job = _job(tmp_path, catch_up="latest")
    now = 1_000_000
    found = runs_of_gap(job, Gap(Claim("j", 900_000, kind=CATCH_UP), 840_000), now)
    assert found.send == [(900_000, 30)]  # 842 000 to 900 000, every 2 s
    found = runs_of_gap(job, Gap(Claim("j", 902_000), 840_000), now)  # a regular win: not its own slot
    assert found.send == [(900_000, 30)]
    assert found.dropped == 0


def test_all_sends_every_missed_run_in_slot_order_the_newest_up_to_the_cap(tmp_path: Path) -> None:
    job = _job(tmp_path, catch_up="all")
    found = runs_of_gap(job, Gap(Claim("j", 900_000, kind=CATCH_UP), 890_000), 1_000_000)
    assert found.send == [(slot, 1) for slot in range(892_000, 900_001, 2_000)]
    found = runs_of_gap(job, Gap(Claim("j", 900_000, kind=CATCH_UP), 0), 1_000_000)
    assert [slot for slot, _ in found.send] == list(range(900_000 - (ALL_CAP - 1) * 2_000, 900_001, 2_000))
    assert (found.over_cap, found.too_old) == (450 - ALL_CAP, 0)
    assert (found.first_dropped, found.last_dropped) == (2_000, 900_000 - ALL_CAP * 2_000)


def test_runs_older_than_the_window_are_counted_not_sent(tmp_path: Path) -> None:
    job = _job(tmp_path, catch_up="latest", catch_up_window_ms=10_000)
    found = runs_of_gap(job, Gap(Claim("j", 100_000), 0), 100_500)
    assert found.send == [(98_000, 4)]  # the window is 90 500 to 100 500: 92 000 to 98 000 missed
    assert (found.too_old, found.first_dropped, found.last_dropped) == (45, 2_000, 90_000)
    nothing = runs_of_gap(job, Gap(Claim("j", 100_000), 0), 200_000)
    assert nothing.send == [] and nothing.too_old == 49


def test_a_long_gap_costs_the_runs_sent_not_its_length(tmp_path: Path) -> None:
    job = _job(tmp_path, catch_up="latest", catch_up_window_ms=3 * DAY_MS, schedule=1.0)
    now = 10 * DAY_MS
    found = runs_of_gap(job, Gap(Claim("j", now - 5_000, kind=CATCH_UP), now - 2 * DAY_MS), now)
    assert found.send == [(now - 5_000, 2 * 86_400 - 5)]  # exactly, without walking 172,800 slots
    job = _job(tmp_path, catch_up="all", catch_up_window_ms=3 * DAY_MS, schedule=1.0)
    found = runs_of_gap(job, Gap(Claim("j", now), now - 2 * DAY_MS), now)
    assert [slot for slot, _ in found.send] == list(range(now - ALL_CAP * 1_000, now, 1_000))
    assert (found.over_cap, found.first_dropped, found.last_dropped) == (
        2 * 86_400 - 1 - ALL_CAP,
        now - 2 * DAY_MS + 1_000,
        now - (ALL_CAP + 1) * 1_000,
    )


def test_a_catch_up_claims_own_slot_is_sent_even_at_the_windows_edge(tmp_path: Path) -> None:
    job = _job(tmp_path, catch_up="all", catch_up_window_ms=10_000)
    # The store let it be won just inside the window; this instance's clock is a little later.
    found = runs_of_gap(job, Gap(Claim("j", 100_000, kind=CATCH_UP), 90_000), 110_050)
    assert found.send == [(100_000, 1)] and found.too_old == 4


def test_cron_gaps_are_counted_and_their_newest_runs_found(tmp_path: Path) -> None:
    job = _job(tmp_path, catch_up="latest", schedule="*/5 * * * *")
    start = 1_796_083_200_000  # 2026-12-01T00:00Z
    found = runs_of_gap(job, Gap(Claim("j", start + 3_600_000), start), start + 3_600_500)
    assert found.send == [(start + 3_300_000, 11)]  # 00:05 to 00:55


# -- settings and jobs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "keys, message",
    [
        ({"catch_up": True}, "must be False, 'latest' or 'all', not True"),
        ({"catch_up": "earliest"}, "must be False, 'latest' or 'all', not 'earliest'"),
        ({"catch_up": "all", "catch_up_window_ms": 500}, "catch_up_window_ms must be an integer >= 1000"),
        ({"catch_up": "all", "catch_up_window_ms": 1_500, "max_late_ms": 2_000}, "must be at least max_late_ms"),
    ],
)
def test_bad_catch_up_keys_are_refused_naming_the_job(tmp_path: Path, keys: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        _job(tmp_path, **keys)
    assert "job 'j'" in str(info.value)


def test_the_settings_are_every_jobs_default_and_a_job_may_turn_it_off(tmp_path: Path) -> None:
    app = make_app(
        anarchon_catch_up="all",
        anarchon_catch_up_window_ms=3_600_000,
        beat_schedule={
            "a": {"task": "tasks.work", "schedule": 2.0},
            "b": {"task": "tasks.work", "schedule": 2.0, "catch_up": False},
        },
    )
    jobs = {job.name: job for job in collect_jobs(app, Settings.from_app(app), SQLiteBackend(tmp_path / "r.db"))}
    assert (jobs["a"].catch_up, jobs["a"].catch_up_window_ms) == ("all", 3_600_000)
    assert jobs["b"].catch_up is None and catch_up_key(jobs["b"]) == ""
    with pytest.raises(ConfigError, match="anarchon_catch_up must be False, 'latest' or 'all'"):
        Settings.from_app(make_app(anarchon_catch_up="yes"))


def test_the_key_changes_with_the_schedule_and_the_policy(tmp_path: Path) -> None:
    keys = {
        catch_up_key(_job(tmp_path, catch_up="latest")),
        catch_up_key(_job(tmp_path, catch_up="all")),
        catch_up_key(_job(tmp_path, catch_up="all", schedule=4.0)),
    }
    assert len(keys) == 3
    assert catch_up_key(_job(tmp_path, catch_up="all")) in keys  # and is the same each time


# -- planning, pure ----------------------------------------------------------------------------------


def test_at_start_the_newest_run_too_late_is_claimed_for_catch_up(tmp_path: Path) -> None:
    job = _job(tmp_path, catch_up="latest", jitter_ms=0)
    plan = Plan({"j": job}, SQLiteBackend(tmp_path / "r.db"), 0, random.Random(1))
    now = 1_000_500
    plan.start(now, {"j": 0})  # a job that existed long before
    items = plan.queue.take(now, 10)
    again = [item for item in items if isinstance(item, ClaimAgain)]
    assert [item.slot for item in again] == [998_000]  # before now - max_late_ms (999 500)
    claim = plan.claim_of(again[0], now)
    assert claim is not None and (claim.kind, claim.key) == (CATCH_UP, catch_up_key(job))
    assert claim.deadline_ms == 998_000 + job.catch_up_window_ms
    # An older run found too late is left to the newest one's claim.
    assert plan.claim_of(ClaimAgain(now, "j", 996_000, 996_000), now) is None


@pytest.mark.parametrize(
    ("born", "first", "caught_up"),
    [
        (0, 999_500 + 500, [998_000]),  # existed long before: the runs within lateness, and catch-up
        (999_000, 1_000_000, []),  # born inside the lateness: its runs from then on, nothing caught up
        (1_000_500, 1_002_000, []),  # born now (a new job): its next run first
        (997_000, 1_000_000, [998_000]),  # born inside the catch-up window: caught up from then on
    ],
)
def test_at_start_no_run_from_before_the_job_came_to_be_is_queued(
    tmp_path: Path, born: int, first: int, caught_up: list[int]
) -> None:
    job = _job(tmp_path, catch_up="latest", jitter_ms=0)  # every 2 s, max_late_ms 1 000
    plan = Plan({"j": job}, SQLiteBackend(tmp_path / "r.db"), 0, random.Random(1))
    now = 1_000_500
    plan.start(now, {"j": born})
    items = plan.queue.take(now + 10_000, 100)
    assert min(item.slot for item in items if not isinstance(item, ClaimAgain)) == first
    assert [item.slot for item in items if isinstance(item, ClaimAgain)] == caught_up


# -- history ---------------------------------------------------------------------------------------------


def test_a_skipped_record_stands_for_the_runs_not_caught_up() -> None:
    event = encode_event(
        "skipped", run="r", job="j", at_ms=5, slot=90, first_slot=2, count=45, instance="h:1", reason="catch_up_window"
    )
    sent = encode_event("sent", run="c", job="j", at_ms=6, slot=98, trigger="catch_up", coalesced=5)
    runs = {run.run_id: run for run in fold([json.loads(event), json.loads(sent)])}
    assert (runs["r"].status, runs["r"].reason, runs["r"].coalesced, runs["r"].slot) == (
        "skipped",
        "catch_up_window",
        45,
        90,
    )
    assert (runs["c"].trigger, runs["c"].coalesced) == ("catch_up", 5)
    with pytest.raises(ValueError, match="skipped event's reason"):
        encode_event("skipped", run="r", job="j", at_ms=5, reason="bored")


# -- the contract, on each store -------------------------------------------------------------------


def _store(make_backend: Any) -> Backend:  # noqa: F811
    backend = make_backend()
    if not backend.leases:
        pytest.skip("claim only: catch-up is refused there")
    return backend


def test_a_store_catches_up_a_gap_once_and_a_new_job_nothing(make_backend: Any) -> None:  # noqa: F811
    a, b = _store(make_backend), _store(make_backend)
    store_a, store_b = a.lease_store, b.lease_store
    assert store_a is not None and store_b is not None
    # A new job: its catch-up claim wins nothing, and starts the job's cursor there.
    assert a.claim([Claim("j", 10_000, key="k", kind=CATCH_UP)], "a") == [Outcome.LOST]
    assert store_a.gaps() == []
    # Runs missed since: the first catch-up claim wins the gap; the others lose, before or after it.
    claims = [Claim("j", 50_000, key="k", kind=CATCH_UP), Claim("j", 40_000, key="k", kind=CATCH_UP)]
    assert a.claim(claims[:1], "a") == [Outcome.WON]
    assert store_a.gaps() == [Gap(claims[0], 10_000)]
    assert b.claim(claims, "b") == [Outcome.LOST, Outcome.LOST]
    assert store_b.gaps() == []
    # The runs inside it are its winner's to claim: once.
    inside = [Claim("j", slot, kind=GAP) for slot in (20_000, 30_000, 40_000)]
    assert a.claim(inside, "a") == [Outcome.WON] * 3
    assert b.claim(inside, "b") == [Outcome.LOST] * 3
    # A regular win after another gap reports it; a changed schedule reports none.
    assert a.claim([Claim("j", 90_000, key="k")], "a") == [Outcome.WON]
    assert [gap.after for gap in store_a.gaps()] == [50_000]
    assert b.claim([Claim("j", 120_000, key="changed")], "b") == [Outcome.WON]
    assert store_b.gaps() == []
    assert a.claim([Claim("j", 150_000, key="changed", kind=CATCH_UP)], "a") == [Outcome.WON]
    assert [gap.after for gap in store_a.gaps()] == [120_000]


def test_a_run_won_inside_a_gap_is_not_won_again_by_a_recovering_claim(make_backend: Any) -> None:  # noqa: F811
    """A run whose claim's answer was lost (in doubt), then won by this instance inside a gap: a
    claim of it made again later, beside another run in doubt, is lost, not won a second time."""
    a = _store(make_backend)
    store = a.lease_store
    assert a.claim([Claim("j", 10_000, key="k")], "a") == [Outcome.WON]
    a._in_doubt.update({("j", 20_000), ("other", 5_000)})  # type: ignore[attr-defined]
    assert a.claim([Claim("j", 40_000, key="k")], "a") == [Outcome.WON]
    assert [gap.after for gap in store.gaps()] == [10_000]
    assert a.claim([Claim("j", 20_000, kind=GAP)], "a") == [Outcome.WON]
    again = [Claim("j", 20_000, key="k"), Claim("other", 5_000)]
    assert a.claim(again, "a") == [Outcome.LOST, Outcome.WON]


def test_a_job_that_stops_catching_up_forgets_its_key(make_backend: Any) -> None:  # noqa: F811
    a = _store(make_backend)
    assert a.claim([Claim("j", 10_000, key="k")], "a") == [Outcome.WON]
    assert a.claim([Claim("j", 20_000)], "a") == [Outcome.WON]  # catch-up off
    assert a.claim([Claim("j", 50_000, key="k", kind=CATCH_UP)], "a") == [Outcome.LOST]  # on again: from now
    assert a.lease_store is not None and a.lease_store.gaps() == []


def _catch_up_race(args: tuple[str, str, str, int, int, Any]) -> list[str]:
    kind, target, prefix, rounds, me, start = args
    backend = open_kind(kind, target, prefix)
    start.wait()
    try:
        return [
            backend.claim([Claim("race", 1_000 + 10 * n, key="k", kind=CATCH_UP)], f"p{me}")[0].value
            for n in range(1, rounds + 1)
        ]
    finally:
        backend.close()


@pytest.mark.stores
@pytest.mark.parametrize("kind", ["sqlite", "redis", "postgres"])
def test_processes_catching_up_the_same_runs_get_one_winner_each(
    kind: str, request: pytest.FixtureRequest, prefix: str, tmp_path: Path
) -> None:
    target, prefix = races.place(kind, request, tmp_path, prefix)
    first = open_kind(kind, target, prefix)
    try:
        assert first.claim([Claim("race", 1_000, key="k")], "first") == [Outcome.WON]
    finally:
        first.close()
    processes, rounds = 4, 60
    results = races.race(_catch_up_race, processes, kind, target, prefix, rounds)
    for n in range(rounds):
        outcomes = Counter(result[n] for result in results)
        # Each round's run is won once, unless a later round's win passed it (a process ahead).
        assert outcomes["won"] <= 1 and outcomes["won"] + outcomes["lost"] == processes, (n, outcomes)
    assert sum(result.count("won") for result in results) >= 1


# -- real beats, all stopped, then started again together -------------------------------------------


def _caught_up(broker_url: str, prefix: str) -> list[tuple[int, str, int]]:
    """The runs of job ``every`` in the task queue (drained): slot, trigger, coalesced."""
    runs = []
    with Connection(broker_url) as conn:
        while (message := conn.default_channel.basic_get(f"{prefix}tasks", no_ack=True)) is not None:
            headers = message.headers
            if headers["anarchon_job"] == "every":
                runs.append(
                    (headers["anarchon_slot"], headers["anarchon_trigger"], headers.get("anarchon_coalesced", 0))
                )
    return sorted(runs)


def _run_for_a_while(where: Path, env: dict[str, str], until: str) -> str:
    """Two beats started together, until one logs ``until``, 3 s more, stopped; their logs."""
    where.mkdir()
    fleet = Fleet(where, [env, env])
    try:
        fleet.wait_ready()
        fleet.wait_any(until)
        time.sleep(3)
        fleet.stop()
    finally:
        fleet.kill()
    return "".join(fleet.text(i) for i in range(2))


@pytest.mark.processes
@pytest.mark.timeout(240)
@pytest.mark.parametrize("policy", ["latest", "all"])
def test_beats_all_stopped_then_started_together_catch_up_each_missed_run_once(
    policy: str,
    lease_store: str,  # noqa: F811
    beat_env: dict[str, str],
    broker_url: str,
    prefix: str,
    tmp_path: Path,
) -> None:
    """Two beats, a job every 2 s, a lateness of 1 s: both stopped for about 12 s, then started
    together. ``latest``: one run of catch-up for the gap; ``all``: one per missed slot. Every
    slot is sent once at most, and none twice."""
    env = dict(
        beat_env,
        HISTORY_APP_BACKEND=lease_store,
        HISTORY_APP_MAX_LATE_MS="1000",
        HISTORY_APP_JITTER_MS="300",
        HISTORY_APP_CATCH_UP=policy,
    )
    _run_for_a_while(tmp_path / "first", env, "won, sent")
    stopped = time.time()
    time.sleep(12)
    text = _run_for_a_while(tmp_path / "second", env, "catching up")
    runs = _caught_up(broker_url, prefix)
    slots = [slot for slot, _, _ in runs]
    assert len(slots) == len(set(slots)), runs  # no run twice
    caught = [(slot, coalesced) for slot, trigger, coalesced in runs if trigger == "catch_up"]
    assert caught, runs
    if policy == "latest":
        assert len(caught) == 1, runs
        slot, coalesced = caught[0]
        assert coalesced >= 4 and slot > stopped * 1000, runs  # about 12 s of a run every 2 s
    else:
        assert all(coalesced == 1 for _, coalesced in caught), runs
        assert len(caught) >= 4, runs
        # Every slot of the gap was sent: none is missing between the first run and the last.
        assert [slot for slot in range(slots[0], slots[-1] + 1, 2_000) if slot not in slots] == [], runs
    assert "Traceback" not in text


@pytest.mark.processes
@pytest.mark.timeout(180)
def test_beats_all_frozen_at_once_catch_up_when_they_thaw(
    beat_env: dict[str, str], broker_url: str, prefix: str, tmp_path: Path
) -> None:
    """Both beats SIGSTOPped for 9 s (a paused VM), then SIGCONTed: the gap is found by the claims
    they make on waking, not at a start; one run of catch-up stands for the runs missed, and no
    run is sent twice."""
    env = dict(
        beat_env,
        HISTORY_APP_BACKEND=f"sqlite:///{tmp_path / 'anarchon.db'}",
        HISTORY_APP_MAX_LATE_MS="1000",
        HISTORY_APP_JITTER_MS="300",
        HISTORY_APP_CATCH_UP="latest",
    )
    fleet = Fleet(tmp_path, [env, env])
    try:
        fleet.wait_ready()
        fleet.wait_any("won, sent")
        time.sleep(2)
        for proc in fleet.procs:
            os.killpg(proc.pid, signal.SIGSTOP)
        frozen = time.time()
        time.sleep(9)
        for proc in fleet.procs:
            os.killpg(proc.pid, signal.SIGCONT)
        fleet.wait_any("catching up")
        time.sleep(3)
        fleet.stop()
    finally:
        for proc in fleet.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGCONT)
        fleet.kill()
    runs = _caught_up(broker_url, prefix)
    slots = [slot for slot, _, _ in runs]
    assert len(slots) == len(set(slots)), runs  # no run twice
    caught = [(slot, coalesced) for slot, trigger, coalesced in runs if trigger == "catch_up"]
    assert len(caught) == 1, runs
    slot, coalesced = caught[0]
    assert coalesced >= 3 and slot > frozen * 1000, runs  # about 9 s of a run every 2 s
    assert "Traceback" not in fleet.text(0) + fleet.text(1)
