"""The decision of the cursor stores (SQLite, PostgreSQL; Redis's script mirrors it), without a
store: a table of cases, and properties over any claims in any order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from anarchon_celery import Claim, Outcome
from anarchon_celery.backends.ordered import decide

NOW = 1_000_000
KEPT_MS = 300_000


def test_each_rule_of_a_claim() -> None:
    cursors: dict[str, int | None] = {"old": 900_000}
    recorded = {("old", 850_000), ("old", 900_000)}
    claims = [
        Claim("late", 900_000, deadline_ms=NOW - 250),  # past its deadline on the store's clock
        Claim("ahead", NOW + 1_500),  # not due yet on the store's clock
        Claim("old", 850_000),  # decided already: it has a record
        Claim("old", 900_000),
        Claim("old", 600_000),  # passed over by the cursor longer ago than records surely last
        Claim("old", 880_000),  # passed over, without a record: never decided, won now
        Claim("old", 950_000),  # past the cursor: won, the cursor moves
        Claim("new", NOW),  # a job never decided: won
    ]
    assert decide(claims, NOW, cursors, recorded, KEPT_MS) == [
        (Outcome.UNDECIDED, 250),
        (Outcome.EARLY, 1_500),
        (Outcome.LOST, 0),
        (Outcome.LOST, 0),
        (Outcome.LOST, 0),
        (Outcome.WON, 0),
        (Outcome.WON, 0),
        (Outcome.WON, 0),
    ]
    assert cursors == {"old": 950_000, "new": NOW}


def test_a_jobs_runs_are_decided_in_slot_order_whatever_the_order_given() -> None:
    cursors: dict[str, int | None] = {}
    claims = [Claim("job", 3), Claim("job", 1), Claim("job", 2), Claim("job", 2)]
    assert [outcome for outcome, _ in decide(claims, NOW, cursors, set(), KEPT_MS)] == [Outcome.WON] * 3 + [
        Outcome.LOST
    ]
    assert cursors == {"job": 3}


def test_runs_claimed_newest_first_after_an_outage_are_each_won_once() -> None:
    """Instances back from a store outage claim the runs due meanwhile each in its own order: a
    later run claimed first moves the cursor past the earlier ones, which are still won, once."""
    first, second, third, fourth = (NOW - 4_000, NOW - 3_000, NOW - 2_000, NOW - 1_000)
    cursors: dict[str, int | None] = {"job": first}
    recorded = {("job", first)}
    assert decide([Claim("job", fourth)], NOW, cursors, recorded, KEPT_MS) == [(Outcome.WON, 0)]
    recorded.add(("job", fourth))
    older = [Claim("job", third), Claim("job", second)]
    assert decide(older, NOW, cursors, recorded, KEPT_MS) == [(Outcome.WON, 0)] * 2
    recorded |= {("job", second), ("job", third)}
    assert cursors == {"job": fourth}  # never back
    # Another instance's claims of the same runs, in yet another order: all decided.
    again = [Claim("job", third), Claim("job", fourth), Claim("job", second)]
    assert decide(again, NOW, cursors, recorded, KEPT_MS) == [(Outcome.LOST, 0)] * 3


def test_a_run_whose_record_is_gone_is_not_won_again_on_a_clock_stepped_back() -> None:
    """Won, its record forgotten, the cursor past it; then a failover to a store whose clock is
    behind: the run is still decided, though its slot is less than ``KEPT_MS`` before that clock."""
    cursors: dict[str, int | None] = {}
    assert decide([Claim("job", 10_000)], 10_000, cursors, set(), KEPT_MS) == [(Outcome.WON, 0)]
    assert decide([Claim("job", 300_000)], 320_000, cursors, set(), KEPT_MS) == [(Outcome.WON, 0)]
    # The record of slot 10_000 was forgotten at 310_000; the new store's clock reads 200_000.
    assert decide([Claim("job", 10_000)], 200_000, cursors, {("job", 300_000)}, KEPT_MS) == [(Outcome.LOST, 0)]


_claims = st.lists(
    st.builds(Claim, st.sampled_from(["a", "b", "c"]), st.integers(0, 30), st.none() | st.integers(0, 40)),
    max_size=12,
)
#: How long a record is kept in the property below, and how far the store's clock may step back
#: (a failover to a server whose clock is behind): less than half of it.
_KEPT = 20
_STEP_BACK = _KEPT // 2 - 1


@settings(max_examples=500)
@given(st.lists(st.tuples(_claims, st.integers(0, 60)), max_size=10), st.booleans())
def test_no_run_is_ever_won_twice_and_no_cursor_goes_back(
    batches: list[tuple[list[Claim], int]], forward_only: bool
) -> None:
    """Batches from any instances, in any order, on a store that forgets each record ``_KEPT``
    after its win and whose clock may step back (a failover) by less than half of that: a run is
    won at most once, never before its slot or after its deadline, and a cursor only moves
    forward."""
    cursors: dict[str, int | None] = {}
    won: set[tuple[str, int]] = set()
    records: dict[tuple[str, int], int] = {}  # run: the store's time of its win
    latest = 0
    for claims, proposed in batches:
        # The clock: forward, or back by at most _STEP_BACK from the latest time seen.
        now = max(proposed, latest) if forward_only else max(proposed, latest - _STEP_BACK)
        latest = max(latest, now)
        for key in [key for key, at in records.items() if latest - at >= _KEPT]:
            del records[key]  # forgotten on the latest clock: a clock stepping back brings none back
        before = dict(cursors)
        for claim, (outcome, amount) in zip(claims, decide(claims, now, cursors, set(records), _KEPT)):
            key = (claim.job, claim.slot)
            if outcome is Outcome.WON:
                assert key not in won
                assert claim.slot <= now and (claim.deadline_ms is None or now <= claim.deadline_ms)
                won.add(key)
                records[key] = now
            assert amount >= 0
        for job, cursor in before.items():
            assert cursors[job] is not None and cursor is not None and cursors[job] >= cursor


@given(st.lists(st.integers(0, 9), min_size=1, max_size=30))
def test_every_run_claimed_within_half_the_records_life_is_won_once_whatever_the_order(order: list[int]) -> None:
    """The runs of a store outage claimed in any order once it is back: each is won, once."""
    cursors: dict[str, int | None] = {}
    recorded: set[tuple[str, int]] = set()
    wins = 0
    for slot in order:
        ((outcome, _),) = decide([Claim("job", slot * 10)], 100, cursors, recorded, 1_000)
        if outcome is Outcome.WON:
            wins += 1
            recorded.add(("job", slot * 10))
    assert wins == len(set(order))


def test_the_runs_missed_in_an_outage_are_counted_and_the_first_named() -> None:
    from anarchon_celery.backends.base import MissedRuns

    missed = MissedRuns()
    assert str(missed) == "0 run(s) were not claimed meanwhile"
    missed.add("a", [1, 2])
    missed.add("b", [5])
    assert str(missed) == (
        "3 run(s) were not claimed meanwhile (their deadline passed): job 'a' slots 1, 2; job 'b' slot 5"
    )
    missed.add("c", list(range(100)))
    assert missed.count == 103
    assert str(missed).endswith("job 'c' slots 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16 and 83 more")
