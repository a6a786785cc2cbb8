"""The decision of the stores that keep a cursor per job (SQLite, PostgreSQL; Redis's script does
the same in Lua): pure, so that each store only reads the cursors and the runs' records and writes
what changed, inside its own transaction.

A claim is decided on the store's clock ``now``: past its deadline, it is not made (UNDECIDED);
before its slot, it is EARLY (by how much is returned, so a claim a little early can wait); a run
with a record was decided already (LOST). Otherwise it is WON, and its job's cursor moves up to its
slot, unless the cursor is past it already: then the run is won only while a record of it, had it
been won, would surely still be kept (:func:`passed_over_kept`). A run the cursor passed over
without deciding it (a later run of the job was claimed first: instances claiming the runs due
during a store outage, once it is back, each in its own order) is thus still won once, and a run
whose record is gone can never be won again, however late an instance comes.

Each job's claims in one call are decided in slot order, whatever order they came in.

Catch-up rides on the same cursor: a win that moves it up past runs nobody decided (every
instance was down, frozen, or cut off from the store) leaves a gap, which is the winner's alone,
since the cursor moves once; the scheduler works out the runs inside it from the job's schedule.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from .base import CATCH_UP, GAP, Claim, Outcome
from .pauses import Pause

__all__ = ["decide", "decide_current", "end_expired_pauses", "passed_over_kept", "resumed_cursor", "set_paused"]


def passed_over_kept(slot: int, now_ms: int, kept_ms: int) -> bool:
    """Whether a run at ``slot`` that its job's cursor has passed may still be won at ``now_ms``:
    during the first half of ``kept_ms`` (``slot_ttl_ms``) after its slot. A record is kept
    ``kept_ms`` from its win, which comes at its slot or later, so a run won then still has its
    record, even on a store whose clock stepped back (a failover) by less than the other half."""
    return now_ms - slot < kept_ms // 2


def decide(
    claims: Sequence[Claim],
    now_ms: int,
    cursors: dict[str, int | None],
    recorded: Collection[tuple[str, int]],
    kept_ms: int,
    keys: dict[str, str] | None = None,
    gaps: dict[int, int] | None = None,
) -> list[tuple[Outcome, int]]:
    """Each claim's outcome, with the milliseconds it is early by (EARLY) or late by past its
    deadline (UNDECIDED), else 0. ``cursors`` (job: latest slot decided, None: none yet) is
    updated in place with the wins; ``recorded`` holds the runs ``(job, slot)`` among the claims'
    that have a record; ``kept_ms`` is how long a record is kept after its win. A WON is a new
    win: its run had no record.

    ``keys`` (job: the :attr:`Claim.key` kept with its cursor, ``""`` when none) is updated in
    place as the cursors are; ``gaps`` receives, by claim index, the cursor a win moved up from
    when the claim's key was the one kept (the gap is the winner's to catch up).

    The claims of catch-up (:data:`.base.CATCH_UP`): a run found past its lateness is won only
    when its job's cursor is below it with the same key; a job seen for the first time, or whose
    key changed, catches nothing up: its cursor moves up to the run and its key is kept, with no
    win. A claim of :data:`.base.GAP` (a run inside a gap its instance won) is won unless the run
    was decided already."""
    results: list[tuple[Outcome, int]] = [(Outcome.UNDECIDED, 0)] * len(claims)
    won: set[tuple[str, int]] = set()
    keys = {} if keys is None else keys
    gaps = {} if gaps is None else gaps
    for i in sorted(range(len(claims)), key=lambda i: (claims[i].job, claims[i].slot)):
        claim = claims[i]
        key = (claim.job, claim.slot)
        cursor = cursors.get(claim.job)
        if claim.deadline_ms is not None and now_ms > claim.deadline_ms:
            results[i] = (Outcome.UNDECIDED, now_ms - claim.deadline_ms)
        elif now_ms < claim.slot:
            results[i] = (Outcome.EARLY, claim.slot - now_ms)
        elif key in recorded or key in won:
            results[i] = (Outcome.LOST, 0)
        elif claim.kind == GAP:
            won.add(key)
            results[i] = (Outcome.WON, 0)
        elif claim.kind == CATCH_UP:
            if cursor is None or keys.get(claim.job, "") != claim.key:
                keys[claim.job] = claim.key  # nothing from before the job was seen, or changed
                cursors[claim.job] = claim.slot if cursor is None else max(cursor, claim.slot)
                results[i] = (Outcome.LOST, 0)
            elif cursor >= claim.slot:
                results[i] = (Outcome.LOST, 0)  # decided, or inside the gap of another win
            else:
                won.add(key)
                gaps[i] = cursor
                cursors[claim.job] = claim.slot
                results[i] = (Outcome.WON, 0)
        elif cursor is not None and cursor >= claim.slot and not passed_over_kept(claim.slot, now_ms, kept_ms):
            results[i] = (Outcome.LOST, 0)  # its record, if it had one, may be gone
        else:
            won.add(key)
            if cursor is None or cursor < claim.slot:
                if claim.key and cursor is not None and keys.get(claim.job, "") == claim.key:
                    gaps[i] = cursor
                keys[claim.job] = claim.key
            cursors[claim.job] = claim.slot if cursor is None else max(cursor, claim.slot)
            results[i] = (Outcome.WON, 0)
    return results


def resumed_cursor(cursor: int | None, at_ms: int) -> int | None:
    """A job's cursor once the job resumes at ``at_ms``: moved up to it, so that catch-up finds
    no gap over the runs due while it was paused (a job without a cursor keeps none)."""
    return None if cursor is None else max(cursor, at_ms)


def end_expired_pauses(pauses: dict[str, Pause], cursors: dict[str, int | None], now_ms: int) -> list[str]:
    """The jobs whose pause ran out (its ``until_ms`` passed by ``now_ms``): taken out of
    ``pauses``, each job's cursor in ``cursors`` moved up to its resume (see
    :func:`resumed_cursor`). Called before :func:`decide`."""
    ended = [job for job, pause in pauses.items() if not pause.in_effect(now_ms)]
    for job in ended:
        until = pauses.pop(job).until_ms
        assert until is not None
        if job in cursors:
            cursors[job] = resumed_cursor(cursors[job], until)
    return ended


def set_paused(
    claims: Sequence[Claim], results: list[tuple[Outcome, int]], pauses: Mapping[str, Pause], gaps: dict[int, int]
) -> list[int]:
    """After :func:`decide`: each win of a paused job (``pauses``: those in effect) becomes
    :attr:`Outcome.PAUSED`, leaving no gap to catch up; returns their indexes."""
    paused = [i for i, (outcome, _) in enumerate(results) if outcome is Outcome.WON and claims[i].job in pauses]
    for i in paused:
        results[i] = (Outcome.PAUSED, 0)
        gaps.pop(i, None)
    return paused


def decide_current(
    claims: Sequence[Claim],
    versions: Mapping[str, int],
    now_ms: int,
    cursors: dict[str, int | None],
    recorded: Collection[tuple[str, int]],
    kept_ms: int,
    keys: dict[str, str] | None = None,
    gaps: dict[int, int] | None = None,
) -> list[tuple[Outcome, int]]:
    """:func:`decide`, but a claim made under another version of its runtime job than the one kept
    (``versions``: each runtime job's, by name; a claim's version 0 is a job defined in code) is
    :attr:`Outcome.STALE`, and moves nothing."""
    live = [i for i, c in enumerate(claims) if not c.version or versions.get(c.job) == c.version]
    found: dict[int, int] = {}
    decided = decide([claims[i] for i in live], now_ms, cursors, recorded, kept_ms, keys, found)
    results: list[tuple[Outcome, int]] = [(Outcome.STALE, 0)] * len(claims)
    for k, i in enumerate(live):
        results[i] = decided[k]
    if gaps is not None:
        gaps.update({live[k]: after for k, after in found.items()})
    return results
