"""anarchon_celery's Scheduler with one fault at an exact point of its first run won, for the
lease tests. ``TEST_FAULT`` says which:

* ``die-after-claim``: SIGKILL, the run won, before its task is written;
* ``die-after-send``: SIGKILL, its task sent (confirmed), before the run is marked sent;
* ``pause-after-send``: SIGSTOP at that point (the test sends SIGCONT);
* ``fail-send``: the task of that run is not sent, as if the broker had refused it, once the other
  instances are armed as the run's backups.

Only a run whose slot comes after the epoch milliseconds written in the file ``TEST_FAULT_FROM``
names is faulted: the test writes it once every instance is ready, so that the faulted run is one
the others claim too, and are armed as backups of (a run won before they started has none).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

from anarchon_celery import Scheduler
from anarchon_celery.sending import Outgoing, TaskSender

logger = logging.getLogger(__name__)

FAULT = os.environ.get("TEST_FAULT", "")
FAULT_FROM = os.environ.get("TEST_FAULT_FROM", "")


def may_fault(slot: int) -> bool:
    """Whether the run at ``slot`` comes after the moment the test wrote (the fleet ready)."""
    try:
        return slot > int(Path(FAULT_FROM).read_text())
    except (OSError, ValueError):
        return False  # not written yet (or being written)


class FaultyScheduler(Scheduler):
    _faulted = False

    def _fault(self, where: str, runs: list[tuple[str, int]]) -> None:
        if self._faulted:
            return
        self._faulted = True
        for handler in logging.getLogger().handlers:
            handler.flush()
        logger.warning("fault: %s %s", FAULT, runs)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGSTOP if FAULT.startswith("pause") else signal.SIGKILL)

    _failing: tuple[str, int] | None = None

    def make_sender(self, connection: Any) -> TaskSender:
        sender = super().make_sender(connection)
        if FAULT == "fail-send":
            return self._failing_sender(sender)
        if FAULT != "die-after-claim":
            return sender
        write, send = sender.write, sender.send

        def faulty_write(run: Outgoing) -> None:
            if run.token == 1 and may_fault(run.slot):
                self._fault("claim", [(run.job.name, run.slot)])
            write(run)

        def faulty_send(runs: Any) -> Any:
            first = [(run.job.name, run.slot) for run in runs if run.token == 1 and may_fault(run.slot)]
            if first:
                self._fault("claim", first)
            return send(runs)

        sender.write = faulty_write  # type: ignore[method-assign]
        sender.send = faulty_send  # type: ignore[method-assign]
        return sender

    def _failing_sender(self, sender: TaskSender) -> TaskSender:
        write, send = sender.write, sender.send

        def failing(run: Outgoing) -> bool:
            if self._failing is None and run.token == 1 and may_fault(run.slot):
                self._failing = (run.job.name, run.slot)
                logger.warning("fault: %s %s", FAULT, [self._failing])
            return (run.job.name, run.slot) == self._failing

        def failing_write(run: Outgoing) -> None:
            if not failing(run):
                write(run)

        def failing_send(runs: Any) -> Any:
            kept = [run for run in runs if not failing(run)]
            errors = iter(send(kept))
            if len(kept) < len(runs):
                self._wait_for_backups()
            return [RuntimeError("fault: not sent") if failing(run) else next(errors) for run in runs]

        sender.write = failing_write  # type: ignore[method-assign]
        sender.send = failing_send  # type: ignore[method-assign]
        return sender

    def _wait_for_backups(self) -> None:
        """A broker slow to refuse: it answers once the other instances have lost the run and are
        armed as its backups (a loaded machine can delay their claims past any fixed wait, and a
        claim made after the hand-back would take the run over without hearing of it)."""
        assert self._failing is not None and self.backend is not None
        job, slot = self._failing
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            record = self.backend.run_record(job, slot)  # type: ignore[attr-defined]
            if record is not None and record.backups >= 2:
                return
            time.sleep(0.05)
        logger.warning("fault: the run's backups were not armed within 60 s")

    def setup_schedule(self) -> None:
        super().setup_schedule()
        backend = self.backend
        if backend is None or not FAULT.endswith("after-send"):
            return
        mark_sent = backend.mark_sent

        def faulty_mark_sent(runs: Any, instance: str) -> Any:
            first = [(job, slot) for job, slot, token in runs if token == 1 and may_fault(slot)]
            if first:
                self._fault("send", first)
            return mark_sent(runs, instance)

        backend.mark_sent = faulty_mark_sent  # type: ignore[method-assign]
