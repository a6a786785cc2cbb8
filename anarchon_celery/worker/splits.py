"""The worker's side of a split deployment: one job's runs decided in two places.

Instances decide each run together only where they claim it in one place: the same RabbitMQ
cluster and vhost, or the same store, under the same prefix. Instances configured apart (a
relative SQLite path resolved from two working directories, one beat moved to Redis while the
others stay on RabbitMQ, two prefixes) cannot see each other's claims: each wins every run and
sends it, and every run is executed twice, with nothing to tell in the beats' own logs. What they
do share is the task broker, and every message names where its run was decided
(``anarchon_place``, :meth:`~anarchon_celery.Backend.place`) and by whom (``anarchon_instance``).
A worker that gets runs of one job decided in two places within :data:`WINDOW_S` says so, as an
error naming both instances and places, once per job and pair of places in each worker process.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from .. import docs

__all__ = ["WINDOW_S", "forget", "notice"]

logger = logging.getLogger(__name__)

#: Seconds within which two places of one job's runs are a split (not a move made long ago).
WINDOW_S = 600.0

_lock = threading.Lock()
#: job -> place -> (instance, time.monotonic() last seen)
_seen: dict[str, dict[str, tuple[str, float]]] = {}
_said: set[tuple[str, frozenset[str]]] = set()


def notice(job: object, place: object, instance: object) -> None:
    """Take note of a run's message (its job, place and instance headers); never raises."""
    if not isinstance(job, str) or not isinstance(place, str):
        return  # a manual run, or sent by an earlier release
    instance = str(instance or "an instance")
    now = time.monotonic()
    with _lock:
        places = _seen.setdefault(job, {})
        places[place] = (instance, now)
        for other in [p for p, (_, at) in places.items() if now - at > WINDOW_S]:
            del places[other]
        if len(places) < 2:
            return
        pair = frozenset(places)
        if (job, pair) in _said:
            return
        _said.add((job, pair))
        shown = "; ".join(f"{seen_by} in {where}" for where, (seen_by, _) in sorted(places.items()))
    logger.error(
        "anarchon: the runs of job %r are decided in %d places, by instances that cannot see each other's "
        "claims: %s. Each place sends every run, so each run is executed once per place. Give every beat "
        "the same anarchon_backend and anarchon_prefix (a SQLite path absolute: a relative one is read "
        "from each process's working directory), and stop the instances of the wrong one (see %s)",
        job,
        len(places),
        shown,
        docs.CANNOT_SEE_EACH_OTHER,
    )


def forget() -> None:
    """Forget what this process saw (a forked child starts afresh; tests)."""
    with _lock:
        _seen.clear()
        _said.clear()


os.register_at_fork(after_in_child=forget)
