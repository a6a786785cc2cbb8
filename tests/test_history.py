"""History events and their fold into runs: pure, no broker."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from anarchon_celery.history import (
    EVENTS,
    MAX_ERROR_CHARS,
    REVOKE_REASONS,
    SKIP_REASONS,
    decode_event,
    encode_event,
    fold,
)

RUN_A, RUN_B = "run-a", "run-b"


def ev(event: str, run: str, at: int, **fields: object) -> dict:
    decoded = decode_event(encode_event(event, run=run, job="job", at_ms=at, **fields))
    assert decoded is not None
    return decoded


def test_a_run_folds_to_its_most_advanced_event_in_any_order() -> None:
    events = [
        ev("sent", RUN_A, 100, slot=90, task_id=RUN_A, task="t", instance="h:1", trigger="schedule"),
        ev("running", RUN_A, 110, worker="w@h"),
        ev("succeeded", RUN_A, 150, worker="w@h"),
    ]
    for order in itertools.permutations(events):
        (run,) = fold(order)
        assert (run.status, run.trigger, run.slot, run.instance, run.worker) == (
            "succeeded",
            "schedule",
            90,
            "h:1",
            "w@h",
        )
        assert (run.sent_at_ms, run.started_at_ms, run.finished_at_ms) == (100, 110, 150)


#: Typical fields of each kind of event.
TYPICAL: dict[str, dict[str, object]] = {
    "sent": {"slot": 90, "task_id": RUN_A, "task": "t", "instance": "h:1", "trigger": "schedule"},
    "unsent": {"slot": 90, "task_id": RUN_A, "task": "t", "instance": "h:1", "trigger": "schedule"},
    "running": {"worker": "w"},
    "succeeded": {"worker": "w"},
    "failed": {"worker": "w", "error_type": "ValueError", "error": "boom"},
    "revoked": {"worker": "w", "reason": "expired"},
}


@pytest.mark.parametrize(
    "kinds, status",
    [
        (["sent"], "sent"),
        (["sent", "running"], "running"),
        (["running"], "running"),
        (["sent", "running", "failed"], "failed"),
        (["sent", "revoked"], "revoked"),
        (["sent", "running", "revoked"], "revoked"),
        (["revoked", "running"], "revoked"),  # final, whatever comes after
        (["unsent"], "unsent"),
        (["unsent", "running"], "running"),  # written but unconfirmed, and it ran after all
        (["running", "unsent"], "running"),
        (["unsent", "running", "succeeded"], "succeeded"),
        (["sent", "unsent"], "unsent"),  # one rank: the later one counts
        (["unsent", "sent"], "sent"),
        (["succeeded", "revoked"], "revoked"),
    ],
)
def test_status_table(kinds: list[str], status: str) -> None:
    events = [ev(kind, RUN_A, 100 + i, **TYPICAL[kind]) for i, kind in enumerate(kinds)]
    assert fold(events)[0].status == status


def test_runs_are_newest_first_and_limited() -> None:
    events = [ev("sent", f"r{i}", 1000 + i, trigger="schedule") for i in range(10)]
    runs = fold(events, limit=3)
    assert [r.run_id for r in runs] == ["r9", "r8", "r7"]
    assert fold(events, limit=0) == []


def test_failed_runs_keep_a_truncated_error() -> None:
    (run,) = fold([ev("failed", RUN_B, 5, worker="w", error_type="ValueError", error="x" * 5000)])
    assert run.error_type == "ValueError" and run.error == "x" * MAX_ERROR_CHARS


@pytest.mark.parametrize("reason", REVOKE_REASONS)
def test_a_revoked_run_is_final_and_keeps_its_reason_in_any_order(reason: str) -> None:
    error = "signal 15" if reason == "terminated" else None
    events = [
        ev("sent", RUN_A, 100, slot=90, task_id=RUN_A, task="t", instance="h:1", trigger="schedule"),
        ev("running", RUN_A, 110, worker="w@h"),
        ev("revoked", RUN_A, 150, worker="w@h", reason=reason, error=error),
    ]
    for order in itertools.permutations(events):
        (run,) = fold(order)
        assert (run.status, run.reason, run.error, run.error_type, run.worker) == (
            "revoked",
            reason,
            error,
            None,
            "w@h",
        )
        assert (run.sent_at_ms, run.started_at_ms, run.finished_at_ms) == (100, 110, 150)


def test_an_unsent_run_shows_why_until_it_runs_after_all() -> None:
    unsent = ev(
        "unsent",
        RUN_A,
        100,
        slot=90,
        task_id=RUN_A,
        task="t",
        instance="h:1",
        trigger="schedule",
        error_type="ConnectionError",
        error="x" * 900,
    )
    (run,) = fold([unsent])
    assert (run.status, run.error_type, run.error) == ("unsent", "ConnectionError", "x" * MAX_ERROR_CHARS)
    assert (run.slot, run.task_id, run.task, run.instance, run.trigger) == (90, RUN_A, "t", "h:1", "schedule")
    assert run.sent_at_ms is None and run.reason is None
    running = ev("running", RUN_A, 120, worker="w@h")
    failed = ev("failed", RUN_A, 130, worker="w@h", error_type="ValueError", error="boom")
    for order in itertools.permutations([unsent, running]):
        (run,) = fold(order)
        assert (run.status, run.error_type, run.error, run.worker) == ("running", None, None, "w@h")
    for order in itertools.permutations([unsent, running, failed]):
        (run,) = fold(order)
        assert (run.status, run.error_type, run.error) == ("failed", "ValueError", "boom")


def test_runs_that_were_not_sent_are_ordered_by_their_first_event() -> None:
    events = [
        ev("sent", "r1", 1000, trigger="schedule"),
        ev("unsent", "r2", 2000, trigger="schedule", error_type="E"),
        ev("sent", "r3", 3000, trigger="schedule"),
    ]
    assert [r.run_id for r in fold(events)] == ["r3", "r2", "r1"]


def test_a_revoked_event_needs_a_known_reason() -> None:
    with pytest.raises(ValueError, match="reason is one of"):
        encode_event("revoked", run=RUN_A, job="job", at_ms=1, worker="w")
    with pytest.raises(ValueError, match="reason is one of"):
        encode_event("revoked", run=RUN_A, job="job", at_ms=1, worker="w", reason="cancelled")
    with pytest.raises(ValueError, match="cannot carry \\['worker'\\]"):
        encode_event("unsent", run=RUN_A, job="job", at_ms=1, worker="w")


def test_a_reader_of_the_first_four_kinds_skips_the_new_ones() -> None:
    # What a reader that predates unsent and revoked does: only known kinds are events.
    known = ("sent", "running", "succeeded", "failed")
    body = encode_event("revoked", run=RUN_A, job="job", at_ms=1, worker="w", reason="expired")
    record = json.loads(body)
    assert record["v"] == 1 and record["event"] not in known  # same version, a kind it ignores
    assert decode_event(body) == {
        "v": 1,
        "event": "revoked",
        "run": RUN_A,
        "job": "job",
        "at_ms": 1,
        "worker": "w",
        "reason": "expired",
    }


def test_a_run_sent_twice_names_the_instance_whose_message_started_it() -> None:
    # A slow winner (a) and the backup that took its run over (b) both sent it; the worker ran b's.
    a = ev("sent", RUN_A, 100, slot=1, task_id=RUN_A, task="t", instance="a:1", trigger="schedule")
    b = ev("sent", RUN_A, 90, slot=1, task_id=RUN_A, task="t", instance="b:2", trigger="schedule")
    started = ev("running", RUN_A, 95, worker="w", instance="b:2")
    for events in ([a, b, started], [b, started, a], [started, a, b]):
        [run] = fold(events)
        assert (run.instance, run.sent_at_ms, run.started_at_ms) == ("b:2", 90, 95)
    [run] = fold([b, a])  # not started yet: the last message written
    assert (run.instance, run.sent_at_ms) == ("a:1", 100)
    [run] = fold([a, ev("running", RUN_A, 120, worker="w")])  # a worker of an earlier release
    assert (run.instance, run.sent_at_ms) == ("a:1", 100)


def test_only_known_fields_are_recorded() -> None:
    with pytest.raises(ValueError, match="cannot carry \\['args'\\]"):
        encode_event("sent", run=RUN_A, job="job", at_ms=1, args=(1, 2))
    with pytest.raises(ValueError, match="unknown history event"):
        encode_event("exploded", run=RUN_A, job="job", at_ms=1)


@pytest.mark.parametrize("body", [b"", b"not json", b"[]", b'{"v": 2}', json.dumps({"v": 1, "event": "sent"}).encode()])
def test_foreign_messages_are_ignored(body: bytes) -> None:
    assert decode_event(body) is None


TEXT = st.text(max_size=40)
#: Values of every field an event may carry.
VALUES: dict[str, st.SearchStrategy[object]] = {
    "slot": st.integers(0, 2**53),
    "task_id": TEXT,
    "task": TEXT,
    "instance": TEXT,
    "trigger": st.sampled_from(["schedule", "catch_up", "backfill", "manual"]),
    "coalesced": st.integers(1, 100),
    "count": st.integers(1, 100_000),
    "first_slot": st.integers(0, 2**53),
    "worker": TEXT,
    "error_type": TEXT,
    "error": st.text(max_size=MAX_ERROR_CHARS + 100),
    "reason": st.sampled_from(REVOKE_REASONS),
}
OPTIONAL = {
    "sent": ("slot", "task_id", "task", "instance", "trigger", "coalesced"),
    "unsent": ("slot", "task_id", "task", "instance", "trigger", "coalesced", "error_type", "error"),
    "skipped": ("slot", "instance", "count", "first_slot", "worker"),
    "pending": ("slot", "instance", "worker"),
    "paused": ("slot", "instance"),
    "running": ("worker",),
    "succeeded": ("worker",),
    "failed": ("worker", "error_type", "error"),
    "revoked": ("worker", "error"),
    "abandoned": ("worker", "error_type", "error"),
}
REQUIRED = {"revoked": ("reason",), "skipped": ("reason",)}


def fields_of(event: str) -> st.SearchStrategy[dict[str, object]]:
    """Fields ``event`` may carry: the required ones, some optional ones, some of them None."""
    values = dict(VALUES, reason=st.sampled_from(SKIP_REASONS)) if event == "skipped" else VALUES
    return st.fixed_dictionaries(
        {name: values[name] for name in REQUIRED.get(event, ())},
        optional={name: st.one_of(st.none(), values[name]) for name in OPTIONAL[event]},
    )


@given(
    st.sampled_from(EVENTS).flatmap(lambda event: st.tuples(st.just(event), fields_of(event))),
    st.text(min_size=1, max_size=40),
    st.integers(0, 2**53),
)
def test_the_codec_round_trips(event_fields: tuple[str, dict[str, object]], run: str, at: int) -> None:
    event, fields = event_fields
    decoded = decode_event(encode_event(event, run=run, job="j", at_ms=at, **fields))
    assert decoded is not None
    expected = {k: v for k, v in fields.items() if v is not None}
    if "error" in expected:
        expected["error"] = str(expected["error"])[:MAX_ERROR_CHARS]
    assert decoded == {"v": 1, "event": event, "run": run, "job": "j", "at_ms": at, **expected}
    (folded,) = fold([decoded])
    assert folded.status == event and folded.run_id == run


@st.composite
def one_run(draw: st.DrawFn) -> list[tuple[str, dict[str, object]]]:
    """The events of one run, in rank order, with their fields: at most one of each rank, so that
    no two of them compete and their order cannot matter."""
    ranks = [[None, "pending"], [None, "sent", "unsent"], [None, "running"], [None, "succeeded", "failed", "revoked"]]
    kinds = [kind for kind in (draw(st.sampled_from(rank)) for rank in ranks) if kind]
    return [(kind, draw(fields_of(kind))) for kind in kinds or ["sent"]]


@given(one_run(), st.data())
def test_a_run_folds_the_same_in_any_order_and_with_events_written_twice(
    kinds_fields: list[tuple[str, dict[str, object]]], data: st.DataObject
) -> None:
    events = [ev(kind, RUN_A, 100 + n, **fields) for n, (kind, fields) in enumerate(kinds_fields)]
    (expected,) = fold(events)
    assert expected.status == kinds_fields[-1][0]  # the most advanced
    twice = data.draw(st.lists(st.sampled_from(events), max_size=4))
    assert fold(data.draw(st.permutations(events + twice))) == [expected]


def test_tasks_the_scheduler_did_not_send_are_ignored() -> None:
    from types import SimpleNamespace

    from anarchon_celery.task_run import run_headers_of

    assert run_headers_of(SimpleNamespace(headers=None)) is None
    assert run_headers_of(SimpleNamespace(headers={"other": 1})) is None
    sent = SimpleNamespace(
        headers={
            "anarchon_run": "r",
            "anarchon_job": "j",
            "anarchon_slot": 5,
            "anarchon_trigger": "manual",
            "anarchon_instance": "h:1",
        }
    )
    assert run_headers_of(sent) == {
        "run": "r",
        "job": "j",
        "slot": 5,
        "trigger": "manual",
        "instance": "h:1",
        "place": None,
        "token": None,
        "coalesced": None,
        "overlap": None,
        "history_size": None,
    }
    # Celery may also expose message headers as request attributes.
    as_attributes = SimpleNamespace(
        headers={}, anarchon_run="r", anarchon_job="j", anarchon_slot=5, anarchon_trigger=None
    )
    assert run_headers_of(as_attributes) == {
        "run": "r",
        "job": "j",
        "slot": 5,
        "trigger": None,
        "instance": None,
        "place": None,
        "token": None,
        "coalesced": None,
        "overlap": None,
        "history_size": None,
    }
