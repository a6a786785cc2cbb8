"""The decision of the stores that keep a cursor per job (SQLite, PostgreSQL; Redis's script does
the same in Lua): pure, so that each store only reads the cursors and writes what changed, inside
its own transaction.

A claim is decided on the store's clock ``now``: past its deadline, it is not made (UNDECIDED);
before its slot, it is EARLY (by how much is returned, so a claim a little early can wait); at or
below its job's cursor, the run was decided already (LOST); otherwise it is WON and the cursor
moves to its slot. Each job's claims are decided in slot order, whatever order they came in.
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import Claim, Outcome

__all__ = ["decide"]


def decide(claims: Sequence[Claim], now_ms: int, cursors: dict[str, int | None]) -> list[tuple[Outcome, int]]:
    """Each claim's outcome, with the milliseconds it is early by (EARLY) or late by past its
    deadline (UNDECIDED), else 0. ``cursors`` (job: latest slot decided, None: none yet) is
    updated in place with the wins."""
    results: list[tuple[Outcome, int]] = [(Outcome.UNDECIDED, 0)] * len(claims)
    for i in sorted(range(len(claims)), key=lambda i: (claims[i].job, claims[i].slot)):
        claim = claims[i]
        if claim.deadline_ms is not None and now_ms > claim.deadline_ms:
            results[i] = (Outcome.UNDECIDED, now_ms - claim.deadline_ms)
        elif now_ms < claim.slot:
            results[i] = (Outcome.EARLY, claim.slot - now_ms)
        elif (cursor := cursors.get(claim.job)) is not None and cursor >= claim.slot:
            results[i] = (Outcome.LOST, 0)
        else:
            cursors[claim.job] = claim.slot
            results[i] = (Outcome.WON, 0)
    return results
