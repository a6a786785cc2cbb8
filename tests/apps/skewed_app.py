"""``history_app`` on a wrong clock: this process's wall clock, as the scheduler sees it, is moved
by ``HISTORY_APP_SKEW_MS`` (positive: ahead), as on a host whose clock drifted."""

from __future__ import annotations

import os

from anarchon_celery import clock
from tests.apps.history_app import app

__all__ = ["app"]

_OFFSET_MS = int(os.environ.get("HISTORY_APP_SKEW_MS", "0"))
_true_now_ms = clock.now_ms


def _skewed_now_ms() -> int:
    return _true_now_ms() + _OFFSET_MS


clock.now_ms = _skewed_now_ms
