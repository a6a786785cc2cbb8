"""Whether the Redis store keeps its data across a restart. A Redis with neither an append-only
file (``appendonly no``) nor a ``save`` rule starts again empty: every job's cursor, run records
and leases are gone, so a run decided just before the restart can be won and sent again, and the
pauses, runtime jobs and history go with them. The backend runs on it all the same, with a warning
at each beat's start and in ``celery anarchon check``. A part of :class:`~.redis.RedisBackend`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import docs
from .base import Finding
from .redis_client import server_info
from .store import StoreBackend

if TYPE_CHECKING:
    from ..jobs import Job

__all__ = ["RedisPersistence", "persistence_missing", "unpersisted_text"]


def persistence_missing(client: Any, errors: tuple[type[BaseException], ...]) -> str | None:
    """What shows that the Redis of ``client`` keeps nothing on disk (``"appendonly no, save ''"``);
    None when it keeps its data, or when that cannot be told: ``INFO`` or ``CONFIG`` refused (an ACL,
    a managed Redis) or failing with one of ``errors``."""
    if server_info(client, "persistence", "aof_enabled", errors) != "0":
        return None  # an append-only file (or nothing to read)
    try:
        save = client.config_get("save").get("save")
    except errors:
        return None
    if isinstance(save, bytes):
        save = save.decode()
    if save is None or save.strip():
        return None  # snapshots (or nothing to read)
    return "appendonly no, save ''"


def unpersisted_text(found: str) -> str:
    """What a restart costs a store that keeps nothing on disk (``found`` says how it shows), and the fix."""
    return (
        f"it keeps nothing on disk ({found}): when it restarts, every job's cursor, run records and leases "
        "are lost, so a run decided just before can be won and sent again, and the pauses, runtime jobs "
        "and history go with them. Turn persistence on: CONFIG SET appendonly yes, and appendonly yes in "
        f"redis.conf (a save rule alone keeps only its last snapshot); see {docs.REDIS_NEEDS}"
    )


class RedisPersistence(StoreBackend):
    """The persistence check of the Redis backend: :meth:`_read_persistence` when it opens (the
    backend gives ``client``), then a warning among those of the start and on ``check``'s store line."""

    client: Any
    #: How the store shows that it keeps nothing on disk, when it does; read at :meth:`open`.
    unpersisted: str | None = None

    def _read_persistence(self, errors: tuple[type[BaseException], ...]) -> None:
        self.unpersisted = persistence_missing(self.client, errors)

    def job_warnings(self, jobs: Sequence[Job], now_ms: int) -> list[str]:
        """Those of a store, and a store opened that keeps nothing on disk (read at :meth:`open`)."""
        warnings = [*super().job_warnings(jobs, now_ms)]
        if self.unpersisted is not None:
            warnings.append(f"{self.describe()}: {unpersisted_text(self.unpersisted)}")
        return warnings

    def report_reach(self) -> Finding:
        """The store's line of ``check``, with a warning when the store keeps nothing on disk."""
        finding = super().report_reach()
        if self.unpersisted is None:
            return finding
        return Finding(finding.check, f"{finding.detail}; but {unpersisted_text(self.unpersisted)}", warn=True)
