"""A store's outages as one instance's calls meet them (pure: a clock of the test's own): when
one starts and ends, and how long the store has left a call unanswered (what readiness reads)."""

from __future__ import annotations

import contextlib
import logging

import pytest

from anarchon_celery.backends import outages
from anarchon_celery.backends.outages import LATE_ANSWER_S, Outages


class Gone(Exception):
    """The store's error."""


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(outages.time, "monotonic", fake)
    return fake


def _store() -> Outages:
    return Outages(lambda: "Redis at redis://h:6379/0", lambda: (Gone,), lambda: 60.0)


def _call(store: Outages, clock: Clock, takes_s: float, *, fails: bool, what: str | None = "read") -> None:
    with pytest.raises(Gone) if fails else contextlib.nullcontext(), store.asking(what):
        clock.now += takes_s
        if fails:
            raise Gone("no answer")


def test_a_call_left_unanswered_is_counted_from_its_start_and_starts_the_outage(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="anarchon_celery")
    store = _store()
    with pytest.raises(Gone), store.asking("read the instances' announcements"):
        clock.now += 3.0
        assert store.unanswered_s() == 3.0  # (read by the probe's thread meanwhile)
        clock.now += 2.0
        raise Gone("Timeout reading")
    assert store.since == 1_000.0  # the call's start, not its end
    _call(store, clock, 5.0, fails=True)  # still away: the outage goes on, from the first call
    assert store.since == 1_000.0
    clock.now += 10.0
    _call(store, clock, 0.1, fails=False)
    assert store.since is None and store.unanswered_s() == 0.0
    assert "cannot read the instances' announcements (Gone: Timeout reading); no answer for 5.0s" in caplog.text
    assert "is back after 20.1s" in caplog.text


def test_a_quick_failure_of_a_read_is_no_outage_and_a_slow_answer_is_told(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    store = _store()
    _call(store, clock, 0.01, fails=True)  # a connection reset once: the caller logs it
    assert store.since is None
    _call(store, clock, 0.01, fails=False)
    assert store.unanswered_s() == 0.0
    _call(store, clock, LATE_ANSWER_S + 1, fails=False)
    assert store.since is None
    assert "answered after 3.0s without an answer" in caplog.text


def test_an_outage_a_claim_failed_in_ends_only_when_a_claim_is_answered(clock: Clock) -> None:
    """A store that answers reads and refuses claims (a read-only replica, out of memory): the
    reads answered do not end the outage."""
    store = _store()
    _call(store, clock, 0.01, fails=True, what=None)  # a claim, then once more on a new connection
    store.failed("decide claims", Gone("READONLY"), claims=True)
    for _ in range(3):
        _call(store, clock, 0.01, fails=False)  # the loop's reads, answered
        assert store.since is not None
    _call(store, clock, 0.01, fails=False, what=None)  # a claim answered
    store.recovered()
    assert store.since is None


def test_history_written_by_a_worker_starts_no_outage(clock: Clock) -> None:
    store = _store()
    _call(store, clock, 10.0, fails=True, what=None)
    assert store.since is None
    assert store.unanswered_s() == 10.0  # unanswered until the store next answers
