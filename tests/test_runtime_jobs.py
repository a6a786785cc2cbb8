"""Runtime jobs: added, changed and removed without a restart. The pure rules (versions and
conflicts, the control log's fold, the run queue dropping a job), the contract on every backend
(a claim under an old version is stale), the Python API's validation, and real beats acting on
changes made from the command line."""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from kombu import Connection

import anarchon_celery
from anarchon_celery import Claim, ConfigError, JobConflict, JobDef, Outcome, Scheduler, live_jobs
from anarchon_celery.backends import Backend, RabbitMQBackend
from anarchon_celery.backends.definitions import check_change, entry_of, removed
from anarchon_celery.backends.rabbitmq.control_log import fold as fold_log
from anarchon_celery.runqueue import BackupTry, FirstClaim, RunQueue

from .support.stores import history_app_on
from .test_backends import make_backend  # noqa: F401 - the contract's backends
from .test_cli import APP, ROOT, celery
from .test_faults import Fleet
from .test_jobs import make_app
from .test_scheduler import T0, Clock, run_until, sent
from .test_scheduler import app as _scheduler_app  # noqa: F401 - a fixture, under this name here
from .test_scheduler import clock as _simulated_clock  # noqa: F401 - a fixture, under this name here

# -- the rules, pure ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kept, base, version",
    [(None, None, 1), (3, 3, 4), (1, 1, 2)],
)
def test_a_change_on_the_version_kept_makes_the_next(kept: int | None, base: int | None, version: int) -> None:
    assert check_change("j", None if kept is None else JobDef("j", kept), base) == version


@pytest.mark.parametrize(
    "kept, base, message",
    [
        (2, None, "exists already \\(version 2\\)"),
        (None, 2, "is not a runtime job"),
        (3, 2, "is at version 3, not 2: it was changed meanwhile"),
    ],
)
def test_a_change_on_another_version_is_refused(kept: int | None, base: int | None, message: str) -> None:
    with pytest.raises(JobConflict, match=message) as raised:
        check_change("j", None if kept is None else JobDef("j", kept), base)
    assert (raised.value.base, raised.value.current) == (base, kept)


def test_a_removal_names_the_version_or_takes_any() -> None:
    assert removed("j", JobDef("j", 4), None) == JobDef("j", 4)
    assert removed("j", JobDef("j", 4), 4) == JobDef("j", 4)
    with pytest.raises(JobConflict):
        removed("j", JobDef("j", 4), 3)
    with pytest.raises(JobConflict):
        removed("j", None, None)


def test_a_definition_round_trips_and_junk_is_none() -> None:
    kept = JobDef("j", 3, {"task": "t", "schedule": "* * * * *", "args": [1, "é"]}, "ann", 17)
    assert JobDef.decode("j", kept.encode()) == kept
    for junk in (None, "", "nope", '{"v": 0, "e": {}}', '{"v": 2, "e": []}', '{"e": {}}'):
        assert JobDef.decode("j", junk) is None


def test_an_entry_is_kept_as_json_values() -> None:
    assert entry_of({"args": (1, 2), "kwargs": {"a": None}}) == {"args": [1, 2], "kwargs": {"a": None}}
    with pytest.raises(ConfigError, match="args .* cannot be kept as JSON"):
        entry_of({"args": (object(),)})


def test_every_instance_folds_the_control_log_to_the_same_changes() -> None:
    entry = {"task": "t", "schedule": 5}
    records = [
        {"op": "put", "job": "a", "base": None, "entry": entry, "id": "1"},
        {"op": "put", "job": "a", "base": None, "entry": entry, "id": "2"},  # exists already: refused
        {"op": "put", "job": "a", "base": 1, "entry": {**entry, "schedule": 7}, "id": "3"},
        {"op": "put", "job": "a", "base": 1, "entry": {**entry, "schedule": 9}, "id": "4"},  # on an old version
        {"op": "pause", "job": "a", "pause": {"by": "ann", "at": 1}},
        {"op": "remove", "job": "a", "base": 5, "id": "5"},  # not its version
        {"op": "put", "job": "b", "base": None, "entry": entry, "id": "6"},
        {"op": "remove", "job": "a", "base": None, "id": "7"},  # with its pause
    ]
    state = fold_log(records)
    assert state.accepted == {"1": True, "2": False, "3": True, "4": False, "5": False, "6": True, "7": True}
    assert {name: (d.version, d.entry["schedule"]) for name, d in state.defs.items()} == {"b": (1, 5)}
    assert state.pauses == {}
    assert state.changed == ["a", "a", "b", "a"]


def test_the_run_queue_drops_a_jobs_items() -> None:
    queue: RunQueue[Any] = RunQueue(
        [FirstClaim(5, "a", 1), FirstClaim(3, "b", 1), BackupTry(4, "a", 0, 0, 1), FirstClaim(1, "c", 1)]
    )
    assert queue.drop({"a"}) == 2
    assert not queue.has_backups()
    assert [item.job for item in queue.take(10, 10)] == ["c", "b"]


# -- the contract, on every backend ---------------------------------------------------------------

ENTRY = {"task": "tasks.work", "schedule": 60}


def _sees(backend: Backend, job: str, version: int) -> None:
    """Wait until ``backend`` has read the change (RabbitMQ: from the control log it follows)."""
    if not isinstance(backend, RabbitMQBackend):
        return
    deadline = time.monotonic() + 10
    while backend._control.version(job) != version:  # noqa: SLF001 - what the instance has read
        assert time.monotonic() < deadline, f"version {version} of {job!r} never reached the instance"
        backend.maintain()
        time.sleep(0.05)


def test_a_runtime_job_is_kept_versioned_and_changes_are_told(make_backend: Any) -> None:  # noqa: F811
    a, b = make_backend(), make_backend()
    b.maintain()
    _, since = b.job_changes(None)
    first = a.put_job("j", ENTRY, base=None, by="ann")
    assert (first.name, first.version, dict(first.entry), first.by) == ("j", 1, ENTRY, "ann")
    with pytest.raises(JobConflict, match="exists already"):
        b.put_job("j", ENTRY, base=None, by="bob")
    second = b.put_job("j", {**ENTRY, "schedule": 30}, base=1, by="bob")
    assert second.version == 2
    with pytest.raises(JobConflict, match="is at version 2, not 1"):
        a.put_job("j", ENTRY, base=1, by="ann")  # based on the version it read: refused
    a.put_job("other", ENTRY, base=None, by="ann")
    kept = a.runtime_jobs()
    assert {name: (d.version, d.entry["schedule"]) for name, d in kept.items()} == {"j": (2, 30), "other": (1, 60)}
    assert list(a.runtime_jobs(["j", "never"])) == ["j"]
    _sees(b, "other", 1)
    changed, since = b.job_changes(since)
    assert changed == {"j", "other"}
    assert b.job_changes(since)[0] == set()
    gone = a.remove_job("j", base=None)
    assert gone.version == 2
    with pytest.raises(JobConflict):
        a.remove_job("j", base=None)
    _sees(b, "j", 0)
    assert b.job_changes(since)[0] == {"j"}
    assert list(b.runtime_jobs()) == ["other"]


def test_a_claim_under_another_version_is_stale(make_backend: Any) -> None:  # noqa: F811
    a, b = make_backend(), make_backend()
    b.maintain()
    a.put_job("j", ENTRY, base=None, by="ann")
    a.put_job("j", ENTRY, base=1, by="ann")
    _sees(b, "j", 2)
    now = int(time.time() * 1000) - 10_000
    if isinstance(b, RabbitMQBackend):  # an instance decides by what it has read: it has read version 2
        assert b.claim([Claim("j", now, version=1)], "b") == [Outcome.STALE]
    else:  # the store decides by the version kept, whatever the instance has read
        assert b.claim([Claim("j", now, version=1), Claim("k", now)], "b") == [Outcome.STALE, Outcome.WON]
    assert b.claim([Claim("j", now, version=2)], "b") == [Outcome.WON]  # (the stale claim decided nothing)
    a.remove_job("j", base=None)
    _sees(b, "j", 0)
    assert b.claim([Claim("j", now + 1_000, version=2)], "b") == [Outcome.STALE]


# -- the Python API -------------------------------------------------------------------------------


def _app(**conf: Any) -> Any:
    app = make_app(beat_schedule={"nightly": {"task": "tasks.work", "schedule": "0 3 * * *"}}, **conf)
    app.conf.anarchon_backend = anarchon_celery.MemoryBackend()
    return app


@pytest.mark.parametrize(
    "keys, message",
    [
        ({"task": "tasks.work", "schedule": "* * * *"}, "job 'extra'"),
        ({"task": "tasks.nope", "schedule": 60}, "task 'tasks.nope' is not registered"),
        ({"task": "tasks.work", "schedule": 60, "overlap": "skip"}, "overlap is not available"),
        ({"task": "tasks.work", "schedule": 60, "max_late_ms": 400_000}, "must be shorter than slot_ttl_ms"),
        ({"task": "tasks.work", "schedule": 60, "jiter_ms": 1}, "unknown key 'jiter_ms'. Did you mean 'jitter_ms'"),
        ({"task": "tasks.work", "schedule": 60, "args": [object()]}, "cannot be kept as JSON"),
    ],
)
def test_a_runtime_job_is_validated_as_a_job_of_the_code(keys: dict[str, Any], message: str) -> None:
    app = _app()
    with pytest.raises(ConfigError, match=message):
        anarchon_celery.add_job(app, "extra", **keys)
    assert anarchon_celery.runtime_jobs(app) == {}


def test_a_runtime_job_cannot_take_a_name_of_the_code_nor_change_one() -> None:
    app = _app()
    with pytest.raises(ConfigError, match="job 'nightly' is defined in code"):
        anarchon_celery.add_job(app, "nightly", task="tasks.work", schedule=60)
    with pytest.raises(ConfigError, match="job 'nightly' is defined in code"):
        anarchon_celery.update_job(app, "nightly", schedule=60)
    with pytest.raises(ConfigError, match="no runtime job named 'extra'"):
        anarchon_celery.remove_job(app, "extra")


def test_an_edit_that_makes_a_job_invalid_is_refused_and_the_old_one_stays() -> None:
    app = _app()
    first = anarchon_celery.add_job(app, "extra", task="tasks.work", schedule=60, args=[1], by="ann")
    assert (first.version, first.entry, first.by) == (1, {"task": "tasks.work", "schedule": 60, "args": [1]}, "ann")
    with pytest.raises(ConfigError, match="task 'tasks.gone' is not registered"):
        anarchon_celery.update_job(app, "extra", task="tasks.gone")
    assert anarchon_celery.runtime_jobs(app)["extra"] == first
    second = anarchon_celery.update_job(app, "extra", schedule="*/5 * * * *", args=None, tz="Europe/Paris")
    assert second.version == 2 and second.entry == {
        "task": "tasks.work",
        "schedule": "*/5 * * * *",
        "tz": "Europe/Paris",
    }
    with pytest.raises(JobConflict, match="is at version 2, not 1"):
        anarchon_celery.update_job(app, "extra", if_version=1, schedule=30)
    # The runtime job is a job like the others: paused, listed, its history read.
    assert anarchon_celery.pause(app, "extra").by
    assert list(anarchon_celery.paused(app)) == ["extra"]
    assert anarchon_celery.history(app, "extra") == []
    assert anarchon_celery.remove_job(app, "extra", if_version=2).version == 2
    assert anarchon_celery.paused(app) == {}


# -- races and real beats -------------------------------------------------------------------------


@pytest.mark.processes
@pytest.mark.broker
@pytest.mark.parametrize("where", ["rabbitmq", "sqlite", "redis", "postgres"])
def test_two_operators_editing_one_job_at_once_one_wins_the_others_are_told(
    where: str, beat_env: dict[str, str], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Four ``edit`` commands at once, each on the version 1 they read: one wins, three are told."""
    env = history_app_on(where, beat_env, tmp_path, request)
    added = celery(env, "anarchon", "add", "extra", "--task", "history_app.fine", "--schedule", "60")
    assert added.returncode == 0, added.stderr
    edits = [
        subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", APP, "anarchon", "edit", "extra", "--if-version", "1"]
            + ["--schedule", str(seconds), "--by", f"op{seconds}", "--json"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seconds in (10, 20, 30, 40)
    ]
    done = [(edit.wait(120), *edit.communicate()) for edit in edits]
    won = [json.loads(out) for code, out, _ in done if code == 0]
    told = [err for code, _, err in done if code == 1]
    assert len(won) == 1 and len(told) == 3, done
    assert all("is at version 2, not 1: it was changed meanwhile" in err for err in told), told
    listed = celery(env, "anarchon", "jobs", "--json")
    extra = next(job for job in json.loads(listed.stdout) if job["job"] == "extra")
    assert (extra["version"], extra["schedule"]) == (2, f"every {won[0]['entry']['schedule']}s")


@pytest.mark.processes
@pytest.mark.broker
def test_add_and_edit_refuse_arguments_that_do_not_fit_the_task(
    beat_env: dict[str, str], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    env = history_app_on("sqlite", beat_env, tmp_path, request)
    job = ["sum", "--task", "history_app.add", "--schedule", "60"]
    refused = celery(env, "anarchon", "add", *job, "--args", "[1]")
    assert refused.returncode == 1, refused.stdout
    assert refused.stderr.strip().splitlines() == [
        "Error: job 'sum': its arguments do not fit task 'history_app.add'(x, y): called as (1), missing 1 required "
        "positional argument: 'y'. Give args/kwargs that the task's parameters take, or make the task with "
        "typing=False (@app.task(typing=False)) if it takes them another way"
    ]
    added = celery(env, "anarchon", "add", *job, "--args", "[1, 2]")
    assert added.returncode == 0, added.stderr
    edited = celery(env, "anarchon", "edit", "sum", "--kwargs", '{"z": 3}')
    assert edited.returncode == 1, edited.stdout
    assert (
        "Error: job 'sum': its arguments do not fit task 'history_app.add'(x, y): called as (1, 2, z=3), got an "
        "unexpected keyword argument 'z'." in edited.stderr
    )
    listed = json.loads(celery(env, "anarchon", "jobs", "--json").stdout)
    kept = next(item for item in listed if item["job"] == "sum")
    assert kept["version"] == 1  # the edit refused changed nothing


@pytest.mark.processes
@pytest.mark.broker
@pytest.mark.parametrize("where", ["rabbitmq", "redis", "postgres"])
def test_a_change_made_while_the_store_is_down_is_a_clear_error(
    where: str, beat_env: dict[str, str], tmp_path: Path
) -> None:
    url = {"rabbitmq": "amqp://guest:secret@127.0.0.1:1//", "redis": "redis://:secret@127.0.0.1:1/0"}.get(
        where, "postgresql://postgres:secret@127.0.0.1:1/test"
    )
    env = dict(beat_env, HISTORY_APP_BACKEND=url, HISTORY_APP_CONNECT_TIMEOUT="2")
    for command in (["add", "extra", "--task", "history_app.fine", "--schedule", "60"], ["remove", "extra"]):
        done = celery(env, "anarchon", *command)
        assert done.returncode == 1, done.stdout
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "127.0.0.1:1" in lines[0] and "secret" not in lines[0], done.stderr
        assert "Traceback" not in done.stderr


def sent_runs(broker_url: str, queue: str) -> list[tuple[str, int]]:
    """The runs ``(job, slot)`` sent to the task queue (drained)."""
    runs = []
    with Connection(broker_url) as conn:
        while (message := conn.default_channel.basic_get(queue, no_ack=True)) is not None:
            runs.append((message.headers["anarchon_job"], message.headers["anarchon_slot"]))
    return runs


@pytest.mark.processes
@pytest.mark.broker
@pytest.mark.timeout(300)
@pytest.mark.parametrize("where", ["rabbitmq", "sqlite", "redis", "postgres"])
def test_beats_run_a_job_added_changed_and_removed_at_runtime(
    where: str, beat_env: dict[str, str], broker_url: str, prefix: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    env = dict(beat_env, HISTORY_APP_HISTORY_SIZE="50")
    env.pop("HISTORY_APP_EVERY", None)
    env = history_app_on(where, env, tmp_path, request)
    # One runtime job there before the beats start, one added while they run.
    added = celery(env, "anarchon", "add", "early", "--task", "history_app.fine", "--schedule", "1", "--json")
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["version"] == 1
    fleet = Fleet(tmp_path, [env] * 2)
    try:
        fleet.wait_ready()
        fleet.wait_any("won, sent")
        added = celery(env, "anarchon", "add", "late", "--task", "history_app.fine", "--schedule", "1")
        assert added.returncode == 0 and "added job late: version 1" in added.stdout, added.stderr
        fleet.wait_any("runtime job 'late' added (version 1")
        time.sleep(3)
        before = sent_runs(broker_url, f"{prefix}tasks")
        # Every 2 s from now on: no run at an odd second once every instance acts on it.
        changed = celery(env, "anarchon", "edit", "late", "--schedule", "2", "--if-version", "1")
        assert changed.returncode == 0 and "changed job late: version 2" in changed.stdout, changed.stderr
        at = int(time.time() * 1000)
        fleet.wait_any("runtime job 'late' changed (version 2")
        stale = celery(env, "anarchon", "edit", "late", "--schedule", "3", "--if-version", "1")
        assert stale.returncode == 1 and "is at version 2, not 1" in stale.stderr, stale.stderr
        time.sleep(5)
        after_edit = sent_runs(broker_url, f"{prefix}tasks")
        listed = celery(env, "anarchon", "jobs", "--json")
        kinds = {job["job"]: (job["kind"], job["version"]) for job in json.loads(listed.stdout)}
        assert kinds["late"] == ("runtime", 2) and kinds["early"] == ("runtime", 1) and kinds["fine"] == ("code", None)
        gone = celery(env, "anarchon", "remove", "late")
        assert gone.returncode == 0 and "removed job late" in gone.stdout, gone.stderr
        removed_at = int(time.time() * 1000)
        fleet.wait_any("runtime job 'late' removed")
        time.sleep(3)
        fleet.stop()
    finally:
        fleet.kill()
    after_removal = sent_runs(broker_url, f"{prefix}tasks")
    late_before = [slot for job, slot in before if job == "late"]
    late_after = [slot for job, slot in after_edit if job == "late"]
    assert len(late_before) >= 2 and len(set(late_before)) == len(late_before), before
    assert len(late_after) >= 2 and len(set(late_after)) == len(late_after), after_edit
    # The new schedule from the change on: on a store, no run of the old one is won once the change is kept;
    # on RabbitMQ an instance acts on it once it has read it (2 s at most here).
    grace = 2_000 if where == "rabbitmq" else 1_000
    assert [slot for slot in late_after if slot % 2_000 and slot > at + grace] == [], (at, late_after)
    assert [slot for job, slot in after_removal if job == "late" and slot > removed_at + grace] == []
    assert [slot for job, slot in after_removal if job == "early"], "the job there at start ran all along"


@pytest.mark.broker
def test_schedulers_act_on_a_change_from_its_time_on_and_on_that_job_only(
    _scheduler_app: Celery,  # noqa: F811 - test_scheduler's app
    _simulated_clock: Clock,  # noqa: F811 - and its clock
    broker_url: str,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In-process schedulers on a simulated clock (no sleeping): a runtime job there at start, then
    changed and removed while they run; the job of the code beside it runs all along."""
    app, clock = _scheduler_app, _simulated_clock
    monkeypatch.setattr(live_jobs, "CHANGES_POLL_S", 0.0)  # (every wake-up looks: the clock is simulated)
    backend = anarchon_celery.MemoryBackend(prefix=prefix, slot_ttl_ms=60_000)
    app.conf.anarchon_backend = backend
    app.conf.beat_schedule = {"code": {"task": "tasks.work", "schedule": 1.0}}
    anarchon_celery.add_job(app, "rt", task="tasks.work", schedule=2)
    schedulers = [Scheduler(app), Scheduler(app)]
    for n, scheduler in enumerate(schedulers):
        scheduler.instance = f"i{n}"
    run_until(clock, schedulers, T0 + 4_000)
    anarchon_celery.update_job(app, "rt", schedule=3)  # at T0 + 4 s: its run due then is not sent
    run_until(clock, schedulers, T0 + 10_000)
    anarchon_celery.remove_job(app, "rt")
    run_until(clock, schedulers, T0 + 14_000)
    for scheduler in schedulers:
        scheduler.close()
    runs = sorted(
        (m.headers["anarchon_job"], m.headers["anarchon_slot"] - T0) for m in sent(broker_url, f"{prefix}tasks")
    )
    assert [slot for job, slot in runs if job == "rt"] == [0, 2_000, 6_000, 9_000]
    assert [slot for job, slot in runs if job == "code"] == list(range(0, 14_000, 1_000))


class _RemovesOnAWin(anarchon_celery.MemoryBackend):
    """Removes the runtime job ``rt`` the moment its run at ``slot`` is won, before it is sent."""

    slot = 0

    def claim(self, claims: Any, instance: str, *, on_won: Any = None) -> list[Outcome]:
        outcomes = super().claim(claims, instance, on_won=on_won)
        if any(c.job == "rt" and c.slot == self.slot and o is Outcome.WON for c, o in zip(claims, outcomes)):
            self.remove_job("rt", base=None)
        return outcomes


@pytest.mark.broker
def test_a_job_removed_while_its_run_is_sent_sends_that_run_and_no_later_one(
    _scheduler_app: Celery,  # noqa: F811 - test_scheduler's app
    _simulated_clock: Clock,  # noqa: F811 - and its clock
    broker_url: str,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app, clock = _scheduler_app, _simulated_clock
    monkeypatch.setattr(live_jobs, "CHANGES_POLL_S", 0.0)
    backend = _RemovesOnAWin(prefix=prefix, slot_ttl_ms=60_000)
    backend.slot = T0 + 2_000
    app.conf.anarchon_backend = backend
    anarchon_celery.add_job(app, "rt", task="tasks.work", schedule=1)
    schedulers = [Scheduler(app), Scheduler(app)]
    for n, scheduler in enumerate(schedulers):
        scheduler.instance = f"i{n}"
    run_until(clock, schedulers, T0 + 6_000)
    for scheduler in schedulers:
        scheduler.close()
    slots = sorted(m.headers["anarchon_slot"] - T0 for m in sent(broker_url, f"{prefix}tasks"))
    assert slots == [0, 1_000, 2_000]


@pytest.mark.broker
def test_an_instance_that_cannot_run_a_runtime_job_says_so_once_and_leaves_it_to_the_others(
    _scheduler_app: Celery,  # noqa: F811 - test_scheduler's app
    _simulated_clock: Clock,  # noqa: F811 - and its clock
    broker_url: str,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app, clock = _scheduler_app, _simulated_clock
    monkeypatch.setattr(live_jobs, "CHANGES_POLL_S", 0.0)
    backend = anarchon_celery.MemoryBackend(prefix=prefix, slot_ttl_ms=60_000)
    app.conf.anarchon_backend = backend

    @app.task(name="tasks.rare", shared=False)
    def rare(*args: Any) -> None: ...

    other = Celery(f"other{prefix}", broker=broker_url, set_as_current=False)  # without tasks.rare
    other.conf.update({key: app.conf[key] for key in ("task_default_queue", "anarchon_prefix", "anarchon_jitter_ms")})
    other.conf.update(anarchon_slot_ttl_ms=60_000, anarchon_max_late_ms=5_000, anarchon_backend=backend)
    anarchon_celery.add_job(app, "rare", task="tasks.rare", schedule=1)
    schedulers = [Scheduler(app), Scheduler(other)]
    for n, scheduler in enumerate(schedulers):
        scheduler.instance = f"i{n}"
    with caplog.at_level(logging.ERROR, logger="anarchon_celery"):
        run_until(clock, schedulers, T0 + 5_000)
        anarchon_celery.update_job(app, "rare", args=[1])  # a new version: said again, once
        run_until(clock, schedulers, T0 + 8_000)
    for scheduler in schedulers:
        scheduler.close()
    slots = sorted(m.headers["anarchon_slot"] - T0 for m in sent(broker_url, f"{prefix}tasks"))
    assert slots == list(range(0, 8_000, 1_000))  # every run, by the instance that can
    said = [r.getMessage() for r in caplog.records if "cannot be run by this instance" in r.getMessage()]
    assert len(said) == 2 and "(version 1)" in said[0] and "(version 2)" in said[1], said
    assert "task 'tasks.rare' is not registered" in said[0] and "left to the instances that can" in said[0]


def _change_untold(where: str, env: dict[str, str], job: str, entry: dict[str, Any], version: int) -> None:
    """Change a runtime job in the store behind anarchon's back: no change told (as a row written
    by hand would be), only its definition."""
    prefix, url = env.get("HISTORY_APP_ANARCHON_PREFIX") or env["HISTORY_APP_PREFIX"], env["HISTORY_APP_BACKEND"]
    text = json.dumps(entry, sort_keys=True)
    if where == "redis":
        import redis

        client = redis.Redis.from_url(url)
        client.hset(f"{prefix}defs", job, JobDef(job, version, entry, "by hand", 0).encode())
        client.close()
    elif where == "postgres":
        import psycopg

        with psycopg.connect(url) as db:
            db.execute(
                "UPDATE anarchon_defs SET version = %s, entry = %s WHERE prefix = %s AND job = %s",
                (version, text, prefix, job),
            )
    else:
        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as db, db:
            db.execute(
                "UPDATE anarchon_defs SET version = ?, entry = ? WHERE prefix = ? AND job = ?",
                (version, text, prefix, job),
            )


@pytest.mark.processes
@pytest.mark.broker
@pytest.mark.timeout(240)
@pytest.mark.parametrize("where", ["sqlite", "redis", "postgres"])
def test_a_change_the_beats_were_not_told_of_is_acted_on_within_the_check_period(
    where: str, beat_env: dict[str, str], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A definition changed behind the backend's back tells nobody (django-celery-beat's bug with
    QuerySet.update()); the beats find it when they next compare every version
    (``anarchon_runtime_check_ms``, 2 s here). RabbitMQ has no such back door: its control log is
    both the definitions and the news of their changes."""
    env = dict(beat_env, HISTORY_APP_RUNTIME_CHECK_MS="2000")
    env.pop("HISTORY_APP_EVERY", None)
    env = history_app_on(where, env, tmp_path, request)
    added = celery(env, "anarchon", "add", "late", "--task", "history_app.fine", "--schedule", "1")
    assert added.returncode == 0, added.stderr
    fleet = Fleet(tmp_path, [env] * 2)
    try:
        fleet.wait_ready()
        fleet.wait_any("won, sent")
        after = fleet.offsets()
        _change_untold(where, env, "late", {"task": "history_app.fine", "schedule": 2}, 2)
        fleet.wait_any("runtime jobs changed and not told: late", after, timeout=20)
        fleet.wait_any("runtime job 'late' changed (version 2", after, timeout=5)
        fleet.stop()
    finally:
        fleet.kill()
