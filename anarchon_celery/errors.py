"""The package's errors: one root, a few meaningful children."""

from __future__ import annotations

__all__ = ["AnarchonError", "BrokerError", "BrokerRefused", "BrokerUnavailable", "ConfigError", "clause"]


class AnarchonError(Exception):
    """Root of every error raised by anarchon_celery."""


class ConfigError(AnarchonError, ValueError):
    """The configuration cannot work: a job, a setting or a backend option is wrong.

    Raised at start (or when a job is added), never in the middle of a run.
    """


class BrokerError(AnarchonError):
    """The broker cannot serve this backend: unreachable, too old, or missing a feature."""


class BrokerUnavailable(BrokerError):
    """The broker could not be reached (yet): the scheduler keeps trying, runs meanwhile are lost."""


class BrokerRefused(BrokerError):
    """The broker answered but refused us: the login (user, password), the vhost, or the user's
    permissions on it. Trying again does not help until the configuration or the broker's users
    are fixed, so the scheduler stops at start with this error."""


def clause(reason: object) -> str:
    """``reason`` (an exception, or a server's or library's text) to quote inside a sentence of
    ours, as in ``f"... refused the login ({clause(exc)}). Give ..."``: without the full stop it
    may end with (Redis's "user is disabled." made "disabled.." before the next sentence)."""
    return str(reason).strip().rstrip(".").rstrip()
