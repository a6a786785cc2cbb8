"""Jobs from @cron and beat_schedule, and every check that fails at start. No broker."""

from __future__ import annotations

import datetime as dt
import logging
import string
import uuid
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.schedules import crontab
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import anarchon_celery
from anarchon_celery import (
    ConfigError,
    Cron,
    Interval,
    MemoryBackend,
    RabbitMQBackend,
    Settings,
    SQLiteBackend,
    task_id_for,
)
from anarchon_celery.jobs import collect_jobs


def make_app(**conf: Any) -> Celery:
    app = Celery(f"app{uuid.uuid4().hex[:6]}", broker="memory://", set_as_current=False)
    app.conf.update(anarchon_backend="memory://", **conf)

    @app.task(name="tasks.work", shared=False)
    def work(*args: Any, **kwargs: Any) -> None: ...

    @app.task(name="tasks.other", shared=False)
    def other() -> None: ...

    return app


def jobs_of(app: Celery, slot_ttl_ms: int = 300_000) -> dict[str, anarchon_celery.Job]:
    backend = RabbitMQBackend(prefix="cron.", slot_ttl_ms=slot_ttl_ms)  # (its rules only: no I/O)
    return {job.name: job for job in collect_jobs(app, Settings.from_app(app), backend)}


def entry(**overrides: Any) -> dict[str, Any]:
    return {"task": "tasks.work", "schedule": "*/5 * * * *", **overrides}


# -- beat_schedule entries ------------------------------------------------------------------------


def test_beat_schedule_entries_become_jobs() -> None:
    app = make_app(
        timezone="Europe/Paris",
        anarchon_jitter_ms=100,
        beat_schedule={
            "every-5-min": entry(args=(1, 2), kwargs={"x": 3}, options={"queue": "q", "priority": 5}),
            "crontab": entry(schedule=crontab(minute=0, hour=3), tz="Asia/Tokyo", max_late_ms=5000),
            "interval": entry(schedule=dt.timedelta(seconds=30), jitter_ms=0, history_size=7),
            "seconds": entry(schedule=10),
        },
    )
    jobs = jobs_of(app)
    assert sorted(jobs) == ["crontab", "every-5-min", "interval", "seconds"]
    five = jobs["every-5-min"]
    assert five.schedule == Cron("*/5 * * * *", "Europe/Paris")  # the app's time zone by default
    assert (five.args, dict(five.kwargs), dict(five.options)) == ((1, 2), {"x": 3}, {"queue": "q", "priority": 5})
    assert (five.jitter_ms, five.max_late_ms, five.history_size) == (100, 60_000, 100)
    assert jobs["crontab"].schedule == Cron("0 3 * * *", "Asia/Tokyo", day_or=False)
    assert jobs["crontab"].max_late_ms == 5000
    assert jobs["interval"].schedule == Interval(30_000)
    assert (jobs["interval"].jitter_ms, jobs["interval"].history_size) == (0, 7)
    assert jobs["seconds"].schedule == Interval(10_000)


@pytest.mark.parametrize(
    "name, message",
    [
        ("has.dot", "job name 'has.dot' is invalid"),
        ("has space", "is invalid"),
        ("", "is invalid"),
        ("é", "is invalid"),
        ("a/b", "is invalid"),
    ],
)
def test_job_names_are_checked(name: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        jobs_of(make_app(beat_schedule={name: entry()}))


@pytest.mark.parametrize(
    "bad, message",
    [
        (entry(schedule="61 * * * *"), "job 'j': invalid cron spec '61 \\* \\* \\* \\*'"),
        (entry(tz="Nowhere/Atlantis"), "job 'j': unknown time zone 'Nowhere/Atlantis'"),
        (entry(task="tasks.wrok"), "job 'j': task 'tasks.wrok' is not registered .* Did you mean 'tasks.work'"),
        (entry(task=None), "job 'j': 'task' must be the name"),
        ({"task": "tasks.work"}, "job 'j': 'schedule' is missing"),
        (entry(jiter_ms=5), "job 'j': unknown key 'jiter_ms'. Did you mean 'jitter_ms'"),
        (entry(jitter_ms=-1), "job 'j': jitter_ms must be an integer >= 0"),
        (entry(max_late_ms="60s"), "job 'j': max_late_ms must be an integer"),
        (entry(history_size=-1), "job 'j': history_size must be an integer >= 0"),
        (entry(max_late_ms=0), "job 'j': max_late_ms must be an integer >= 1"),
        (entry(options={"retry": False}), "job 'j': options \\['retry'\\] are set by the scheduler"),
        (entry(jitter_ms=True), "job 'j': jitter_ms must be an integer"),
        (entry(args="abc"), "job 'j': args must be a list or tuple"),
        (entry(kwargs=[1]), "job 'j': kwargs must be a dict"),
        (entry(options=[1]), "job 'j': options must be a dict"),
        (entry(options={"task_id": "x"}), "job 'j': options \\['task_id'\\] are set by the scheduler"),
        (entry(relative=True), "job 'j': relative=True is not supported"),
        (entry(schedule=dt.timedelta(milliseconds=10)), "job 'j': interval of 10 ms is too short"),
        ("not a dict", "job 'j': the entry must be a dict"),
    ],
)
def test_bad_entries_fail_with_the_job_named(bad: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        jobs_of(make_app(beat_schedule={"j": bad}))


@pytest.mark.parametrize(
    "key, what",
    [
        ("backups", "the key is backup_runners"),
        ("no_overlap", "the key is overlap: 'skip', 'buffer_one' or 'buffer_all'"),
        ("catch_up", "the RabbitMQ backend is claim only"),
        ("overlap", "the RabbitMQ backend is claim only"),
        ("hand_over", "a backend with leases hands over by itself on SIGTERM"),
    ],
)
def test_options_not_offered_are_refused_with_why(key: str, what: str) -> None:
    with pytest.raises(ConfigError) as info:
        jobs_of(make_app(beat_schedule={"j": entry(**{key: True})}))
    assert f"job 'j': {key} is not available: {what}" in str(info.value)


def test_backup_runners_are_refused_on_a_claim_only_backend() -> None:
    with pytest.raises(ConfigError) as info:
        jobs_of(make_app(beat_schedule={"j": entry(backup_runners=1)}))
    message = str(info.value)
    assert "job 'j': backup_runners is not available: the RabbitMQ backend is claim only" in message
    assert "redis://" in message and "sqlite:///" in message


@pytest.mark.parametrize(
    "backend, title", [("memory://", "the memory backend"), ("amqp://guest@127.0.0.1:1//", "the RabbitMQ backend")]
)
@pytest.mark.parametrize(
    "given, what",
    [
        ({"beat_schedule": {"j": entry(backup_runners=1)}}, "job 'j': backup_runners"),
        ({"anarchon_backup_runners": 1}, "anarchon_backup_runners"),
        ({"anarchon_lease_ms": 5000}, "anarchon_lease_ms"),
        ({"anarchon_start_check_timeout_ms": 200}, "anarchon_start_check_timeout_ms"),
        ({"beat_schedule": {"j": entry(catch_up="latest")}}, "job 'j': catch_up"),
        ({"beat_schedule": {"j": entry(catch_up_window_ms=60_000)}}, "job 'j': catch_up_window_ms"),
        ({"anarchon_catch_up": "all"}, "anarchon_catch_up"),
        ({"anarchon_catch_up_window_ms": 60_000}, "anarchon_catch_up_window_ms"),
    ],
)
def test_lease_options_on_a_claim_only_backend_name_that_backend(
    backend: str, title: str, given: dict[str, Any], what: str
) -> None:
    from anarchon_celery.control import configure

    app = make_app(**{"beat_schedule": {"j": entry()}, **given})
    app.conf.anarchon_backend = backend
    with pytest.raises(ConfigError) as info:
        configure(app)  # reads the settings only: no broker is asked
    assert str(info.value).startswith(f"{what} is not available: {title} is claim only (a winner that dies")


def test_a_lease_setting_refused_is_named_as_the_app_wrote_it() -> None:
    from anarchon_celery.control import configure

    class Config:
        CELERY_ANARCHON_BACKEND = "memory://"
        CELERY_ANARCHON_LEASE_MS = 5000

    app = make_app()
    app.conf.clear()
    app.config_from_object(Config, namespace="CELERY")
    with pytest.raises(ConfigError, match="^CELERY_ANARCHON_LEASE_MS is not available: the memory backend"):
        configure(app)


@pytest.mark.parametrize(
    "given, expected",
    [(None, 2), (0, 0), (1, 1), (10, 10), (11, "at most 10"), (-1, ">= 0"), (True, ">= 0"), ("2", ">= 0")],
)
def test_backup_runners_with_leases(given: Any, expected: int | str, tmp_path: Path) -> None:
    app = make_app(beat_schedule={"j": entry() if given is None else entry(backup_runners=given)})
    if isinstance(expected, str):
        with pytest.raises(ConfigError, match=f"job 'j': .*backup_runners must be .*{expected}"):
            collect_jobs(app, Settings.from_app(app), SQLiteBackend(tmp_path / "rules.db"))
    else:
        (job,) = collect_jobs(app, Settings.from_app(app), SQLiteBackend(tmp_path / "rules.db"))
        assert job.backup_runners == expected


@pytest.mark.parametrize("ttl, ok", [(67_001, True), (67_000, False)])
def test_with_leases_a_runs_record_outlives_its_lateness_and_lease(ttl: int, ok: bool, tmp_path: Path) -> None:
    """jitter_ms + max_late_ms + anarchon_lease_ms (2 + 60 + 5 s) < slot_ttl_ms: the backups and
    the workers read the run's record until then."""
    app = make_app(beat_schedule={"j": entry()})
    settings = Settings.from_app(app)
    store = SQLiteBackend(tmp_path / "rules.db", slot_ttl_ms=ttl, lease_ms=5_000)  # (its rules only: no I/O)
    if ok:
        collect_jobs(app, settings, store)
    else:
        with pytest.raises(ConfigError, match=r"job 'j': jitter_ms \+ max_late_ms \+ anarchon_lease_ms"):
            collect_jobs(app, settings, store)
    app.conf.beat_schedule = {"j": entry(backup_runners=0)}  # no backups: no record to read
    collect_jobs(app, settings, SQLiteBackend(tmp_path / "rules.db", slot_ttl_ms=67_000, lease_ms=5_000))


def test_history_ttl_is_refused() -> None:
    with pytest.raises(ConfigError, match="history_ttl_ms is not available: history is trimmed by size only"):
        jobs_of(make_app(beat_schedule={"j": entry(history_ttl_ms=1000)}))


@pytest.mark.parametrize(
    "lead, jitter, late, ttl, ok",
    [
        (0, 2_000, 60_000, 300_000, True),
        (0, 0, 299_999, 300_000, True),
        (0, 1, 299_999, 300_000, False),
        (0, 2_000, 60_000, 62_000, False),
        (0, 2_000, 60_000, 62_001, True),
        (10_000, 2_000, 60_000, 300_000, True),  # the defaults
        (10_000, 2_000, 60_000, 72_000, False),  # the lead counts: a gate lives from its first declaration
        (10_000, 2_000, 60_000, 72_001, True),
    ],
)
def test_safety_rule(lead: int, jitter: int, late: int, ttl: int, ok: bool) -> None:
    app = make_app(beat_schedule={"j": entry(jitter_ms=jitter, max_late_ms=late)}, anarchon_lead_ms=lead)
    if ok:
        assert jobs_of(app, slot_ttl_ms=ttl)["j"].max_late_ms == late
    else:
        rule = r"anarchon_lead_ms \+ jitter_ms \+ max_late_ms" if lead else r"jitter_ms \+ max_late_ms"
        with pytest.raises(ConfigError, match=rf"job 'j': {rule} .* must be shorter than slot_ttl_ms"):
            jobs_of(app, slot_ttl_ms=ttl)


@pytest.mark.parametrize(
    "backend, forgets",
    [
        ("memory://", "after it, the memory backend forgets the run was taken"),
        ("amqp://guest@127.0.0.1:1//", "after a gate expires, RabbitMQ forgets the run was taken"),
    ],
)
def test_the_safety_rule_names_the_backend_that_forgets(backend: str, forgets: str) -> None:
    from anarchon_celery.control import configure

    app = make_app(beat_schedule={"j": entry(max_late_ms=300_000)})
    app.conf.anarchon_backend = backend
    with pytest.raises(ConfigError) as info:
        configure(app)  # reads the settings only: no broker is asked
    assert f"must be shorter than slot_ttl_ms (300000 ms): {forgets} and a late instance" in str(info.value)


def test_names_too_long_for_queue_names_are_refused() -> None:
    longest_ok = "j" * (255 - len("cron.") - len(".slot.") - 16)
    assert jobs_of(make_app(beat_schedule={longest_ok: entry()}))
    with pytest.raises(ConfigError, match="job 'jjj.*': the name is too long: its queue names would reach 256 bytes"):
        jobs_of(make_app(beat_schedule={longest_ok + "j": entry()}))


def test_unknown_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="unknown setting.*anarchon_max_lat_ms"):
        Settings.from_app(make_app(anarchon_max_lat_ms=5))
    with pytest.raises(ConfigError, match="anarchon_jitter_ms must be an integer"):
        Settings.from_app(make_app(anarchon_jitter_ms="2s"))


# -- @cron ----------------------------------------------------------------------------------------


def test_cron_decorator_above_and_below_the_task_decorator() -> None:
    app = make_app(beat_schedule={"plain": entry()})

    @anarchon_celery.cron("0 * * * *")
    @app.task(name="tasks.above", shared=False)
    def above() -> None: ...

    @app.task(name="tasks.below", bind=True, shared=False)
    @anarchon_celery.cron(dt.timedelta(minutes=1), name="below-1", jitter_ms=0)
    @anarchon_celery.cron("30 * * * *", name="below-2", tz="America/New_York")
    def below(self: Any) -> None: ...

    jobs = jobs_of(app)
    assert sorted(jobs) == ["above", "below-1", "below-2", "plain"]
    assert (jobs["above"].task, jobs["above"].schedule) == ("tasks.above", Cron("0 * * * *", "UTC"))
    assert (jobs["below-1"].schedule, jobs["below-1"].jitter_ms) == (Interval(60_000), 0)
    assert jobs["below-2"].schedule == Cron("30 * * * *", "America/New_York")


def test_cron_tasks_of_another_app_are_not_collected() -> None:
    mine, theirs = make_app(), make_app()

    @anarchon_celery.cron("0 * * * *", name="theirs")
    @theirs.task(name="tasks.theirs", shared=False)
    def work() -> None: ...

    assert jobs_of(mine) == {}
    assert list(jobs_of(theirs)) == ["theirs"]


def test_two_jobs_with_one_name_are_refused() -> None:
    app = make_app(beat_schedule={"dup": entry()})

    @anarchon_celery.cron("0 * * * *", name="dup")
    @app.task(name="tasks.dup", shared=False)
    def dup() -> None: ...

    with pytest.raises(ConfigError, match="two jobs are named 'dup'"):
        jobs_of(app)


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"spec": "* * * * * * * *"}, "^job 'bad': invalid cron spec"),
        ({"spec": "* * * * *", "catch_up": True}, "^job 'bad': catch_up is not available"),
        ({"spec": "* * * * *", "jiter_ms": 5}, "^job 'bad': unknown key 'jiter_ms'. Did you mean 'jitter_ms'"),
        ({"spec": "* * * * *", "args": 42}, "^job 'bad': args must be a list or tuple"),
        ({"spec": "* * * * *", "name": "no good"}, "^job name 'no good' is invalid"),
    ],
)
def test_a_bad_cron_fails_with_the_apps_other_jobs_naming_its_job(arguments: dict[str, Any], message: str) -> None:
    # Not at import, where Celery would show it inside "Unable to load celery application" with
    # a traceback: when the jobs are read (beat's start, `celery anarchon`), as one line.
    app = make_app()

    @anarchon_celery.cron(**arguments)
    @app.task(name="tasks.bad", shared=False)
    def bad() -> None: ...

    with pytest.raises(ConfigError, match=message):
        jobs_of(app)


def test_cron_must_decorate_a_task() -> None:
    with pytest.raises(ConfigError, match="must decorate a Celery task"):
        anarchon_celery.cron("* * * * *")(42)


def test_task_ids_are_deterministic_and_distinct() -> None:
    a = task_id_for("cron.", "job", 1_000)
    assert a == task_id_for("cron.", "job", 1_000)
    assert (
        len(
            {
                a,
                task_id_for("cron.", "job", 2_000),
                task_id_for("other.", "job", 1_000),
                task_id_for("cron.", "jobb", 1_000),
            }
        )
        == 4
    )
    assert str(uuid.UUID(a)) == a


def test_settings_that_contradict_a_backend_instance_are_refused() -> None:
    from anarchon_celery.backends import backend_for

    app = make_app(anarchon_prefix="a.")
    app.conf.anarchon_backend = MemoryBackend(prefix="b.")
    with pytest.raises(ConfigError, match="anarchon_prefix is 'a.' but the anarchon_backend instance has prefix 'b.'"):
        backend_for(app, Settings.from_app(app))
    app.conf.anarchon_prefix = "b."
    assert backend_for(app, Settings.from_app(app)) is app.conf.anarchon_backend


@pytest.mark.parametrize(
    "given",
    [
        ["amqp://u:p@rabbit1:5672//", "amqp://u:p@rabbit2:5672//", "amqp://u:p@rabbit3:5672//"],
        "amqp://u:p@rabbit1:5672//;amqp://u:p@rabbit2:5672//;amqp://u:p@rabbit3:5672//",
    ],
    ids=["list", "joined"],
)
def test_a_clusters_nodes_are_all_given_to_the_claims_connection(given: Any) -> None:
    from anarchon_celery.backends import backend_for

    app = make_app(broker_failover_strategy="shuffle")
    app.conf.anarchon_backend = given
    backend = backend_for(app, Settings.from_app(app))
    assert isinstance(backend, anarchon_celery.RabbitMQBackend)
    connection = backend.connection  # not connected: nothing is reached here
    assert [url.split("@")[1] for url in connection.alt] == ["rabbit1:5672//", "rabbit2:5672//", "rabbit3:5672//"]
    assert connection.failover_strategy is not None and connection._failover_strategy == "shuffle"
    assert "u:p@" not in backend.describe()


def test_memory_backend_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="invalid prefix"):
        MemoryBackend(prefix="bad prefix")
    with pytest.raises(ConfigError, match="slot_ttl_ms must be a positive integer"):
        MemoryBackend(slot_ttl_ms=0)


# -- hostile configurations -----------------------------------------------------------------------

VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.binary(max_size=4),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
    st.sampled_from(
        [
            "*/5 * * * *",
            "@hourly",
            "* * * * * *",
            "Europe/Paris",
            "tasks.work",
            dt.timedelta(seconds=-1),
            dt.timedelta(seconds=2),
            crontab(minute=7),
            "H * * * *",
            "0 0 30 2 *",
            object(),
        ]
    ),
)
KEYS = st.sampled_from(
    [
        "task",
        "schedule",
        "args",
        "kwargs",
        "options",
        "jitter_ms",
        "max_late_ms",
        "history_size",
        "tz",
        "relative",
        "catch_up",
        "history_ttl_ms",
        "bogus",
    ]
)
NAMES = st.one_of(st.text(alphabet=string.ascii_letters + string.digits + "_-. /é", max_size=12), st.integers())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(NAMES, st.dictionaries(KEYS, VALUES, max_size=6), max_size=3))
def test_hostile_beat_schedules_work_or_fail_with_a_config_error(schedule: dict[Any, Any]) -> None:
    app = make_app(beat_schedule=schedule)
    try:
        jobs = jobs_of(app)
    except ConfigError as exc:
        assert str(exc)
    else:
        for job in jobs.values():
            assert job.next_slot(0) > 0


SETTING_KEYS = st.sampled_from(
    [
        "anarchon_prefix",
        "anarchon_slot_ttl_ms",
        "anarchon_jitter_ms",
        "anarchon_max_late_ms",
        "anarchon_history_size",
        "anarchon_backend",
        "anarchon_bogus",
        "timezone",
    ]
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example({"j": {"task": "tasks.work", "schedule": "* * * * *"}}, {"timezone": "Mars/Olympus"})
@example({"j": {"task": "tasks.work", "schedule": 5}}, {"anarchon_prefix": "amq.x", "anarchon_slot_ttl_ms": True})
@given(
    st.dictionaries(NAMES, st.dictionaries(KEYS, VALUES, max_size=6), max_size=3),
    st.dictionaries(
        SETTING_KEYS, st.one_of(VALUES, st.sampled_from(["memory://", "redis://x", "UTC", "amq.x"])), max_size=4
    ),
)
def test_hostile_configurations_through_the_scheduler_setup(schedule: dict[Any, Any], conf: dict[str, Any]) -> None:
    from anarchon_celery import AnarchonError, Scheduler

    class Embedded(Scheduler):
        exit_on_error = False  # the error itself, not beat's one line and exit status 1

    app = make_app(beat_schedule=schedule)
    app.conf.update(conf)
    if not isinstance(app.conf.get("anarchon_backend"), str) or not app.conf.anarchon_backend.startswith("memory"):
        app.conf.anarchon_backend = "memory://"  # no broker here: the RabbitMQ side is tested against RabbitMQ
    try:
        scheduler = Embedded(app)
    except AnarchonError as exc:
        assert str(exc)
    else:
        assert set(scheduler.jobs) <= {str(name) for name in schedule}
        scheduler.close()


# -- footprint ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "schedule, ttl, jitter, expected",
    [
        (1.0, 60_000, 0, 60),  # a job every second: one gate per second of slot_ttl_ms
        (2.0, 60_000, 2_000, 31),  # the last declaration of a gate may come jitter_ms late
        (3.0, 60_000, 0, 20),
        ("* * * * *", 300_000, 0, 5),
        ("0 * * * *", 300_000, 0, 1),  # hourly: one at a time, whenever the scheduler starts
        ("0,1,2 * * * *", 300_000, 0, 3),  # at their busiest: three together, at :00-:02
        ("0 9 * * 1-5", 300_000, 0, 1),
        ("*/5 * * * * *", 60_000, 0, 12),  # six-field cron, every 5 s
        ("* * * * * *", 300_000, 0, 300),  # every second: extrapolated from its first 64
    ],
)
def test_live_gates_counts_a_gate_lifetime_at_its_busiest(schedule: Any, ttl: int, jitter: int, expected: int) -> None:
    from anarchon_celery.jobs import live_gates

    app = make_app(beat_schedule={"j": entry(schedule=schedule, jitter_ms=jitter, max_late_ms=1_000)})
    job = jobs_of(app)["j"]
    for now in (1_800_000_000_000 + 1, 1_800_000_000_000 + 1_800_000):  # 08:00:00.001 and 08:30 UTC
        assert live_gates([job], ttl, now) == expected
    assert live_gates([job] * 3, ttl, now) == 3 * expected


@settings(max_examples=60, deadline=None)
@given(
    minutes=st.sets(st.integers(0, 59), min_size=1, max_size=60),
    ttl_s=st.integers(20, 3_600),
    now=st.integers(1_600_000_000_000, 1_900_000_000_000),
)
def test_live_gates_is_the_most_runs_of_any_gate_lifetime(minutes: set[int], ttl_s: int, now: int) -> None:
    from anarchon_celery.jobs import live_gates

    spec = f"{','.join(map(str, sorted(minutes)))} * * * *"
    app = make_app(beat_schedule={"j": entry(schedule=spec, jitter_ms=0, max_late_ms=1_000)})
    job = jobs_of(app, slot_ttl_ms=ttl_s * 1000 + 1)["j"]
    # Counted one window per minute over the hour and a bit that the first 64 slots cover, at
    # most: the busiest window starts at a slot, and every hour repeats the same minutes.
    starts = list(job.schedule.slots(now + 1, now + 3_600_000 + 1))
    busiest = max(sum(1 for _ in job.schedule.slots(s, s + ttl_s * 1000)) for s in starts)
    assert live_gates([job], ttl_s * 1000, now) == busiest


def test_the_memory_backend_is_not_warned_about_broker_files(caplog: pytest.LogCaptureFixture) -> None:
    from anarchon_celery import Scheduler

    app = make_app(beat_schedule={f"j{n}": entry(schedule=1.0) for n in range(20)}, anarchon_slot_ttl_ms=300_000)
    caplog.set_level(logging.INFO, logger="anarchon_celery")
    Scheduler(app).close()  # 20 jobs every second: about 6,000 gates, on RabbitMQ
    assert "anarchon: ready as" in caplog.text
    assert "gate queues" not in caplog.text


@pytest.mark.parametrize("lead_ms", [0, 1, 3, 400, 999, 1000, 1500, 2_750, 10_000, 10_500])
def test_gates_are_never_declared_earlier_than_lead_ms_and_away_from_whole_seconds(lead_ms: int) -> None:
    from anarchon_celery import Scheduler

    app = make_app(beat_schedule={"j": entry(schedule=1.0)}, anarchon_lead_ms=lead_ms)
    for _ in range(20):
        scheduler = Scheduler(app)
        phase = scheduler.plan.prepare_phase_ms
        assert 0 <= phase < max(1, lead_ms)  # declared lead_ms - phase before the run: never earlier
        if lead_ms >= 1000:  # a run on a whole second gets its gate a quarter to three quarters into one
            assert 250 <= (phase - lead_ms) % 1000 <= 750
        scheduler.close()


# -- settings under a namespace, and their checks -------------------------------------------------


def namespaced_app(namespace: str, **settings: Any) -> Celery:
    app = Celery(f"app{uuid.uuid4().hex[:6]}", set_as_current=False)
    app.config_from_object(type("Config", (), {"broker_url": "memory://", **settings}), namespace=namespace)

    @app.task(name="tasks.work", shared=False)
    def work(*args: Any, **kwargs: Any) -> None: ...

    return app


def test_namespaced_settings_are_read() -> None:
    from anarchon_celery.control import configure

    app = namespaced_app(
        "CELERY",
        CELERY_ANARCHON_BACKEND="memory://",
        CELERY_ANARCHON_PREFIX="ns.",
        CELERY_ANARCHON_SLOT_TTL_MS=100_000,
        CELERY_ANARCHON_JITTER_MS=5,
        CELERY_ANARCHON_MAX_LATE_MS=7,
        CELERY_ANARCHON_HISTORY_SIZE=3,
        CELERY_ANARCHON_LEAD_MS=11,
        CELERY_BEAT_SCHEDULE={"j": entry()},
    )
    read = Settings.from_app(app)
    assert (read.backend, read.prefix, read.slot_ttl_ms) == ("memory://", "ns.", 100_000)
    assert (read.jitter_ms, read.max_late_ms, read.history_size, read.lead_ms) == (5, 7, 3, 11)
    deployment = configure(app)
    assert (deployment.backend.prefix, deployment.backend.slot_ttl_ms) == ("ns.", 100_000)
    job = deployment.jobs["j"]
    assert (job.jitter_ms, job.max_late_ms, job.history_size) == (5, 7, 3)
    # A lower-case namespace reads lower-case names; the plain names are read under any namespace.
    lower = namespaced_app("celery", celery_anarchon_prefix="low.", anarchon_jitter_ms=9)
    assert (Settings.from_app(lower).prefix, Settings.from_app(lower).jitter_ms) == ("low.", 9)


@pytest.mark.parametrize(
    "namespace, key, message",
    [
        (
            "CELERY",
            "CELERY_ANARCHON_PREFX",
            "unknown setting CELERY_ANARCHON_PREFX (did you mean CELERY_ANARCHON_PREFIX?)",
        ),
        (
            "CELERY",
            "CELERY_ANARCHON_MAX_LATE",
            "unknown setting CELERY_ANARCHON_MAX_LATE (did you mean CELERY_ANARCHON_MAX_LATE_MS?)",
        ),
        # Without the namespace, or in the other case, Celery never reads them.
        ("CELERY", "ANARCHON_PREFIX", "unknown setting ANARCHON_PREFIX (did you mean CELERY_ANARCHON_PREFIX?)"),
        (
            "celery",
            "CELERY_ANARCHON_PREFIX",
            "unknown setting CELERY_ANARCHON_PREFIX (did you mean celery_anarchon_prefix?)",
        ),
        ("CELERY", "anarchon_prefx", "unknown setting anarchon_prefx (did you mean anarchon_prefix?)"),
        (None, "anarchon_prefx", "unknown setting anarchon_prefx (did you mean anarchon_prefix?)"),
        (None, "ANARCHON_PREFIX", "unknown setting ANARCHON_PREFIX (did you mean anarchon_prefix?)"),
        (
            None,
            "anarchon_zzz",
            "unknown setting anarchon_zzz: known ones are anarchon_backend, anarchon_backup_runners, anarchon_catch_up",
        ),
        (
            "CELERY",
            "CELERY_ANARCHON_ZZZ",
            "unknown setting CELERY_ANARCHON_ZZZ: known ones are CELERY_ANARCHON_BACKEND,",
        ),
    ],
)
def test_misspelt_settings_are_refused_with_a_suggestion(namespace: str | None, key: str, message: str) -> None:
    app = namespaced_app(namespace, **{key: "x."}) if namespace else make_app(**{key: "x."})
    with pytest.raises(ConfigError) as info:
        Settings.from_app(app)
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize("key, minimum", [("jitter_ms", 0), ("max_late_ms", 1), ("history_size", 0)])
def test_setting_and_job_minimums_agree(key: str, minimum: int) -> None:
    # What a job refuses, the setting that is its default refuses too, naming the setting.
    assert getattr(Settings.from_app(make_app(**{f"anarchon_{key}": minimum})), key) == minimum
    assert getattr(jobs_of(make_app(beat_schedule={"j": entry(**{key: minimum})}))["j"], key) == minimum
    with pytest.raises(ConfigError, match=rf"^anarchon_{key} must be an integer >= {minimum}, not {minimum - 1}$"):
        Settings.from_app(make_app(**{f"anarchon_{key}": minimum - 1}))
    with pytest.raises(ConfigError, match=rf"^job 'j': {key} must be an integer >= {minimum}, not {minimum - 1}$"):
        jobs_of(make_app(beat_schedule={"j": entry(**{key: minimum - 1})}))


def test_a_global_max_late_ms_of_0_is_refused_as_a_setting() -> None:
    from anarchon_celery.control import configure

    app = make_app(anarchon_max_late_ms=0, beat_schedule={"j": entry()})
    with pytest.raises(ConfigError, match=r"^anarchon_max_late_ms must be an integer >= 1, not 0$"):
        configure(app)  # as the scheduler at start and `celery anarchon check` read it
    namespaced = namespaced_app("CELERY", CELERY_ANARCHON_BACKEND="memory://", CELERY_ANARCHON_MAX_LATE_MS=0)
    with pytest.raises(ConfigError, match=r"^CELERY_ANARCHON_MAX_LATE_MS must be an integer >= 1, not 0$"):
        Settings.from_app(namespaced)


# -- arguments the task's serializer must encode --------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        entry(args=(object(),)),
        entry(kwargs={"when": object()}),
        entry(args=(1, {2, 3})),  # a set: not JSON
        entry(args=(1,), kwargs={"z": 1j}),  # complex: not JSON (bytes, dates, UUIDs are)
    ],
)
def test_arguments_the_serializer_cannot_encode_are_refused(bad: dict[str, Any]) -> None:
    from anarchon_celery.control import configure

    app = make_app(beat_schedule={"j": bad})
    message = (
        r"^job 'j': its args/kwargs cannot be serialized with 'json' \(the task's serializer\): "
        r".*\. Pass only values 'json' can encode, or give the task a serializer that can"
    )
    with pytest.raises(ConfigError, match=message):
        jobs_of(app)
    with pytest.raises(ConfigError, match=message):  # as the scheduler at start and check read it
        configure(app)


def test_arguments_are_encoded_with_the_serializer_the_task_is_sent_with() -> None:
    opaque = object()
    app = make_app(
        beat_schedule={
            "plain": entry(args=(1, "a", [2.5, None]), kwargs={"d": {"x": True}}),
            "option": entry(args=(opaque,), options={"serializer": "pickle"}),  # apply_async's wins
            "task": {"task": "tasks.pickled", "schedule": 60, "args": (opaque,)},
            "refused": entry(args=(1,), options={"serializer": "nope"}),
        }
    )

    @app.task(name="tasks.pickled", serializer="pickle", shared=False)
    def pickled(*args: Any) -> None: ...

    with pytest.raises(ConfigError, match=r"^job 'refused': serializer 'nope' \(the job's serializer option\) is not"):
        jobs_of(app)
    del app.conf.beat_schedule["refused"]
    assert sorted(jobs_of(app)) == ["option", "plain", "task"]
    app.conf.beat_schedule["app-wide"] = entry(args=(opaque,))
    with pytest.raises(ConfigError, match="job 'app-wide'"):
        jobs_of(app)
    pickling = make_app(task_serializer="pickle", beat_schedule={"app-wide": entry(args=(opaque,))})
    assert "app-wide" in jobs_of(pickling)  # the app's serializer, for tasks that set none


# -- arguments that must bind to the task's parameters --------------------------------------------


def binding_app(**celery: Any) -> Celery:
    """An app with tasks of each kind of signature: plain, bound, without typing, with typing
    whatever the app says, a task class."""
    app = Celery(f"app{uuid.uuid4().hex[:6]}", broker="memory://", set_as_current=False, **celery)
    app.conf.anarchon_backend = anarchon_celery.MemoryBackend()  # (one for the app: its runtime jobs kept)

    @app.task(name="tasks.add", shared=False)
    def add(x: int, y: int = 0, *, z: int = 0) -> int: ...

    @app.task(name="tasks.bound", bind=True, shared=False)
    def bound(self: Any, n: int) -> None: ...

    @app.task(name="tasks.loose", typing=False, shared=False)
    def loose(x: int) -> None: ...

    @app.task(name="tasks.typed", typing=True, shared=False)
    def typed(x: int) -> None: ...

    @app.task(name="tasks.none", shared=False)
    def none() -> None: ...

    class Klass(app.Task):  # type: ignore[name-defined,misc]
        name = "tasks.klass"

        def run(self, x: int) -> None: ...

    app.register_task(Klass())
    return app


@pytest.mark.parametrize(
    "task, args, kwargs, error",
    [
        ("tasks.add", (), {}, "task 'tasks.add'(x, y=0, *, z=0): called as (), missing 1 required positional argument"),
        ("tasks.add", (1, 2, 3), {}, "called as (1, 2, 3), takes from 1 to 2 positional arguments but 3 were given"),
        ("tasks.add", (1,), {"w": 2}, "called as (1, w=2), got an unexpected keyword argument 'w'"),
        ("tasks.add", (1,), {"x": 2}, "got multiple values for argument 'x'"),
        (
            "tasks.none",
            ("a",),
            {},
            "task 'tasks.none'(): called as ('a'), takes 0 positional arguments but 1 was given",
        ),
        ("tasks.bound", (), {}, "task 'tasks.bound'(n): called as (), missing 1 required positional argument: 'n'"),
    ],
)
def test_arguments_that_do_not_bind_to_the_task_are_refused(
    task: str, args: tuple[Any, ...], kwargs: dict[str, Any], error: str
) -> None:
    from anarchon_celery.control import configure

    app = binding_app()
    app.conf.beat_schedule = {"j": {"task": task, "schedule": 60, "args": args, "kwargs": kwargs}}
    message = f"^job 'j': its arguments do not fit task {task!r}"
    with pytest.raises(ConfigError, match=message) as found:
        jobs_of(app)
    assert error in str(found.value)
    assert str(found.value).endswith(
        ". Give args/kwargs that the task's parameters take, or make the task with typing=False "
        "(@app.task(typing=False)) if it takes them another way"
    )
    with pytest.raises(ConfigError, match=message):  # as the scheduler at start and check read it
        configure(app)
    app.conf.beat_schedule = {}
    runtime = f"^job 'extra': its arguments do not fit task {task!r}"
    with pytest.raises(ConfigError, match=runtime):  # as a runtime job is added
        anarchon_celery.add_job(app, "extra", task=task, schedule=60, args=list(args), kwargs=kwargs)
    assert anarchon_celery.runtime_jobs(app) == {}


@pytest.mark.parametrize(
    "task, args, kwargs, strict",
    [
        ("tasks.add", (1,), {}, True),
        ("tasks.add", (1, 2), {"z": 3}, True),
        ("tasks.add", (), {"x": 1, "y": 2}, True),
        ("tasks.bound", (1,), {}, True),
        ("tasks.loose", (1, 2, 3), {"k": 4}, True),  # typing=False: Celery sends it unchecked, and so do we
        ("tasks.klass", (1, 2, 3), {}, True),  # a task class has no header: Celery checks nothing
        ("tasks.add", (1, 2, 3, 4), {}, False),  # Celery(strict_typing=False): no task checked but by its own word
    ],
)
def test_arguments_that_bind_or_that_celery_sends_unchecked_are_taken(
    task: str, args: tuple[Any, ...], kwargs: dict[str, Any], strict: bool
) -> None:
    app = binding_app(strict_typing=strict)
    app.conf.beat_schedule = {
        "j": {"task": task, "schedule": 60, "args": args, "kwargs": kwargs},
        "typed": {"task": "tasks.typed", "schedule": 60, "args": (1, 2)},  # beside it, checked
    }
    with pytest.raises(ConfigError, match="^job 'typed': its arguments do not fit task 'tasks.typed'"):
        jobs_of(app)  # (j, before it, was taken)
    del app.conf.beat_schedule["typed"]
    assert list(jobs_of(app)) == ["j"]
