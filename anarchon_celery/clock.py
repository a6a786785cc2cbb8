"""The wall clock, in one place: slots are wall-clock instants, so every instance reads time the
same way (and tests can drive it)."""

from __future__ import annotations

import time

__all__ = ["now_ms"]


def now_ms() -> int:
    """Now, in integer milliseconds since the Unix epoch."""
    return time.time_ns() // 1_000_000
