"""anarchon_celery's Scheduler for lease_soak.py, which plays a fault at an exact point of a run
won: when the file ``<SOAK_FAULT_DIR>/<pid>.<fault>`` appears, the instance, at its next win:

* ``kill-claim``: SIGKILLs itself, the run won, before its task is written;
* ``pause-send``: SIGSTOPs itself once the task is sent, before the run is marked sent (the
  benchmark sends SIGCONT after the lease has run out).

It logs ``soak fault: <fault> <job> <slot>`` first.
"""

from __future__ import annotations

import logging
import os
import signal
from functools import cached_property
from pathlib import Path
from typing import Any

from anarchon_celery import Scheduler as _Scheduler
from anarchon_celery.sending import Outgoing, TaskSender

logger = logging.getLogger(__name__)

FAULTS = Path(os.environ.get("SOAK_FAULT_DIR", "/nonexistent"))


def _due(fault: str) -> bool:
    trigger = FAULTS / f"{os.getpid()}.{fault}"
    if not trigger.exists():
        return False
    trigger.unlink()
    return True


def _play(fault: str, run: Outgoing) -> None:
    logger.warning("soak fault: %s %s %d", fault, run.job.name, run.slot)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os.kill(os.getpid(), signal.SIGKILL if fault == "kill-claim" else signal.SIGSTOP)


class Scheduler(_Scheduler):
    @cached_property
    def sender(self) -> TaskSender:
        sender = TaskSender(self.app, self.connection)
        write, send = sender.write, sender.send

        def faulty_write(run: Outgoing) -> None:
            if run.token <= 1 and _due("kill-claim"):
                _play("kill-claim", run)
            write(run)

        def faulty_send(runs: Any) -> Any:
            for run in runs:
                if run.token <= 1 and _due("kill-claim"):
                    _play("kill-claim", run)
            return send(runs)

        sender.write = faulty_write  # type: ignore[method-assign]
        sender.send = faulty_send  # type: ignore[method-assign]
        return sender

    def _send_held(self, runs: list[Outgoing]) -> Any:
        backend = self.backend
        if backend is None or not backend.leases:  # claim only: paused once the task is sent
            done = super()._send_held(runs)
            sent = [d.run for d in done if d.error is None and d.run.token <= 1]
            if sent and _due("pause-send"):
                _play("pause-send", sent[0])
            return done
        mark_sent = backend.mark_sent

        def faulty_mark_sent(marked: Any, instance: str) -> Any:
            first = [run for run in runs if run.token == 1]
            if first and _due("pause-send"):
                _play("pause-send", first[0])
            return mark_sent(marked, instance)

        backend.mark_sent = faulty_mark_sent  # type: ignore[method-assign]
        try:
            return super()._send_held(runs)
        finally:
            del backend.mark_sent  # the class's again
