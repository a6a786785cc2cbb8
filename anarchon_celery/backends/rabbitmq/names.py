"""What the backend's queues are called, and the arguments they are made with."""

from __future__ import annotations

from typing import Any

__all__ = ["gate_arguments", "gate_name", "history_arguments", "history_name"]

#: Stream bytes budgeted per run: its three small JSON events with their storage overhead (about
#: 450 bytes each, measured), with room for long error messages and host names.
RUN_BYTES = 2_000
MIN_SEGMENT_BYTES = 4_096
#: Longest queue name RabbitMQ takes (bytes), and the longest suffix a job's queues get.
MAX_QUEUE_NAME = 255
LONGEST_SUFFIX = ".slot." + "9" * 16


def gate_name(prefix: str, job: str, slot: int) -> str:
    """The gate queue of one run."""
    return f"{prefix}{job}.slot.{slot}"


def gate_arguments(slot_ttl_ms: int) -> dict[str, Any]:
    """The arguments every gate is declared with.

    The queue type is explicit: a broker whose default queue type is quorum would otherwise make
    gates quorum queues, which let several publishers past ``x-max-length``.
    """
    return {"x-max-length": 1, "x-overflow": "reject-publish", "x-expires": slot_ttl_ms, "x-queue-type": "classic"}


def history_name(prefix: str, job: str) -> str:
    """The stream that keeps a job's history."""
    return f"{prefix}{job}.history"


def history_arguments(history_size: int) -> dict[str, Any]:
    """A history stream's arguments, sized to keep at least ``history_size`` runs.

    Retention drops whole segments, so the stream holds between ``max - segment`` and ``max``
    bytes: a segment a quarter of the budget keeps retention close to the size asked for.
    """
    segment = max(MIN_SEGMENT_BYTES, history_size * RUN_BYTES // 4)
    return {
        "x-queue-type": "stream",
        "x-max-length-bytes": history_size * RUN_BYTES + segment,
        "x-stream-max-segment-size-bytes": segment,
    }
