"""The worker's side, connected to Celery's signals when ``anarchon_celery`` is imported in a
worker: each task of a run is checked against its run's lease before it starts
(:mod:`.start_check`), its ``running`` and final events are written to the job's history
(:mod:`.history`), runs of one job decided in two places are named (:mod:`.splits`), and what it did is counted
(:mod:`.metrics`)."""

from __future__ import annotations

from . import history, holding, metrics, splits, start_check

__all__ = ["history", "holding", "metrics", "splits", "start_check"]
