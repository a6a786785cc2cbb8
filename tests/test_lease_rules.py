"""The rules of a run's lease (anarchon_celery.backends.leases), without a store: tables, and
properties over any sequence of what instances and workers may do."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from anarchon_celery.backends import leases
from anarchon_celery.backends.leases import CLAIMED, SENT, STARTED, RunRecord


def record(**changes: Any) -> RunRecord:
    fields: dict[str, Any] = dict(holder="a", token=1, state=CLAIMED, lease_end_ms=1_000, deadline_ms=10_000)
    fields.update(changes)
    return RunRecord(**fields)


@pytest.mark.parametrize(
    "run, instance, now, expected",
    [
        (None, "b", 2_000, ("done", 0)),  # no record: nothing to take over
        (record(state=SENT), "b", 2_000, ("done", 0)),
        (record(state=STARTED), "b", 2_000, ("done", 0)),
        (record(), "b", 999, ("held", 1)),
        (record(), "b", 1_000, ("won", 2)),  # the lease ends at lease_end_ms
        (record(), "b", 10_000, ("won", 2)),  # at the deadline, still in time
        (record(), "b", 10_001, ("late", 1)),
        (record(deadline_ms=None), "b", 10**12, ("won", 2)),
        (record(holder="b", token=2), "b", 500, ("won", 2)),  # its own takeover, asked again
        (record(holder="b", token=2), "c", 500, ("held", 500)),
        (record(lease_end_ms=0), "b", 2_000, ("done", 0)),  # won before leases: its task has no token
    ],
)
def test_take_over(run: RunRecord | None, instance: str, now: int, expected: tuple[str, int]) -> None:
    assert leases.take_over(run, instance, now, lease_ms=5_000) == expected
    if expected[0] == "won" and run is not None:
        assert run.holder == instance and run.token == expected[1]


def test_a_takeover_holds_the_run_for_a_new_lease() -> None:
    run = record()
    assert leases.take_over(run, "b", 2_000, lease_ms=5_000) == ("won", 2)
    assert run.lease_end_ms == 7_000 and run.state == CLAIMED


@pytest.mark.parametrize(
    "run, wanted, now, expected, backups",
    [
        (None, 2, 0, None, None),
        (record(), 0, 0, None, 0),
        (record(), 2, 400, (1, 600), 1),
        (record(backups=1), 2, 400, (2, 600), 2),
        (record(backups=2), 2, 400, None, 2),
        (record(), 2, 1_500, (1, 0), 1),  # the lease has run out already: at once
        (record(state=SENT), 2, 400, None, 0),
        (record(), 2, 10_001, None, 0),  # past the deadline: no backup could act
        (record(lease_end_ms=0), 2, 400, None, 0),  # won before leases
    ],
)
def test_arm(
    run: RunRecord | None, wanted: int, now: int, expected: tuple[int, int] | None, backups: int | None
) -> None:
    assert leases.arm(run, wanted, now) == expected
    if run is not None:
        assert run.backups == backups


@pytest.mark.parametrize(
    "run, token, expected, state",
    [
        (None, 1, False, None),
        (record(), 1, True, SENT),
        (record(), 2, False, CLAIMED),
        (record(token=2), 1, False, CLAIMED),
        (record(state=STARTED), 1, True, STARTED),  # the worker was quicker: still ours, sent
        (record(state=SENT), 1, True, SENT),
    ],
)
def test_mark_sent(run: RunRecord | None, token: int, expected: bool, state: str | None) -> None:
    assert leases.mark_sent(run, token) is expected
    if run is not None:
        assert run.state == state


@pytest.mark.parametrize(
    "run, token, redelivered, expected",
    [
        (None, 1, False, None),
        (record(), 1, False, True),
        (record(state=SENT), 1, False, True),
        (record(token=2), 1, False, False),
        (record(state=STARTED), 1, False, False),
        (record(state=STARTED), 1, True, True),
        (record(state=STARTED, token=2), 1, True, False),
    ],
)
def test_start(run: RunRecord | None, token: int, redelivered: bool, expected: bool | None) -> None:
    assert leases.start(run, token, redelivered) is expected


@pytest.mark.parametrize(
    "run, instance, token, expected, lease_end",
    [
        (record(), "a", 1, True, 500),
        (record(lease_end_ms=300), "a", 1, True, 300),  # ran out already: left as it is
        (record(), "b", 1, False, 1_000),
        (record(token=2), "a", 1, False, 1_000),
        (record(state=SENT), "a", 1, False, 1_000),
    ],
)
def test_hand_back(run: RunRecord, instance: str, token: int, expected: bool, lease_end: int) -> None:
    assert leases.hand_back(run, instance, token, 500) is expected
    assert run.lease_end_ms == lease_end


_INSTANCES = ("a", "b", "c")
_steps = st.lists(
    st.one_of(
        st.tuples(st.just("take_over"), st.sampled_from(_INSTANCES), st.integers(0, 3_000)),
        st.tuples(st.just("mark_sent"), st.integers(1, 4), st.integers(0, 3_000)),
        st.tuples(st.just("start"), st.integers(1, 4), st.booleans()),
        st.tuples(st.just("hand_back"), st.sampled_from(_INSTANCES), st.integers(1, 4)),
        st.tuples(st.just("wait"), st.integers(0, 2_000), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=500, deadline=None)
@given(_steps)
def test_whatever_happens_a_run_starts_once_and_tokens_only_grow(steps: list[tuple[str, Any, Any]]) -> None:
    """However instances and workers interleave (the store makes each step atomic): each token
    has one holder, tokens grow one at a time, a run is taken over only after its lease ran out
    and before it started, and it starts at most once (deliveries made again aside)."""
    now = 0
    run = RunRecord("a", 1, CLAIMED, 1_000, 100_000)
    holders = {1: "a"}
    starts = 0
    for action, first, second in steps:
        if action == "wait":
            now += first
        elif action == "take_over":
            before = (run.token, run.state, run.lease_end_ms, run.holder)
            kind, value = leases.take_over(run, first, now, 1_000)
            if kind == "won" and value != before[0]:
                assert before[1] == CLAIMED and now >= before[2]
                assert value == before[0] + 1 and value not in holders
                holders[value] = first
            elif kind == "won":
                assert before[3] == first  # its own, asked again
        elif action == "mark_sent":
            assert leases.mark_sent(run, first) is (first == run.token)
        elif action == "start":
            token, redelivered = first, second
            allowed = leases.start(run, token, redelivered)
            if allowed and not redelivered:
                starts += 1
                assert token == run.token
        else:
            leases.hand_back(run, first, second, now)
        assert holders[run.token] == run.holder
    assert starts <= 1
