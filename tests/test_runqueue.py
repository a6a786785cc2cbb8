"""The run queue: pure, property-tested (no broker, no clock)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from anarchon_celery.runqueue import BackupTry, ClaimAgain, FirstClaim, Item, RunQueue

times = st.integers(min_value=0, max_value=10_000)
jobs = st.sampled_from(["a", "b", "c"])
slots = st.integers(min_value=0, max_value=5).map(lambda n: n * 1000)

items: st.SearchStrategy[Item] = st.one_of(
    st.builds(FirstClaim, times, jobs, slots),
    st.builds(ClaimAgain, times, jobs, slots, times),
    st.builds(BackupTry, times, jobs, slots, times, st.integers(min_value=1, max_value=3)),
)


@given(st.lists(items, max_size=40), times, st.integers(min_value=1, max_value=50))
def test_take_gives_what_is_due_first_due_first_and_ties_in_the_order_pushed(
    pushed: list[Item], now: int, limit: int
) -> None:
    queue = RunQueue(pushed)
    taken = queue.take(now, limit)
    order = {id(item): n for n, item in enumerate(pushed)}
    due = sorted((item for item in pushed if item.due_ms <= now), key=lambda item: (item.due_ms, order[id(item)]))
    assert taken == due[:limit]
    assert [id(item) for item in taken] == [id(item) for item in due[:limit]]
    assert len(queue) == len(pushed) - len(taken)
    assert queue.is_due(now) == (len(due) > limit)
    rest = sorted(queue, key=lambda item: item.due_ms)
    assert sorted(taken + rest, key=id) == sorted(pushed, key=id)  # nothing lost, nothing twice
    first = min((item.due_ms for item in rest), default=None)
    assert queue.next_ms() == first
    assert queue.wait_s(now) == (None if first is None else max(0.0, (first - now) / 1000))


@given(st.lists(items, max_size=40), st.lists(times, max_size=5))
def test_has_backups_says_whether_a_backup_try_is_queued(pushed: list[Item], takes: list[int]) -> None:
    queue = RunQueue(pushed)
    for now in takes:
        queue.take(now, 3)
        assert queue.has_backups() == any(isinstance(item, BackupTry) for item in queue)


@given(
    st.lists(items, max_size=40),
    st.sets(st.tuples(jobs, slots), max_size=6),
    times,
    st.integers(min_value=0, max_value=1000),
)
def test_hurry_brings_forward_only_the_backup_tries_of_the_runs_handed_back(
    pushed: list[Item], handed: set[tuple[str, int]], now: int, stagger: int
) -> None:
    queue = RunQueue(pushed)
    hurried = queue.hurry(handed, now, stagger)
    expected = [item for item in pushed if isinstance(item, BackupTry) and (item.job, item.slot) in handed]
    assert sorted(hurried, key=id) == sorted(expected, key=id)
    after = list(queue)
    assert len(after) == len(pushed)
    assert queue.has_backups() == any(isinstance(item, BackupTry) for item in pushed)
    kept = [item for item in pushed if item not in expected or not isinstance(item, BackupTry)]
    for item in kept:
        assert item in after
    for item in expected:
        assert BackupTry(now + (item.rank - 1) * stagger, item.job, item.slot, item.planned_ms, item.rank) in after
    taken = queue.take(20_000, len(after))
    assert [item.due_ms for item in taken] == sorted(item.due_ms for item in taken)


def test_a_first_claim_is_planned_when_it_is_due() -> None:
    assert FirstClaim(1_500, "a", 1_000).planned_ms == 1_500
    assert ClaimAgain(2_500, "a", 1_000, 1_500).planned_ms == 1_500
