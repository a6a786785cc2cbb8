"""History events and their fold into runs: pure, no broker."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from anarchon_celery.history import MAX_ERROR_CHARS, decode_event, encode_event, fold

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


@pytest.mark.parametrize(
    "kinds, status",
    [
        (["sent"], "sent"),
        (["sent", "running"], "running"),
        (["running"], "running"),
        (["sent", "running", "failed"], "failed"),
    ],
)
def test_status_table(kinds: list[str], status: str) -> None:
    events = [ev(kind, RUN_A, 100 + i, **({"worker": "w"} if kind != "sent" else {})) for i, kind in enumerate(kinds)]
    assert fold(events)[0].status == status


def test_runs_are_newest_first_and_limited() -> None:
    events = [ev("sent", f"r{i}", 1000 + i, trigger="schedule") for i in range(10)]
    runs = fold(events, limit=3)
    assert [r.run_id for r in runs] == ["r9", "r8", "r7"]
    assert fold(events, limit=0) == []


def test_failed_runs_keep_a_truncated_error() -> None:
    (run,) = fold([ev("failed", RUN_B, 5, worker="w", error_type="ValueError", error="x" * 5000)])
    assert run.error_type == "ValueError" and run.error == "x" * MAX_ERROR_CHARS


def test_only_known_fields_are_recorded() -> None:
    with pytest.raises(ValueError, match="cannot carry \\['args'\\]"):
        encode_event("sent", run=RUN_A, job="job", at_ms=1, args=(1, 2))
    with pytest.raises(ValueError, match="unknown history event"):
        encode_event("exploded", run=RUN_A, job="job", at_ms=1)


@pytest.mark.parametrize("body", [b"", b"not json", b"[]", b'{"v": 2}', json.dumps({"v": 1, "event": "sent"}).encode()])
def test_foreign_messages_are_ignored(body: bytes) -> None:
    assert decode_event(body) is None


@given(
    st.sampled_from(["sent", "running", "succeeded", "failed"]),
    st.text(min_size=1, max_size=40),
    st.integers(0, 2**53),
    st.one_of(st.none(), st.text(max_size=50)),
)
def test_the_codec_round_trips(event: str, run: str, at: int, worker: str | None) -> None:
    fields = {} if event == "sent" else {"worker": worker}
    decoded = decode_event(encode_event(event, run=run, job="j", at_ms=at, **fields))
    assert decoded is not None
    assert (decoded["event"], decoded["run"], decoded["at_ms"], decoded.get("worker")) == (
        event,
        run,
        at,
        fields.get("worker"),
    )


def test_tasks_the_scheduler_did_not_send_are_ignored() -> None:
    from types import SimpleNamespace

    from anarchon_celery.signals import run_headers_of

    assert run_headers_of(SimpleNamespace(headers=None)) is None
    assert run_headers_of(SimpleNamespace(headers={"other": 1})) is None
    sent = SimpleNamespace(
        headers={"anarchon_run": "r", "anarchon_job": "j", "anarchon_slot": 5, "anarchon_trigger": "manual"}
    )
    assert run_headers_of(sent) == {"run": "r", "job": "j", "slot": 5, "trigger": "manual"}
    # Celery may also expose message headers as request attributes.
    as_attributes = SimpleNamespace(
        headers={}, anarchon_run="r", anarchon_job="j", anarchon_slot=5, anarchon_trigger=None
    )
    assert run_headers_of(as_attributes) == {"run": "r", "job": "j", "slot": 5, "trigger": None}
