"""What an instance has to do next, and when: pure, no I/O, no clock of its own.

Every item is due at ``due_ms`` (epoch milliseconds, this instance's clock) and names one run of
a job (its slot). There is one type per kind of item, so that the scheduler never tells them
apart by fields left at zero:

- :class:`FirstClaim`: a run's claim, at its slot plus this instance's jitter;
- :class:`ClaimAgain`: a claim made again, a moment later, because the run was away (its gate's
  node or its store could not be reached) or the store's clock said it was not due yet;
- :class:`BackupTry`: a backup's try at taking over a run whose winner's lease ran out;
- :class:`Prepare`: the declare of a run's gate ahead of its claim (``anarchon_lead_ms``).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

__all__ = ["BackupTry", "ClaimAgain", "FirstClaim", "Prepare", "RunQueue", "Item"]


@dataclass(frozen=True, slots=True)
class FirstClaim:
    """A run's first claim: due at its slot plus this instance's jitter."""

    due_ms: int
    job: str
    slot: int

    @property
    def planned_ms(self) -> int:
        """When this instance planned to claim the run: its lateness counts from here."""
        return self.due_ms


@dataclass(frozen=True, slots=True)
class ClaimAgain:
    """A claim made again at ``due_ms``; it was first due at ``planned_ms``."""

    due_ms: int
    job: str
    slot: int
    planned_ms: int


@dataclass(frozen=True, slots=True)
class BackupTry:
    """The try of this instance, the run's backup number ``rank`` (1 first), at taking the run
    over; the run was first due at ``planned_ms``."""

    due_ms: int
    job: str
    slot: int
    planned_ms: int
    rank: int


@dataclass(frozen=True, slots=True)
class Prepare:
    """Declare the gate of a run whose claim is due ``lead_ms`` after ``due_ms``."""

    due_ms: int
    job: str
    slot: int
    claim_ms: int  # when the run's claim is due


Item = FirstClaim | ClaimAgain | BackupTry
T = TypeVar("T", bound=FirstClaim | ClaimAgain | BackupTry | Prepare)


class RunQueue(Generic[T]):
    """Items by the time they are due; items due at the same time come out in the order pushed."""

    def __init__(self, items: Iterable[T] = ()) -> None:
        self._heap: list[tuple[int, int, T]] = []
        self._order = itertools.count()
        self._backups = 0
        for item in items:
            self.push(item)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[T]:
        """The items, in no particular order."""
        return (item for _, _, item in self._heap)

    def push(self, item: T) -> None:
        heapq.heappush(self._heap, (item.due_ms, next(self._order), item))
        if isinstance(item, BackupTry):
            self._backups += 1

    def next_ms(self) -> int | None:
        """When the first item is due; None when there is none."""
        return self._heap[0][0] if self._heap else None

    def wait_s(self, now_ms: int) -> float | None:
        """Seconds from ``now_ms`` until the first item is due (0 when one is); None when empty."""
        first = self.next_ms()
        return None if first is None else max(0.0, (first - now_ms) / 1000)

    def is_due(self, now_ms: int) -> bool:
        first = self.next_ms()
        return first is not None and first <= now_ms

    def take(self, now_ms: int, limit: int) -> list[T]:
        """Take off the queue the items due at ``now_ms``, first due first, ``limit`` at most."""
        taken: list[T] = []
        while self._heap and self._heap[0][0] <= now_ms and len(taken) < limit:
            item = heapq.heappop(self._heap)[2]
            if isinstance(item, BackupTry):
                self._backups -= 1
            taken.append(item)
        return taken

    def drop(self, jobs: set[str]) -> int:
        """Take the items of ``jobs`` off the queue; returns how many."""
        kept = [entry for entry in self._heap if entry[2].job not in jobs]
        dropped = len(self._heap) - len(kept)
        if dropped:
            heapq.heapify(kept)
            self._heap = kept
            self._backups = sum(isinstance(item, BackupTry) for _, _, item in kept)
        return dropped

    def has_backups(self) -> bool:
        """Whether a :class:`BackupTry` is queued: this instance is a backup of some run."""
        return self._backups > 0

    def hurry(self, runs: set[tuple[str, int]], now_ms: int, stagger_ms: int) -> list[BackupTry]:
        """Bring forward the backup tries of ``runs`` (job, slot), whose leases were handed back:
        due at ``now_ms``, later by rank (``stagger_ms`` per rank after the first). Returns the
        tries brought forward, as they were."""
        hurried: list[BackupTry] = []
        heap: list[tuple[int, int, T]] = []
        for due, order, item in self._heap:
            if isinstance(item, BackupTry) and (item.job, item.slot) in runs:
                hurried.append(item)
                sooner = replace(item, due_ms=now_ms + (item.rank - 1) * stagger_ms)
                heap.append((sooner.due_ms, order, sooner))
            else:
                heap.append((due, order, item))
        if hurried:
            heapq.heapify(heap)
            self._heap = heap
        return hurried
