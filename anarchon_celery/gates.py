"""How many gate queues a deployment's jobs keep alive at once, on RabbitMQ: each run's gate lives
``slot_ttl_ms`` after its last declaration (see :mod:`.backends.rabbitmq`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from .schedule import Interval, Schedule

if TYPE_CHECKING:
    from .jobs import Job

__all__ = ["live_gates"]


def live_gates(jobs: Iterable[Job], slot_ttl_ms: int, now_ms: int, *, sample: int = 64) -> int:
    """About how many gates the jobs keep alive at once, at their busiest.

    A gate expires ``slot_ttl_ms`` after its last declaration, which comes within the job's
    ``jitter_ms`` of the others, so a job keeps as many gates as it has slots in a window of
    ``slot_ttl_ms + jitter_ms``: at most that, over its next ``sample`` slots (a job with more in
    one window is extrapolated from their density). Summed over the jobs, each at its peak: an
    upper bound when the peaks of different schedules do not coincide. Each distinct schedule is
    computed once (cheap at start-up, even for a thousand cron jobs).
    """
    counted: dict[tuple[Schedule, int], int] = {}
    total = 0
    for job in jobs:
        key = (job.schedule, job.jitter_ms)
        if key not in counted:
            counted[key] = _busiest_window(job.schedule, slot_ttl_ms + job.jitter_ms, now_ms, sample)
        total += counted[key]
    return total


def _busiest_window(schedule: Schedule, window: int, now_ms: int, sample: int) -> int:
    if isinstance(schedule, Interval):
        return -(-window // schedule.every_ms)
    slots = [schedule.next_slot(now_ms)]
    while len(slots) < sample:
        slots.append(schedule.next_slot(slots[-1]))
    if slots[-1] - slots[0] < window:  # all within one window: as dense as that
        return round((len(slots) - 1) * window / max(1, slots[-1] - slots[0]))
    busiest, first = 0, 0
    for last, slot in enumerate(slots):  # the most slots within [s, s + window) for a slot s
        while slot - slots[first] >= window:
            first += 1
        busiest = max(busiest, last - first + 1)
    return busiest
