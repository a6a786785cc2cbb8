"""The decision of the cursor stores (SQLite, PostgreSQL; Redis's script mirrors it), without a
store: a table of cases, and properties over any claims in any order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from anarchon_celery import Claim, Outcome
from anarchon_celery.backends.ordered import decide

NOW = 1_000_000


def test_each_rule_of_a_claim() -> None:
    cursors: dict[str, int | None] = {"old": 500_000}
    claims = [
        Claim("late", 900_000, deadline_ms=NOW - 250),  # past its deadline on the store's clock
        Claim("ahead", NOW + 1_500),  # not due yet on the store's clock
        Claim("old", 400_000),  # at or below the cursor: decided already
        Claim("old", 500_000),
        Claim("old", 600_000),  # past it: won, the cursor moves
        Claim("new", NOW),  # a job never decided: won
    ]
    assert decide(claims, NOW, cursors) == [
        (Outcome.UNDECIDED, 250),
        (Outcome.EARLY, 1_500),
        (Outcome.LOST, 0),
        (Outcome.LOST, 0),
        (Outcome.WON, 0),
        (Outcome.WON, 0),
    ]
    assert cursors == {"old": 600_000, "new": NOW}


def test_a_jobs_runs_are_decided_in_slot_order_whatever_the_order_given() -> None:
    cursors: dict[str, int | None] = {}
    claims = [Claim("job", 3), Claim("job", 1), Claim("job", 2), Claim("job", 2)]
    assert [outcome for outcome, _ in decide(claims, NOW, cursors)] == [Outcome.WON] * 3 + [Outcome.LOST]
    assert cursors == {"job": 3}


_claims = st.lists(
    st.builds(Claim, st.sampled_from(["a", "b", "c"]), st.integers(0, 30), st.none() | st.integers(0, 40)),
    max_size=12,
)


@given(st.lists(st.tuples(_claims, st.integers(0, 40)), max_size=8))
def test_no_run_is_ever_won_twice_and_no_cursor_goes_back(batches: list[tuple[list[Claim], int]]) -> None:
    """Batches from any instances, each on a store clock that may even go back (a store failover):
    a run is won at most once, never before its slot or after its deadline, and a cursor only
    moves forward."""
    cursors: dict[str, int | None] = {}
    won: set[tuple[str, int]] = set()
    for claims, now in batches:
        before = dict(cursors)
        for claim, (outcome, amount) in zip(claims, decide(claims, now, cursors)):
            if outcome is Outcome.WON:
                assert (claim.job, claim.slot) not in won
                assert claim.slot <= now and (claim.deadline_ms is None or now <= claim.deadline_ms)
                won.add((claim.job, claim.slot))
            assert amount >= 0
        for job, cursor in before.items():
            assert cursors[job] is not None and cursor is not None and cursors[job] >= cursor
