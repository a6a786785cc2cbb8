"""The runs a scheduler sends on a backend with leases beyond the runs it claims as they come due:
those of the gaps its claims find (:mod:`.catching_up`) and those kept pending whose job is free
again (:mod:`.overlapping`); and the history of the runs it does not send (skipped, pending,
abandoned)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from . import clock
from .backends import Backend, Claim, Outcome
from .backends.base import CATCH_UP
from .catching_up import CatchUps
from .jobs import Job
from .overlapping import Overlaps
from .sending import Outgoing

__all__ = ["StoreRuns"]

#: How a scheduler makes a run's task: ``outgoing(claim, now, token, coalesced, trigger)``.
MakeOutgoing = Callable[..., Outgoing]


class StoreRuns:
    """One scheduler's catch-up and overlap protection on a backend with leases."""

    def __init__(self, jobs: Mapping[str, Job], instance: str, backend: Backend) -> None:
        store = backend.lease_store
        assert store is not None, "a backend with leases"
        self.backend, self.store = backend, store
        self.catch_ups = CatchUps(jobs, instance, backend.prefix)
        self.overlaps = Overlaps(jobs, instance, backend.prefix)

    def after_claims(self, claims: list[Claim], outcomes: list[Outcome], outgoing: MakeOutgoing) -> list[Outgoing]:
        """After a claim call: the runs of the gaps its wins found, to send; the wins not sent
        (their job busy) and the runs freed, noted for history."""
        overlapped = self.store.overlapped()  # (a catch-up claim not sent: its job busy)
        won_late = [c for c, o in zip(claims, outcomes) if o is Outcome.WON and c.kind == CATCH_UP]
        not_sent = {(item.claim.job, item.claim.slot) for item in overlapped}
        runs = self.catch_ups.runs(self.backend, won_late, outgoing, not_sent)
        self.overlaps.note(overlapped + self.store.overlapped(), self.store.freed())
        return runs

    def pending(self, outgoing: MakeOutgoing) -> list[Outgoing]:
        """The runs kept pending (``buffer_one``, ``buffer_all``) whose job is free again, now held
        by this instance: to send, with trigger ``buffered``."""
        taken = self.overlaps.take_pending(self.store)
        now = clock.now_ms()
        return [outgoing(claim, now, token, trigger="buffered") for claim, token in taken]

    def events(self) -> list[tuple[str, bytes, int]]:
        """The history events of the runs not sent, since the last call."""
        return self.catch_ups.skipped() + self.overlaps.events()

    def jobs_changed(self) -> None:
        """Runtime jobs changed (their policies with them)."""
        self.overlaps.jobs_changed()

    def wait_s(self) -> float | None:
        """How soon to look for pending runs again (None: no job keeps any)."""
        return self.overlaps.wait_s()
