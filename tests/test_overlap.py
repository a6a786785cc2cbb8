"""Overlap protection (``overlap="skip"``, ``"buffer_one"``, ``"buffer_all"``): the pure rules of a
job's hold (:mod:`anarchon_celery.backends.busy`), the settings, and the contract on each store:
the claim step, the worker's start check, its heartbeat, a run's end, the pending runs."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import pytest

from anarchon_celery import Claim, ConfigError, Outcome
from anarchon_celery.backends import Backend
from anarchon_celery.backends import busy as rules
from anarchon_celery.backends.base import CATCH_UP, GAP, Overlapped
from anarchon_celery.backends.busy import (
    BUFFER_ALL_CAP,
    DROPPED,
    PENDING,
    RUN,
    SEND,
    SKIPPED,
    WAIT,
    Freed,
    JobBusy,
)
from anarchon_celery.history import encode_event, fold
from anarchon_celery.jobs import collect_jobs, definition

from .test_backends import make_backend  # noqa: F401 - the contract's backends
from .test_jobs import make_app

NOW = 1_800_000_000_000
LEASE = 5_000
QUEUED = 60_000


# -- the rules, pure ----------------------------------------------------------------------------


def _held(slot: int, state: str = rules.QUEUED, until: int = NOW + 1_000, worker: str = "", **more: Any) -> JobBusy:
    return JobBusy(policy=more.pop("policy", "skip"), slot=slot, state=state, until_ms=until, worker=worker, **more)


@pytest.mark.parametrize(
    "policy, before, slot, verdict, pending_after",
    [
        ("skip", JobBusy(policy="skip"), 10, SEND, []),  # free: the run holds the job
        ("skip", _held(5), 10, SKIPPED, []),
        ("skip", _held(5, until=NOW), 10, SEND, []),  # its hold ran out: free
        ("skip", _held(5, pending=[7]), 10, SKIPPED, []),  # (pending runs left by buffer_*: dropped)
        ("buffer_one", _held(5, policy="buffer_one"), 10, PENDING, [10]),
        ("buffer_one", _held(5, policy="buffer_one", pending=[7]), 10, SKIPPED, [7]),  # one kept, the rest skipped
        ("buffer_one", JobBusy(policy="buffer_one", pending=[7]), 10, SKIPPED, [7]),  # free, one pending: it goes first
        ("buffer_all", _held(5, policy="buffer_all", pending=[7]), 10, PENDING, [7, 10]),
        ("buffer_all", _held(5, policy="buffer_all", pending=list(range(BUFFER_ALL_CAP))), 5_000, DROPPED, None),
        ("buffer_all", _held(10, policy="buffer_all"), 10, SEND, []),  # the run that holds it
    ],
)
def test_a_run_won_is_sent_only_when_its_job_is_free(
    policy: str, before: JobBusy, slot: int, verdict: str, pending_after: list[int] | None
) -> None:
    state = JobBusy.decode(before.encode())
    assert state is not None
    assert rules.admit(state, slot, policy, NOW, LEASE, QUEUED)[0] == verdict
    if verdict == SEND:
        assert (state.slot, state.state, state.until_ms) in (
            (slot, rules.QUEUED, NOW + LEASE),
            (slot, rules.QUEUED, before.until_ms),
        )
    if pending_after is not None:
        assert state.pending == pending_after


def test_a_run_sent_holds_its_job_until_queued_ms_then_a_worker_holds_it_until_its_end() -> None:
    state = JobBusy(policy="skip")
    assert rules.admit(state, 10, "skip", NOW, LEASE, QUEUED)[0] == SEND
    rules.sent(state, 10, NOW + 100)
    assert state.until_ms == NOW + 100 + QUEUED
    assert rules.start(state, 10, "run-10", "w1", NOW + 200, 30_000, has_record=True) == (RUN, None)
    assert (state.state, state.worker, state.run, state.until_ms) == (rules.RUNNING, "w1", "run-10", NOW + 30_200)
    assert rules.renew(state, 10, "w1", NOW + 10_000, 30_000) == rules.RENEWED
    assert state.until_ms == NOW + 40_000
    assert rules.renew(state, 10, "w1", NOW + 40_000, 30_000) == rules.LATE  # it had run out: nobody took it
    assert rules.renew(state, 10, "w2", NOW + 40_000, 30_000) == rules.LOST  # held by another process
    assert rules.end(state, 99, "w1") is False  # not its run
    assert rules.end(state, 10, "") is False  # running: only its holder ends it
    assert rules.end(state, 10, "w1") is True
    assert state.slot is None
    assert rules.renew(state, 10, "w1", NOW + 20_000, 30_000) is None  # ended: nothing to renew
    queued = JobBusy(policy="skip")
    rules.admit(queued, 20, "skip", NOW, LEASE, QUEUED)
    assert rules.renew(queued, 20, "w1", NOW, 30_000) is None  # prefetched, not started: nothing to renew


def test_a_worker_that_stops_renewing_frees_the_job_and_its_run_is_abandoned() -> None:
    state = JobBusy(policy="skip")
    rules.admit(state, 10, "skip", NOW, LEASE, QUEUED)
    rules.start(state, 10, "run-10", "w1", NOW, 30_000, has_record=True)
    verdict, freed = rules.admit(state, 20, "skip", NOW + 30_000, LEASE, QUEUED)
    assert verdict == SEND and freed == Freed(10, "run-10", "w1", True)
    # A run sent that no worker started within queued_ms: freed, not abandoned.
    rules.sent(state, 20, NOW + 30_000)
    verdict, freed = rules.admit(state, 30, "skip", NOW + 30_000 + QUEUED, LEASE, QUEUED)
    assert verdict == SEND and freed == Freed(20, "", "", False)


@pytest.mark.parametrize(
    "before, slot, worker, has_record, verdict",
    [
        (None, 10, "w1", True, RUN),  # a job not protected
        (JobBusy(policy="allow", slot=5, state=rules.RUNNING, until_ms=NOW + 9), 10, "w1", True, RUN),
        (JobBusy(policy="skip"), 10, "w1", False, RUN),  # free: run_now's message holds it
        (_held(10), 10, "w1", True, RUN),  # the run sent
        (_held(5), 10, "w1", True, SKIPPED),  # another run sent first (run_now, a takeover, before the option)
        (_held(5, policy="buffer_one"), 10, "w1", True, PENDING),  # kept, to be sent again
        (_held(5, policy="buffer_one"), 10, "w1", False, SKIPPED),  # run_now's: cannot be sent again
        (_held(5, state=rules.RUNNING, worker="w0"), 10, "w1", True, SKIPPED),
        (_held(10, state=rules.RUNNING, worker="w0"), 10, "w1", True, WAIT),  # delivered again: w0 may still run it
        (_held(10, state=rules.RUNNING, worker="w0", until=NOW), 10, "w1", True, RUN),  # w0's hold ran out
        (_held(10, state=rules.RUNNING, worker="w1"), 10, "w1", True, RUN),  # its own
    ],
)
def test_the_workers_start_check_never_starts_a_run_beside_another(
    before: JobBusy | None, slot: int, worker: str, has_record: bool, verdict: str
) -> None:
    state = JobBusy.decode(before.encode()) if before is not None else None
    assert rules.start(state, slot, "r", worker, NOW, 30_000, has_record=has_record)[0] == verdict


def test_pending_runs_go_oldest_first_once_the_job_is_free() -> None:
    state = _held(5, policy="buffer_all", pending=[7, 9])
    assert rules.next_pending(state, NOW, LEASE) == (None, None)  # busy
    assert rules.end(state, 5, "") is True
    assert rules.next_pending(state, NOW, LEASE) == (7, None)
    assert (state.slot, state.state, state.pending) == (7, rules.QUEUED, [7, 9])  # pending until sent
    assert rules.next_pending(state, NOW, LEASE) == (None, None)  # 7 holds it now
    # Its sender died before sending it: once that hold runs out, 7 is taken again.
    assert rules.next_pending(state, NOW + LEASE, LEASE) == (7, Freed(7, "", "", False))
    rules.sent(state, 7, NOW + LEASE)
    assert state.pending == [9]
    assert rules.next_pending(None, NOW, LEASE) == (None, None)


def test_a_state_round_trips_through_its_json() -> None:
    state = JobBusy("buffer_all", 1_800_000_000_123, "r", rules.RUNNING, NOW, "celery@h", 9, [1, 2])
    assert JobBusy.decode(state.encode()) == state
    assert JobBusy.decode(None) is None and JobBusy.decode("") is None


# -- settings and keys --------------------------------------------------------------------------


def _jobs(backend: str, **conf: Any) -> dict[str, Any]:
    from anarchon_celery.backends import backend_for
    from anarchon_celery.settings import Settings

    app = make_app(**conf)
    app.conf.anarchon_backend = backend
    settings = Settings.from_app(app)
    return {job.name: job for job in collect_jobs(app, settings, backend_for(app, settings))}


def _sqlite_jobs(tmp_path: Any, **conf: Any) -> dict[str, Any]:
    return _jobs(f"sqlite:///{tmp_path / 'o.db'}", **conf)


def test_the_setting_is_every_jobs_default_and_expires_bounds_the_queued_hold(tmp_path: Any) -> None:
    schedule = {
        "a": {"task": "tasks.work", "schedule": 60.0},
        "b": {"task": "tasks.work", "schedule": 60.0, "overlap": "allow"},
        "c": {"task": "tasks.work", "schedule": 60.0, "overlap": "buffer_one", "options": {"expires": 30}},
    }
    jobs = _sqlite_jobs(tmp_path, beat_schedule=schedule, anarchon_overlap="skip")
    assert (jobs["a"].overlap, jobs["a"].overlap_queued_ms) == ("skip", 3_600_000)
    assert jobs["b"].overlap == "allow"
    assert (jobs["c"].overlap, jobs["c"].overlap_queued_ms) == ("buffer_one", 30_000)
    assert definition(jobs["a"])["overlap"] == "skip" and "overlap" not in definition(jobs["b"])


@pytest.mark.parametrize(
    "conf, message",
    [
        (
            {"beat_schedule": {"j": {"task": "tasks.work", "schedule": 5.0, "overlap": True}}},
            "job 'j': overlap must be one of",
        ),
        (
            {"beat_schedule": {"j": {"task": "tasks.work", "schedule": 5.0, "overlap": "forbid"}}},
            "'skip', 'buffer_one'",
        ),
        ({"anarchon_overlap": "never"}, "anarchon_overlap must be one of"),
        ({"anarchon_overlap_lease_ms": 10}, "anarchon_overlap_lease_ms must be an integer >= 1000"),
    ],
)
def test_bad_overlap_values_are_refused_naming_the_job_or_setting(
    tmp_path: Any, conf: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        _sqlite_jobs(tmp_path, **conf)


def test_overlap_is_refused_on_a_claim_only_backend() -> None:
    with pytest.raises(ConfigError, match="overlap is not available: the memory backend is claim only|claim only"):
        _jobs("memory://", beat_schedule={"j": {"task": "tasks.work", "schedule": 5.0, "overlap": "skip"}})


def test_history_tells_runs_skipped_for_overlap_and_runs_kept_pending() -> None:
    pending = encode_event("pending", run="r1", job="j", at_ms=5, slot=1, instance="h:1")
    sent = encode_event("sent", run="r1", job="j", at_ms=9, slot=1, instance="h:2", trigger="buffered")
    skipped = encode_event("skipped", run="r2", job="j", at_ms=6, slot=2, instance="h:1", reason="overlap")
    from anarchon_celery.history import decode_event

    runs = {run.run_id: run for run in fold([decode_event(e) for e in (pending, skipped)])}
    assert (runs["r1"].status, runs["r2"].status, runs["r2"].reason) == ("pending", "skipped", "overlap")
    runs = {run.run_id: run for run in fold([decode_event(e) for e in (pending, sent)])}
    assert (runs["r1"].status, runs["r1"].trigger, runs["r1"].instance) == ("sent", "buffered", "h:2")


# -- the contract, on each store ------------------------------------------------------------------


def _store(make_backend: Any, lease_ms: int = 5_000) -> Backend:  # noqa: F811
    backend = make_backend(lease_ms)
    if not backend.leases:
        pytest.skip("claim only: overlap protection is refused there")
    return backend


def _claim(slot: int, policy: str = "skip", queued_ms: int = QUEUED, **more: Any) -> Claim:
    return Claim("j", slot, overlap=policy, queued_ms=queued_ms, **more)


def test_a_store_sends_no_run_of_a_busy_job_under_skip(make_backend: Any) -> None:  # noqa: F811
    a, b = _store(make_backend), _store(make_backend)
    store_a, store_b = a.lease_store, b.lease_store
    assert store_a is not None and store_b is not None
    assert a.claim([_claim(10_000)], "a") == [Outcome.WON]
    assert store_a.mark_sent([("j", 10_000, 1)], "a") == [True]
    # Due while the first is queued: won by b, not sent, and decided (nobody wins it later).
    assert b.claim([_claim(20_000)], "b") == [Outcome.LOST]
    assert store_b.overlapped() == [Overlapped(_claim(20_000), SKIPPED)]
    assert a.claim([_claim(20_000)], "a") == [Outcome.LOST] and store_a.overlapped() == []
    # A worker starts the first run: it holds the job; its end frees it.
    start = store_a.start_run("j", 10_000, 1, False, run="r1", worker="w1", lease_ms=30_000)
    assert (start.allowed, start.overlap, start.holds) == (True, "", True)
    assert b.claim([_claim(30_000)], "b") == [Outcome.LOST]
    assert [item.verdict for item in store_b.overlapped()] == [SKIPPED]
    runs = [("j", 10_000, "w1"), ("j", 30_000, "w1"), ("other", 5, "w1"), ("j", 10_000, "w2")]
    assert store_b.renew_busy(runs, 30_000) == ["renewed", "lost", None, "lost"]
    assert store_b.end_busy("j", 10_000, "w2") is False  # another process: the run goes on in w1
    assert store_b.end_busy("j", 10_000, "w1") is True
    assert b.claim([_claim(40_000)], "b") == [Outcome.WON]
    assert store_b.overlapped() == []


def test_the_workers_start_check_is_the_authority(make_backend: Any) -> None:  # noqa: F811
    a = _store(make_backend)
    store = a.lease_store
    assert store is not None
    assert a.claim([_claim(10_000)], "a") == [Outcome.WON]
    # run_now's message (no token, no record) while the scheduled run holds the job: skipped.
    assert store.start_run("j", 99_999, 0, False, run="manual", worker="w2", lease_ms=30_000).overlap == SKIPPED
    # The scheduled run starts; a message of it delivered again to another worker waits for w1.
    assert store.start_run("j", 10_000, 1, False, run="r1", worker="w1", lease_ms=30_000).allowed is True
    again = store.start_run("j", 10_000, 1, True, run="r1", worker="w2", lease_ms=30_000)
    assert (again.allowed, again.overlap) == (False, WAIT) and 0 < again.left_ms <= 30_000
    # A takeover's second message of the same run, with a stale token: refused by its token.
    assert store.start_run("j", 10_000, 2, False, run="r1", worker="w2", lease_ms=30_000).allowed is False
    assert store.end_busy("j", 10_000, "w2") is False  # told by another worker than the one running it
    assert store.end_busy("j", 10_000, "") is False  # (revoked, expired: only a queued run)
    assert store.end_busy("j", 10_000, "w#*") is False  # another node's
    assert store.end_busy("j", 10_000, "w1#*") is False
    assert store.start_run("j", 20_000, 0, False, run="r", worker="n#1.2", lease_ms=30_000).overlap == SKIPPED
    assert store.end_busy("j", 10_000, "w1") is True
    assert store.start_run("j", 99_999, 0, False, run="manual", worker="w2", lease_ms=30_000).allowed is None


def test_a_worker_that_dies_frees_its_job_once_its_hold_runs_out(make_backend: Any) -> None:  # noqa: F811
    a = _store(make_backend)
    store = a.lease_store
    assert store is not None
    assert a.claim([_claim(10_000)], "a") == [Outcome.WON]
    assert store.start_run("j", 10_000, 1, False, run="r1", worker="w1", lease_ms=300).holds
    assert a.claim([_claim(20_000)], "a") == [Outcome.LOST]
    time.sleep(0.5)  # w1 renews nothing: it died
    assert a.claim([_claim(30_000)], "a") == [Outcome.WON]
    assert store.freed() == [("j", Freed(10_000, "r1", "w1", True))]
    # Had w1 only stalled, its next renewal is told that its hold is gone.
    assert store.renew_busy([("j", 10_000, "w1")], 300) == ["lost"]


def test_a_run_sent_holds_its_job_past_the_winners_lease_until_queued_ms(make_backend: Any) -> None:  # noqa: F811
    a = _store(make_backend, lease_ms=200)
    store = a.lease_store
    assert store is not None
    assert a.claim([_claim(10_000, queued_ms=60_000)], "a") == [Outcome.WON]
    assert store.mark_sent([("j", 10_000, 1)], "a") == [True]
    time.sleep(0.4)  # past the winner's lease: still queued
    assert a.claim([_claim(20_000, queued_ms=60_000)], "a") == [Outcome.LOST]
    # A winner that dies before sending holds the job for its lease only.
    assert a.claim([Claim("k", 10_000, overlap="skip", queued_ms=60_000)], "a") == [Outcome.WON]
    time.sleep(0.4)
    assert a.claim([Claim("k", 20_000, overlap="skip", queued_ms=60_000)], "a") == [Outcome.WON]
    assert store.freed() == [("k", Freed(10_000, "", "", False))]


@pytest.mark.parametrize("policy", ["buffer_one", "buffer_all"])
def test_runs_kept_pending_are_sent_oldest_first_by_whoever_finds_the_job_free(
    make_backend: Any,  # noqa: F811
    policy: str,
) -> None:
    a, b = _store(make_backend), _store(make_backend)
    store_a, store_b = a.lease_store, b.lease_store
    assert store_a is not None and store_b is not None
    assert a.claim([_claim(10_000, policy)], "a") == [Outcome.WON]
    assert a.claim([_claim(20_000, policy), _claim(30_000, policy)], "a") == [Outcome.LOST, Outcome.LOST]
    verdicts = [item.verdict for item in store_a.overlapped()]
    assert verdicts == ([PENDING, SKIPPED] if policy == "buffer_one" else [PENDING, PENDING])
    assert store_b.next_pending(["j"], "b", {"j": 10**15}) == []  # busy
    assert store_a.start_run("j", 10_000, 1, False, run="r1", worker="w1", lease_ms=30_000).holds
    assert store_a.end_busy("j", 10_000, "w1")
    assert store_b.next_pending(["j"], "b", {"j": 10**15}) == [("j", 20_000, 2)]  # its token: one more
    assert store_a.renew_busy([("j", 20_000, "w1")], 30_000) == [None]  # queued: nothing to renew yet
    assert store_a.next_pending(["j"], "a", {"j": 10**15}) == []  # 20_000 holds the job now (pending until sent)
    assert store_b.mark_sent([("j", 20_000, 2)], "b") == [True]
    assert store_a.start_run("j", 20_000, 1, False, run="r2", worker="w1", lease_ms=30_000).allowed is False
    assert store_a.start_run("j", 20_000, 2, False, run="r2", worker="w1", lease_ms=30_000).allowed is True
    assert store_a.end_busy("j", 20_000, "w1")
    expected = [] if policy == "buffer_one" else [("j", 30_000, 2)]
    assert store_b.next_pending(["j"], "b", {"j": 10**15}) == expected


def test_a_job_that_allows_overlap_again_is_not_held(make_backend: Any) -> None:  # noqa: F811
    a = _store(make_backend)
    store = a.lease_store
    assert store is not None
    assert a.claim([_claim(10_000)], "a") == [Outcome.WON]
    assert a.claim([_claim(20_000, "allow")], "a") == [Outcome.WON]  # the policy changed: sent
    assert store.start_run("j", 30_000, 0, False, run="m", worker="w", lease_ms=30_000).holds is False


def test_runs_of_catch_up_go_through_the_overlap_policy(make_backend: Any) -> None:  # noqa: F811
    a = _store(make_backend)
    store = a.lease_store
    assert store is not None
    assert a.claim([_claim(10_000, key="k")], "a") == [Outcome.WON]
    # The job still busy: a catch-up claim is won (its gap is the winner's) but not sent.
    assert a.claim([_claim(50_000, key="k", kind=CATCH_UP)], "a") == [Outcome.LOST]
    assert [item.verdict for item in store.overlapped()] == [SKIPPED]
    assert [gap.after for gap in store.gaps()] == [10_000]
    assert a.claim([_claim(30_000, kind=GAP)], "a") == [Outcome.LOST]
    assert [item.verdict for item in store.overlapped()] == [SKIPPED]


def test_a_dead_workers_hold_is_freed_at_once_on_sqlite(tmp_path: Any, prefix: str) -> None:
    """SQLite: the worker's main process holds a file lock beside the database for its life; the
    moment it is gone (the kernel releases the lock), its holds are freed, without waiting for
    their lease (a minute here)."""
    from anarchon_celery import SQLiteBackend

    worker_side = SQLiteBackend(tmp_path / "a.db", prefix=prefix)
    beat = SQLiteBackend(tmp_path / "a.db", prefix=prefix)
    try:
        # The worker: another process that holds its file lock, then is killed.
        code = (
            "import sys; from anarchon_celery import SQLiteBackend; "
            f"b = SQLiteBackend({str(tmp_path / 'a.db')!r}, prefix={prefix!r}); "
            "assert b.hold_worker('w1@h#100'); print('held', flush=True); sys.stdin.read()"
        )
        worker = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            assert worker.stdout is not None and worker.stdout.readline() == b"held\n"
            assert not worker_side.hold_worker("w1@h#100")  # (taken: by a live process)
            assert beat.claim([_claim(10_000)], "a") == [Outcome.WON]
            start = worker_side.start_run("j", 10_000, 1, False, run="r1", worker="w1@h#100.101", lease_ms=60_000)
            assert start.holds
            assert beat.claim([_claim(20_000)], "a") == [Outcome.LOST]  # w1 lives: the job is busy
        finally:
            worker.kill()
            worker.wait()
        assert beat.claim([_claim(30_000)], "a") == [Outcome.WON]  # at once, not after the minute's lease
        assert beat.freed() == [("j", Freed(10_000, "r1", "w1@h#100.101", True))]
    finally:
        worker_side.close()
        beat.close()


def test_check_names_the_jobs_protected_from_overlap(tmp_path: Any) -> None:
    from anarchon_celery import SQLiteBackend

    jobs = _sqlite_jobs(
        tmp_path,
        beat_schedule={
            "a": {"task": "tasks.work", "schedule": 60.0, "overlap": "skip"},
            "b": {"task": "tasks.work", "schedule": 60.0, "overlap": "buffer_one"},
            "c": {"task": "tasks.work", "schedule": 60.0},
        },
    )
    backend = SQLiteBackend(tmp_path / "o.db")
    try:
        backend.open()
        detail = backend.report_claims(list(jobs.values())).detail
        assert "overlap skip: a; overlap buffer_one: b" in detail
        assert "every job may overlap itself" in backend.report_claims([jobs["c"]]).detail
    finally:
        backend.close()


def test_a_retry_holds_its_job_as_queued_until_a_worker_starts_it(make_backend: Any) -> None:  # noqa: F811
    a = _store(make_backend)
    store = a.lease_store
    assert store is not None
    assert a.claim([_claim(10_000, queued_ms=60_000)], "a") == [Outcome.WON]
    assert store.start_run("j", 10_000, 1, False, run="r1", worker="n#1.2", lease_ms=30_000).holds
    assert store.end_busy("j", 10_000, "n#1.3", retrying=True) is False  # not its holder
    assert store.end_busy("j", 10_000, "n#1.2", retrying=True) is True
    assert store.renew_busy([("j", 10_000, "n#1.2")], 30_000) == [None]  # queued: waits for its retry
    assert a.claim([_claim(20_000)], "a") == [Outcome.LOST]  # still busy
    # The retry starts on another worker (no token: its run started already) and ends there.
    assert store.start_run("j", 10_000, 0, False, run="r1", worker="m#5.6", lease_ms=30_000).holds
    assert store.end_busy("j", 10_000, "m#5.6") is True
    assert a.claim([_claim(30_000)], "a") == [Outcome.WON]


def test_a_lease_expired_record_gives_way_to_the_workers_own_end() -> None:
    from anarchon_celery.history import decode_event

    abandoned = encode_event(
        "abandoned", run="r", job="j", at_ms=9, worker="w#1.2", error_type="LeaseExpired", error="stopped renewing"
    )
    succeeded = encode_event("succeeded", run="r", job="j", at_ms=10, worker="w#1.2")
    for order in ((abandoned, succeeded), (succeeded, abandoned)):
        (run,) = fold([decode_event(e) for e in order])
        assert (run.status, run.error_type) == ("succeeded", None)
    (run,) = fold([decode_event(abandoned)])
    assert (run.status, run.error_type) == ("abandoned", "LeaseExpired")
