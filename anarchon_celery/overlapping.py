"""Overlap protection, the scheduler's side (the store decides, see :mod:`.backends.busy`): the
runs won while their job was busy are logged and recorded (``skipped``, reason ``overlap`` or
``overlap_buffer_full``; or ``pending``), the runs whose worker stopped renewing its hold are
recorded ``abandoned``, and the pending runs of jobs that are free again are taken, to be sent
with trigger ``buffered``."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from . import clock
from .backends.base import Claim, LeaseStore, Overlapped
from .backends.busy import BUFFER_ALL, BUFFER_ONE, DROPPED, PENDING, Freed
from .history import encode_event
from .jobs import Job, task_id_for

__all__ = ["PENDING_POLL_S", "Overlaps"]

logger = logging.getLogger(__name__)

#: Seconds between two looks for the pending runs of free jobs, while some job keeps them.
PENDING_POLL_S = 1.0


class Overlaps:
    """What one scheduler does for the jobs protected from overlap."""

    def __init__(self, jobs: Mapping[str, Job], instance: str, prefix: str) -> None:
        self.jobs = jobs
        self.instance = instance
        self.prefix = prefix
        #: The jobs that keep runs pending (``buffer_one``, ``buffer_all``).
        self.buffered = sorted(name for name, job in jobs.items() if job.overlap in (BUFFER_ONE, BUFFER_ALL))
        self._events: list[tuple[str, bytes, int]] = []
        self._looked = -PENDING_POLL_S

    def jobs_changed(self) -> None:
        """Runtime jobs changed: which keep runs pending, again."""
        self.buffered = sorted(name for name, job in self.jobs.items() if job.overlap in (BUFFER_ONE, BUFFER_ALL))

    def note(self, overlapped: Sequence[Overlapped], freed: Sequence[tuple[str, Freed]]) -> None:
        """Log and record the runs won but not sent (their job busy) and the runs freed."""
        for item in overlapped:
            job = self.jobs.get(item.claim.job)
            if job is None:
                continue
            verdict = item.verdict
            logger.log(
                logging.WARNING if verdict == DROPPED else logging.INFO,
                "anarchon: job %r slot %d: %s, its last run is still busy (overlap %r)",
                job.name,
                item.claim.slot,
                {
                    PENDING: "kept pending, sent once it ends",
                    DROPPED: f"not sent: {job.overlap} keeps no more runs pending",
                }.get(verdict, "skipped"),
                job.overlap,
            )
            if not job.history_size:
                continue
            fields: dict[str, object] = {"slot": item.claim.slot, "instance": self.instance}
            if verdict != PENDING:
                fields["reason"] = "overlap_buffer_full" if verdict == DROPPED else "overlap"
            event = encode_event(
                "pending" if verdict == PENDING else "skipped",
                run=task_id_for(self.prefix, job.name, item.claim.slot),
                job=job.name,
                at_ms=clock.now_ms(),
                **fields,
            )
            self._events.append((job.name, event, job.history_size))
        self._events += freed_events(self.jobs, freed, "instance", self.instance)

    def events(self) -> list[tuple[str, bytes, int]]:
        """The history events noted since the last call, for :meth:`~.backends.Backend.record_many`."""
        events, self._events = self._events, []
        return events

    def wait_s(self) -> float | None:
        """How soon to look for pending runs again (None: no job keeps any)."""
        if not self.buffered:
            return None
        return max(0.0, self._looked + PENDING_POLL_S - time.monotonic())

    def take_pending(self, store: LeaseStore) -> list[tuple[Claim, int]]:
        """The pending runs of free jobs this instance now holds (at most one per job), with their
        fencing tokens: to be sent. At most once per :data:`PENDING_POLL_S`."""
        if not self.buffered or time.monotonic() < self._looked + PENDING_POLL_S:
            return []
        self._looked = time.monotonic()
        now = clock.now_ms()
        deadlines = {name: now + self.jobs[name].max_late_ms for name in self.buffered}
        taken = store.next_pending(self.buffered, self.instance, deadlines)
        self.note((), store.freed())
        for job, slot, _ in taken:
            logger.info("anarchon: job %r slot %d: its last run ended; sending the run kept pending", job, slot)
        return [(Claim(job, slot, deadline_ms=deadlines[job]), token) for job, slot, token in taken]


def freed_events(
    jobs: Mapping[str, Job], freed: Sequence[tuple[str, Freed]], by: str, who: str
) -> list[tuple[str, bytes, int]]:
    """Log the runs whose hold on their job ran out, and the ``abandoned`` events of those a
    worker had started (it stopped renewing its hold: it died, or lost the store)."""
    events: list[tuple[str, bytes, int]] = []
    for name, run in freed:
        job = jobs.get(name)
        lease = "anarchon_overlap_lease_ms" if run.abandoned else "its queued time (anarchon_overlap_queued_ms)"
        logger.warning(
            "anarchon: job %r slot %d: %s; the job is free again (found by %s %s)",
            name,
            run.slot,
            f"its worker {run.worker} stopped renewing its hold within {lease}: the run is abandoned"
            if run.abandoned
            else f"sent, but no worker started it within {lease}",
            by,
            who,
        )
        if run.abandoned and run.run and (job is None or job.history_size):
            events.append(
                (
                    name,
                    encode_event(
                        "abandoned",
                        run=run.run,
                        job=name,
                        at_ms=clock.now_ms(),
                        worker=run.worker,
                        error_type="LeaseExpired",
                        error=f"worker {run.worker} stopped renewing its hold on the job",
                    ),
                    job.history_size if job is not None else 100,
                )
            )
    return events
