"""What the RabbitMQ backend keeps in its control log (see :mod:`.control_log`): when each job
came to be, the pauses and the runtime jobs. A part of :class:`~.backend.RabbitMQBackend`."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ... import clock
from ..definitions import JobConflict, JobDef
from ..pauses import Pause
from .control_log import ControlLog

__all__ = ["ControlLogged"]


class ControlLogged:
    """The steps kept in the control log, which the backend gives as ``_control``, opening its
    connection with ``open()``."""

    _control: ControlLog

    if TYPE_CHECKING:

        def open(self) -> None: ...

    def introduce(self, since: Mapping[str, int]) -> dict[str, int]:
        """Kept in the control log (see :meth:`.control_log.ControlLog.introduce`)."""
        return self._control.introduce(dict(since))

    # -- pauses ---------------------------------------------------------------------------------

    def pause(self, job: str, pause: Pause) -> None:
        """Appended to the control log (see :mod:`.control_log`): each instance acts on it once
        it reads it, as soon as its claims' connection is read."""
        self.open()
        self._control.append({"op": "pause", "job": job, "pause": json.loads(pause.encode())})

    def resume(self, job: str) -> Pause | None:
        self.open()
        ended = self._control.pauses().get(job)
        if ended is not None:
            self._control.append({"op": "resume", "job": job})
        return ended

    def pauses(self) -> dict[str, Pause]:
        self.open()
        return self._control.pauses()

    # -- runtime jobs ---------------------------------------------------------------------------

    def put_job(self, name: str, entry: Mapping[str, Any], *, base: int | None, by: str) -> JobDef:
        """Appended to the control log, then read back: every instance, reading the log in the
        same order, accepts the same changes (each based on the version kept at its point)."""
        self.open()
        at = clock.now_ms()
        state, accepted = self._control.change(
            {"op": "put", "job": name, "base": base, "entry": dict(entry), "by": by, "at": at}
        )
        if not accepted:
            kept = state.defs.get(name)
            raise JobConflict(name, base, None if kept is None else kept.version)
        return JobDef(name, 1 if base is None else base + 1, dict(entry), by, at)

    def remove_job(self, name: str, *, base: int | None) -> JobDef:
        self.open()
        before = self._control.read().defs.get(name)
        state, accepted = self._control.change({"op": "remove", "job": name, "base": base})
        if not accepted:
            kept = state.defs.get(name)
            raise JobConflict(name, base if base is not None else 0, None if kept is None else kept.version)
        return before if before is not None else JobDef(name, base or 0)

    def runtime_jobs(self, names: Sequence[str] | None = None) -> dict[str, JobDef]:
        """Read from the control log; in a beat, which follows it (see :meth:`job_changes`), from
        the log as it has read it: the log is both the definitions and the news of their changes,
        read in order, so there is nothing a full read would find that following misses."""
        if self._control.following:
            defs = self._control.view.defs
        else:
            self.open()
            defs = self._control.read().defs
        return {n: d for n, d in sorted(defs.items()) if names is None or n in names}

    def job_changes(self, since: Any) -> tuple[set[str] | None, Any]:
        """As this instance has read the control log, which it follows (see :mod:`.control_log`)."""
        return self._control.changes(since)
