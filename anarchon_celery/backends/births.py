"""When each job came to be, as every backend keeps it: the earliest moment an instance knew the
job (its start, for a job of its code; the change that made a runtime job). An instance that
starts claims the runs still within their lateness, so that a run every instance missed (a deploy
that stopped them all) is sent by the first one back; a run from before its job existed is not
such a run, and is never claimed (a new deployment, a job added to the code, jobs imported).

The store keeps the first moment told, lowered by any earlier one told later (two instances that
start together). Pure: the stores read what they keep, apply :func:`born`, and write it back in one
atomic step (RabbitMQ: in the order of its control log, which every instance reads alike).
"""

from __future__ import annotations

__all__ = ["born"]


def born(kept: int | None, cursor: int | None, since: int) -> int:
    """When a job came to be, once an instance that knew it from ``since`` (epoch milliseconds)
    says so: ``kept``, the moment the store keeps (None: none yet), or ``since`` if earlier. A job
    kept from before births were (a release that kept none) has a cursor but no birth: it existed
    at its cursor's slot at the latest."""
    if kept is not None:
        return min(kept, since)
    if cursor is not None:
        return min(cursor, since)
    return since
