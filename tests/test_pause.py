"""Pause and resume: the pure rules (a pause's form, its end, a resumed job's cursor), the contract
on every backend (a paused job's runs are decided once and not sent; resuming replays nothing),
the Python API's errors, and real beats paused and resumed from the command line."""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import time
from pathlib import Path
from typing import Any

import pytest

import anarchon_celery
from anarchon_celery import Claim, ConfigError, Outcome, Pause
from anarchon_celery.backends import Backend, RabbitMQBackend
from anarchon_celery.backends.base import CATCH_UP
from anarchon_celery.backends.ordered import end_expired_pauses, resumed_cursor, set_paused
from anarchon_celery.backends.pauses import check_note
from anarchon_celery.backends.rabbitmq.control_log import fold as fold_log
from anarchon_celery.catching_up import CatchUps
from anarchon_celery.history import decode_event, encode_event, fold
from anarchon_celery.jobs import collect_jobs
from anarchon_celery.schedule import to_ms
from anarchon_celery.settings import Settings

from .support.stores import history_app_on
from .test_backends import make_backend  # noqa: F401 - the contract's backends
from .test_cli import celery
from .test_faults import Fleet, sent_slots
from .test_jobs import make_app

# -- the rules, pure ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pause",
    [
        Pause("ann@host", 1_800_000_000_000),
        Pause("ann@host", 1_800_000_000_000, "the database is migrated", 1_800_000_600_000),
        Pause("", 0, "é ü"),
    ],
)
def test_a_pause_round_trips_through_its_json(pause: Pause) -> None:
    assert Pause.decode(pause.encode()) == pause


@pytest.mark.parametrize("text", [None, "", "not json", "[1]", '{"by": "a"}', '{"at": "soon"}'])
def test_what_is_not_a_pause_reads_as_none(text: str | None) -> None:
    assert Pause.decode(text) is None


@pytest.mark.parametrize(
    "until, now, paused",
    [(None, 10**13, True), (2_000, 1_999, True), (2_000, 2_000, False), (2_000, 5_000, False)],
)
def test_a_pause_is_in_effect_until_its_until(until: int | None, now: int, paused: bool) -> None:
    assert Pause("a", 1_000, until_ms=until).in_effect(now) is paused


def test_a_note_is_one_line_and_bounded() -> None:
    assert check_note("  the\n database\tmigration ") == "the database migration"
    assert len(check_note("x" * 2_000)) == 500
    with pytest.raises(ConfigError, match="a pause's note is text"):
        check_note(3)


@pytest.mark.parametrize(
    "cursor, at, after", [(None, 5_000, None), (1_000, 5_000, 5_000), (9_000, 5_000, 9_000), (5_000, 5_000, 5_000)]
)
def test_a_resumed_jobs_cursor_moves_up_to_the_resume(cursor: int | None, at: int, after: int | None) -> None:
    assert resumed_cursor(cursor, at) == after


def test_a_pause_that_ran_out_ends_in_the_claim_with_the_cursor_at_its_end() -> None:
    pauses = {"a": Pause("x", 0, until_ms=5_000), "b": Pause("x", 0, until_ms=9_000), "c": Pause("x", 0)}
    cursors: dict[str, int | None] = {"a": 1_000, "b": 1_000, "c": 1_000}
    assert end_expired_pauses(pauses, cursors, now_ms=6_000) == ["a"]
    assert sorted(pauses) == ["b", "c"]
    assert cursors == {"a": 5_000, "b": 1_000, "c": 1_000}


def test_wins_of_a_paused_job_become_paused_and_leave_no_gap() -> None:
    claims = [Claim("a", 10), Claim("b", 10), Claim("a", 20)]
    results = [(Outcome.WON, 0), (Outcome.WON, 0), (Outcome.LOST, 0)]
    gaps = {0: 5, 1: 5}
    assert set_paused(claims, results, {"a": Pause("x", 0)}, gaps) == [0]
    assert results == [(Outcome.PAUSED, 0), (Outcome.WON, 0), (Outcome.LOST, 0)]
    assert gaps == {1: 5}


def test_the_control_log_folds_in_order() -> None:
    pause = json.loads(Pause("ann", 1).encode())
    records = [
        {"op": "pause", "job": "a", "pause": pause},
        {"op": "pause", "job": "b", "pause": pause},
        {"op": "resume", "job": "a"},
        {"op": "pause", "job": "c", "pause": {"nonsense": 1}},
        {"op": "resume", "job": "never-paused"},
    ]
    assert fold_log(records).pauses == {"b": Pause("ann", 1)}


def test_a_paused_run_folds_to_status_paused() -> None:
    event = encode_event("paused", run="r1", job="j", at_ms=5, slot=3, instance="host:1")
    runs = fold([json.loads(event)])
    assert [(r.status, r.slot, r.instance, r.finished_at_ms) for r in runs] == [("paused", 3, "host:1", 5)]


# -- the contract, on every backend ---------------------------------------------------------------


def _sees(backend: Backend, job: str, paused: bool) -> None:
    """Wait until ``backend`` acts on the job's pause (RabbitMQ: once it has read the change from
    the control log, as it does whenever its connection is read); the stores read it in the claim."""
    if not isinstance(backend, RabbitMQBackend):
        return
    deadline = time.monotonic() + 10
    while backend._control.paused(job) is not paused:  # noqa: SLF001 - what the instance has read
        assert time.monotonic() < deadline, f"the pause of {job!r} never reached the instance"
        backend.maintain()
        time.sleep(0.05)


def _recent() -> int:
    """A slot a minute ago: runs after it, up to now, can still be won once a resume has moved
    their job's cursor up to now (a store wins a run its cursor passed while it is recent)."""
    return int(time.time() * 1000) - 60_000


def test_a_paused_jobs_runs_are_decided_once_and_not_sent(make_backend: Any) -> None:  # noqa: F811
    a, b = make_backend(), make_backend()
    base = _recent()
    assert a.claim([Claim("j", base)], "a") == [Outcome.WON]
    b.claim([Claim("other", base)], "b")  # (b follows the deployment's pauses from now on)
    a.pause("j", Pause("ann@host", 1, "migration"))
    _sees(b, "j", True)
    assert b.claim([Claim("j", base + 10_000), Claim("other", base + 10_000)], "b") == [Outcome.PAUSED, Outcome.WON]
    assert a.claim([Claim("j", base + 10_000)], "a") == [Outcome.LOST]  # decided: once
    assert a.pauses() == b.pauses() == {"j": Pause("ann@host", 1, "migration")}
    assert b.resume("j") == Pause("ann@host", 1, "migration")
    _sees(b, "j", False)
    assert b.claim([Claim("j", base + 50_000)], "b") == [Outcome.WON]
    assert a.pauses() == {} and a.resume("j") is None


def test_on_won_is_not_told_of_a_paused_run(make_backend: Any) -> None:  # noqa: F811
    a = make_backend()
    a.claim([Claim("other", 10_000)], "a")
    a.pause("j", Pause("ann@host", 1))
    _sees(a, "j", True)
    told: list[Claim] = []
    assert a.claim([Claim("j", 10_000), Claim("other", 20_000)], "a", on_won=told.append) == [
        Outcome.PAUSED,
        Outcome.WON,
    ]
    assert told in ([Claim("other", 20_000)], [])  # (a backend may tell no win as it comes)


def _store(make_backend: Any) -> Backend:  # noqa: F811
    backend = make_backend()
    if not backend.leases:
        pytest.skip("no cursor: nothing to catch up")
    return backend


def test_resuming_never_catches_up_the_paused_range(make_backend: Any) -> None:  # noqa: F811
    """No instance claimed while the job was paused (all stopped): the resume moves its cursor
    up, so the next win leaves no gap; without the pause, it would leave one to catch up."""
    a = _store(make_backend)
    store = a.lease_store
    assert store is not None
    assert a.claim([Claim("j", 10_000, key="k")], "a") == [Outcome.WON]
    a.pause("j", Pause("ann", 1))
    assert a.resume("j") is not None
    slot = int(time.time() * 1000) - 1_000
    assert a.claim([Claim("j", slot, key="k")], "a") == [Outcome.WON]
    assert store.gaps() == []
    assert a.claim([Claim("j", slot - 500, key="k", kind=CATCH_UP)], "a") == [Outcome.LOST]
    # The same without the pause: the gap is reported.
    assert a.claim([Claim("g", 10_000, key="k")], "a") == [Outcome.WON]
    assert a.claim([Claim("g", slot, key="k")], "a") == [Outcome.WON]
    assert [gap.after for gap in store.gaps()] == [10_000]


def test_a_pause_with_until_ends_by_itself(make_backend: Any) -> None:  # noqa: F811
    a = make_backend()
    base = _recent()
    a.claim([Claim("other", base)], "a")
    until = int(time.time() * 1000) + 1_500
    a.pause("j", Pause("ann", 1, until_ms=until))
    _sees(a, "j", True)
    assert a.claim([Claim("j", base)], "a") == [Outcome.PAUSED]
    assert list(a.pauses()) == ["j"]
    time.sleep(max(0.0, (until - time.time() * 1000) / 1000) + 0.3)
    assert a.claim([Claim("j", until - 500)], "a") == [Outcome.WON]  # (due before the end, claimed after it)
    assert a.pauses() == {} and a.resume("j") is None


def test_the_runs_of_a_gap_found_paused_are_logged_and_recorded(
    make_backend: Any,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A job paused between the win that found a gap and the claims of the runs inside it: those
    runs are decided paused, and each is logged and recorded, as a scheduler's own claims' are."""
    a = _store(make_backend)
    app = make_app(beat_schedule={"j": {"task": "tasks.work", "schedule": 10.0, "catch_up": "all"}})
    job = {job.name: job for job in collect_jobs(app, Settings.from_app(app), a)}["j"]
    base = _recent() // 10_000 * 10_000
    assert a.claim([Claim("j", base, key="k")], "a") == [Outcome.WON]
    assert a.claim([Claim("j", base + 40_000, key="k")], "a") == [Outcome.WON]  # after a gap of 3 runs
    a.pause("j", Pause("ann", 1))
    catch_ups = CatchUps({"j": job}, "a", a.prefix)
    with caplog.at_level(logging.INFO, logger="anarchon_celery"):
        assert catch_ups.runs(a, [], lambda *_: pytest.fail("a paused run made to be sent")) == []
    gap = [base + 10_000, base + 20_000, base + 30_000]
    lines = [r.getMessage() for r in caplog.records if "paused; not sent" in r.getMessage()]
    assert lines == [
        f"anarchon: job 'j' slots {gap[0]}, {gap[1]}, {gap[2]}: the job is paused; not sent (recorded paused)"
    ]
    events = [decode_event(event) for _, event, _ in catch_ups.skipped()]
    assert [(event["event"], event["slot"]) for event in events if event] == [("paused", slot) for slot in gap]


def test_a_stores_pause_is_kept_for_a_new_instance_and_goes_with_the_job(make_backend: Any) -> None:  # noqa: F811
    a = _store(make_backend)
    a.pause("j", Pause("ann", 1))
    b = make_backend()
    assert b.claim([Claim("j", 10_000)], "b") == [Outcome.PAUSED]
    state = b.job_state
    assert state is not None
    state.forget_job("j")
    assert b.pauses() == {}
    assert b.claim([Claim("j", 20_000)], "b") == [Outcome.WON]


# -- the Python API -------------------------------------------------------------------------------


def _app() -> Any:
    return make_app(beat_schedule={"nightly": {"task": "tasks.work", "schedule": "0 3 * * *"}})


def test_pausing_a_job_that_does_not_exist_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="no job named 'nighty'. Did you mean 'nightly'"):
        anarchon_celery.pause(_app(), "nighty")
    with pytest.raises(ConfigError, match="no job named 'nighty'"):
        anarchon_celery.resume(_app(), "nighty")


@pytest.mark.parametrize(
    "until, message",
    [("2001-01-01T00:00", "until must be in the future"), ("tomorrow", "is not an ISO 8601"), (True, "must be a date")],
)
def test_a_pause_until_a_bad_time_is_refused(until: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        anarchon_celery.pause(_app(), "nightly", until=until)


def test_a_pause_says_who_when_and_why() -> None:
    app = _app()
    backend = anarchon_celery.MemoryBackend()
    app.conf.anarchon_backend = backend
    kept = anarchon_celery.pause(app, "nightly", note="  the database\nis migrated ", until="2099-01-01T03:00")
    assert "@" in kept.by and kept.note == "the database is migrated"
    assert kept.until_ms == to_ms(dt.datetime(2099, 1, 1, 3, tzinfo=dt.timezone.utc))  # (the app's time zone)
    assert anarchon_celery.paused(app) == {"nightly": kept}
    assert anarchon_celery.pause(app, "nightly", by="ops on call").by == "ops on call"
    with pytest.raises(ConfigError, match="by names who pauses it"):
        anarchon_celery.pause(app, "nightly", by=7)  # type: ignore[arg-type]
    assert anarchon_celery.resume(app, "nightly") is not None
    assert anarchon_celery.paused(app) == {}


# -- real beats, paused and resumed from the command line -----------------------------------------


def _runs(env: dict[str, str]) -> list[dict[str, Any]]:
    """The job's runs as ``history --json`` shows them, each slot in epoch milliseconds."""
    result = celery(env, "anarchon", "history", "every", "-n", "200", "--json")
    assert result.returncode == 0, result.stderr
    runs = list(json.loads(result.stdout))
    for run in runs:
        run["slot"] = round(dt.datetime.fromisoformat(run["slot"]).timestamp() * 1000)
    return runs


@pytest.mark.processes
@pytest.mark.broker
@pytest.mark.timeout(240)
@pytest.mark.parametrize("where", ["rabbitmq", "sqlite", "redis", "postgres"])
def test_beats_stop_sending_a_paused_job_and_start_again_on_resume(
    where: str, beat_env: dict[str, str], broker_url: str, prefix: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    env = dict(beat_env, HISTORY_APP_EVERY="1", HISTORY_APP_HISTORY_SIZE="100")
    env = history_app_on(where, env, tmp_path, request)
    fleet = Fleet(tmp_path, [env] * 2)
    try:
        fleet.wait_ready()
        fleet.wait_any("won, sent")
        paused = celery(env, "anarchon", "pause", "every", "--note", "the database is migrated", "--json")
        assert paused.returncode == 0, paused.stderr
        assert json.loads(paused.stdout)["paused"]["note"] == "the database is migrated"
        fleet.wait_any("the job is paused; not sent")
        listed = celery(env, "anarchon", "jobs", "--json")
        assert listed.returncode == 0, listed.stderr
        every = next(job for job in json.loads(listed.stdout) if job["job"] == "every")
        assert every["state"] == "paused" and every["paused"]["note"] == "the database is migrated"
        time.sleep(4)
        sent_while = sent_slots(broker_url, f"{prefix}tasks")
        resumed = celery(env, "anarchon", "resume", "every")
        assert resumed.returncode == 0 and "resumed job every" in resumed.stdout, resumed.stderr
        after = fleet.offsets()
        fleet.wait_any("won, sent", after)
        time.sleep(2)
        fleet.stop()
    finally:
        fleet.kill()
    runs = _runs(env)
    paused_slots = sorted(run["slot"] for run in runs if run["status"] == "paused")
    sent_runs = [run["slot"] for run in runs if run["status"] != "paused"]
    assert len(paused_slots) >= 4, runs
    assert len(set(paused_slots)) == len(paused_slots), "a paused run recorded twice"
    assert not set(paused_slots) & set(sent_runs), "a paused run was sent"
    # Nothing sent from the first run found paused on: on a store, the claim reads the pause; on
    # RabbitMQ, an instance acts on it once it has read it (a second at most here).
    late = paused_slots[0] + (2_000 if where == "rabbitmq" else 0)
    assert [slot for slot in sent_while if slot > late] == [], (paused_slots, sorted(sent_while))
    # Resumed: sent again, from after the pause, and no paused run sent later.
    sent_after = sent_slots(broker_url, f"{prefix}tasks")
    resumed_by = paused_slots[-1] - (2_000 if where == "rabbitmq" else 0)
    assert sent_after and min(sent_after) > resumed_by, (paused_slots, sent_after)


@pytest.mark.processes
@pytest.mark.broker
@pytest.mark.timeout(240)
def test_every_paused_run_is_both_logged_and_recorded(
    beat_env: dict[str, str], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two beats, a job every second paused: the slots their info lines name are the slots its
    history records paused, each once (a beat used to log only the first of a pause at info)."""
    env = history_app_on(
        "redis", dict(beat_env, HISTORY_APP_EVERY="1", HISTORY_APP_HISTORY_SIZE="100"), tmp_path, request
    )
    fleet = Fleet(tmp_path, [env] * 2)
    try:
        fleet.wait_ready()
        paused = celery(env, "anarchon", "pause", "every")
        assert paused.returncode == 0, paused.stderr
        fleet.wait_any("the job is paused; not sent")
        time.sleep(4)  # more of its runs decided, by either beat
        fleet.stop()
    finally:
        fleet.kill()
    logged = []
    for n in range(2):
        for line in fleet.text(n).splitlines():
            found = re.search(
                r"INFO/.*job 'every' slots? ([\d, ]+): the job is paused; not sent \(recorded paused\)", line
            )
            if found:
                logged += [int(slot) for slot in found.group(1).split(", ")]
    recorded = sorted(run["slot"] for run in _runs(env) if run["status"] == "paused")
    assert len(recorded) >= 3, recorded
    assert sorted(logged) == recorded
