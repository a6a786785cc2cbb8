"""The ``anarchon_*`` Celery settings, read once into a frozen, validated object."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

__all__ = [
    "DEFAULTS",
    "LEASE_SETTINGS",
    "CATCH_UP_POLICIES",
    "check_overlap",
    "LEGACY_PREFIX",
    "MAX_BACKUP_RUNNERS",
    "MINIMUMS",
    "Settings",
    "default_prefix",
]

DEFAULTS: dict[str, Any] = {
    "anarchon_backend": None,
    "anarchon_prefix": None,  # derived from the app's name: default_prefix()
    "anarchon_slot_ttl_ms": 300_000,
    "anarchon_jitter_ms": 2_000,
    "anarchon_max_late_ms": 60_000,
    "anarchon_history_size": 100,
    "anarchon_lead_ms": 10_000,
    "anarchon_backup_runners": 2,
    "anarchon_lease_ms": 5_000,
    "anarchon_start_check_timeout_ms": 500,
    "anarchon_catch_up": False,
    "anarchon_catch_up_window_ms": 86_400_000,
    "anarchon_overlap": "allow",
    "anarchon_overlap_lease_ms": 30_000,
    "anarchon_overlap_queued_ms": 3_600_000,
    "anarchon_runtime_check_ms": 30_000,
    "anarchon_metrics_port": None,  # off
    "anarchon_metrics_address": "0.0.0.0",
    "anarchon_health_stall_ms": 60_000,
    "anarchon_worker_metrics_port": None,  # off
}

#: Settings only a backend with leases (SQLite, Redis, PostgreSQL) takes: set on another, an error.
LEASE_SETTINGS = (
    "backup_runners",
    "lease_ms",
    "start_check_timeout_ms",
    "catch_up",
    "catch_up_window_ms",
    "overlap",
    "overlap_lease_ms",
    "overlap_queued_ms",
)
#: The catch-up policies: off (False), one run for the newest slot missed, or every one.
CATCH_UP_POLICIES = (False, "latest", "all")
#: The most backups a run may have.
MAX_BACKUP_RUNNERS = 10

#: The smallest value of each integer setting. ``jitter_ms``, ``max_late_ms`` and
#: ``history_size`` are also per-job keys, which :func:`anarchon_celery.jobs.make_job` checks
#: against the same minimums: a default that every job would refuse is refused as a setting.
MINIMUMS: dict[str, int] = {
    "slot_ttl_ms": 1,
    "jitter_ms": 0,
    "max_late_ms": 1,
    "history_size": 0,
    "lead_ms": 0,
    "backup_runners": 0,
    "lease_ms": 100,
    "start_check_timeout_ms": 10,
    "catch_up_window_ms": 1_000,
    "overlap_lease_ms": 1_000,
    "overlap_queued_ms": 1_000,
    "runtime_check_ms": 1_000,
    "health_stall_ms": 1_000,
}

_OURS = "anarchon_"

#: The default prefix of earlier releases, for every app: deployments that relied on it keep it
#: by setting it (the scheduler refuses to start beside state left under it, see control.py).
LEGACY_PREFIX = "cron."


def default_prefix(app: Any) -> str:
    """``<app main name>.cron.``: two projects sharing a broker or a store do not share runs by
    default (generic job names are common). ``cron.`` for an app without a name."""
    main = getattr(app, "main", None)
    if not isinstance(main, str) or not main or main == "__main__":
        return LEGACY_PREFIX
    name = re.sub(r"[^A-Za-z0-9_\-.:]", "_", main).strip(".")[:90] or "app"
    if name.startswith("amq."):  # names RabbitMQ reserves
        name = f"app-{name}"
    return f"{name}.cron."


def check_minimum(shown: str, value: Any, minimum: int) -> int:
    """``value`` when it is an integer >= ``minimum`` (not a bool), else a ConfigError naming ``shown``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{shown} must be an integer >= {minimum}, not {value!r}")
    return value


def check_port(shown: str, value: Any) -> int | None:
    """A TCP port (0: any free one), or None for off; else a ConfigError naming ``shown``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise ConfigError(f"{shown} must be a port number from 0 to 65535 (or None: off), not {value!r}")
    return value


def check_catch_up(shown: str, value: Any) -> str | bool:
    """A catch-up policy (False, ``"latest"`` or ``"all"``), else a ConfigError naming ``shown``."""
    if value is None or value is False:
        return False
    if value is True:
        raise ConfigError(f"{shown} must be False, 'latest' or 'all', not True: say which runs to catch up")
    if value not in CATCH_UP_POLICIES:
        raise ConfigError(f"{shown} must be False, 'latest' or 'all', not {value!r}")
    return str(value)


def check_overlap(shown: str, value: Any) -> str:
    """An overlap policy (``"allow"``, ``"skip"``, ``"buffer_one"``, ``"buffer_all"``), else a
    ConfigError naming ``shown``."""
    from .backends.busy import POLICIES

    if value is None:
        return "allow"
    if value not in POLICIES:
        hint = " (say which: 'skip' drops a run while one is busy)" if value in (True, False) else ""
        raise ConfigError(f"{shown} must be one of {', '.join(repr(p) for p in POLICIES)}, not {value!r}{hint}")
    return str(value)


def _match_case(key: str, namespace: str) -> str:
    """How Celery spells ``key`` under ``namespace`` (celery.utils.text.match_case)."""
    return key.upper() if namespace.isupper() else key.lower()


class _Spelling:
    """The names under which Celery reads our settings from an app's configuration.

    ``app.conf.get("anarchon_prefix")`` looks for ``anarchon_prefix`` and, when the app has a
    namespace (``config_from_object(obj, namespace="CELERY")``), first for ``CELERY_ANARCHON_PREFIX``:
    the namespace with ``_``, then the name in the namespace's case (celery.utils.collections,
    ``ConfigurationView._to_keys``). Any other spelling is never read.
    """

    def __init__(self, namespace: str | None) -> None:
        self.namespace = namespace.rstrip("_") + "_" if namespace else ""

    def namespaced(self, key: str) -> str:
        return _match_case(self.namespace + key, self.namespace) if self.namespace else key

    def read(self, key: str) -> tuple[str, ...]:
        return (self.namespaced(key), key) if self.namespace else (key,)

    def _rest(self, name: str) -> str:
        """``name`` in lower case, without the app's namespace."""
        rest = name.lower()
        if self.namespace and rest.startswith(self.namespace.lower()):
            rest = rest[len(self.namespace) :]
        return rest

    def is_ours(self, name: str) -> bool:
        """Whether ``name`` looks meant for anarchon_celery, whether or not Celery reads it:
        ``anarchon_*``, under the app's namespace or under another (``CELERY_ANARCHON_PREFIX`` on
        an app without one), that last only when what follows is a setting or close to one (a
        ``MYPROJ_ANARCHON_DASHBOARD_URL`` of the user's own is none of ours)."""
        if self._rest(name).startswith(_OURS):
            return True
        elsewhere = self.elsewhere(name)
        if elsewhere is None:
            return False
        return elsewhere[1] in DEFAULTS or bool(difflib.get_close_matches(elsewhere[1], sorted(DEFAULTS), 1, 0.75))

    def elsewhere(self, name: str) -> tuple[str, str] | None:
        """The namespace ``name`` is written under when it is not the app's, and the setting's key
        (``("CELERY", "anarchon_prefix")`` for ``CELERY_ANARCHON_PREFIX`` on an app without a
        namespace); None for a name under the app's namespace or under none."""
        rest = self._rest(name)
        at = rest.find(f"_{_OURS}")
        if rest.startswith(_OURS) or at < 0:
            return None
        return name[len(name) - len(rest) :][:at], rest[at + 1 :]

    def misplaced(self, names: list[str]) -> ConfigError | None:
        """The error for known settings written under a namespace the app does not have, which
        Celery never reads: what to write instead."""
        found = [(name, where) for name in names if (where := self.elsewhere(name)) and where[1] in DEFAULTS]
        if not found:
            return None
        shown = ", ".join(name for name, _ in found)
        verb, them = ("is", "it") if len(found) == 1 else ("are", "them")
        if not self.namespace:
            other = found[0][1][0]
            keys = ", ".join(key for _, (_, key) in found)
            return ConfigError(
                f"{shown} {verb} not read: this app has no namespace, so Celery never reads {them}; write "
                f"{keys}, or load the configuration with app.config_from_object(..., namespace={other!r})"
            )
        ours = self.namespace.rstrip("_")
        keys = ", ".join(f"{self.namespaced(key)} (or {key})" for _, (_, key) in found)
        return ConfigError(
            f"{shown} {verb} not read: this app's namespace is {ours!r}, so Celery never reads {them}; write {keys}"
        )

    def style(self, name: str) -> Callable[[str], str]:
        """How to spell a known key as the user spelt ``name``: namespaced when they wrote the
        namespace or upper case under a namespace (the readable form), else plain."""
        if self.namespace and (name.lower().startswith(self.namespace.lower()) or name.isupper()):
            return self.namespaced
        return str

    def unknown(self, names: Iterable[str]) -> ConfigError | None:
        unread = sorted(
            name
            for name in names
            if self.is_ours(name) and not any(name in self.read(key) for key in DEFAULTS)  # a name Celery reads
        )
        if not unread:
            return None
        misplaced = self.misplaced(unread)
        if misplaced is not None:
            return misplaced
        parts = []
        for name in unread:
            elsewhere = self.elsewhere(name)
            rest = elsewhere[1] if elsewhere else self._rest(name)
            close = difflib.get_close_matches(rest, sorted(DEFAULTS), n=1, cutoff=0.75)
            parts.append(f"{name} (did you mean {self.style(name)(close[0])}?)" if close else name)
        spell = self.style(unread[0])
        known = ", ".join(spell(key) for key in sorted(DEFAULTS))
        setting = "setting" if len(unread) == 1 else "settings"
        return ConfigError(f"unknown {setting} {', '.join(parts)}: known ones are {known}")

    def shown(self, key: str, present: set[str]) -> str:
        """The name a setting was given under, for messages about its value."""
        given = [name for name in self.read(key) if name in present]
        return given[0] if len(given) == 1 else key


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Deployment-wide settings; ``jitter_ms``, ``max_late_ms`` and ``history_size`` are
    defaults for every job.

    ``backend`` is a Backend instance, a URL (``amqp://...``, or ``memory://`` for tests), or
    None for the app's broker when that is RabbitMQ. ``lead_ms`` is how long before a run's
    claim its gate is declared (0: at the claim).
    """

    backend: Any = None
    prefix: str = "cron."
    slot_ttl_ms: int = 300_000
    jitter_ms: int = 2_000
    max_late_ms: int = 60_000
    history_size: int = 100
    lead_ms: int = 10_000
    backup_runners: int = 2
    lease_ms: int = 5_000
    #: How long a worker's start check waits for the store (it has its own connection).
    start_check_timeout_ms: int = 500
    #: What is done with the runs missed while no instance could claim them (a default for
    #: every job): False, ``"latest"`` or ``"all"``; and how far back (on a backend with leases).
    catch_up: str | bool = False
    catch_up_window_ms: int = 86_400_000
    #: What is done with a run due while its job's last run is busy (a default for every job):
    #: ``"allow"``, ``"skip"``, ``"buffer_one"`` or ``"buffer_all"`` (on a backend with leases);
    #: how long a worker holds a busy job between two heartbeats, and how long a run sent counts
    #: as busy before a worker starts it (unless its ``expires`` is sooner).
    overlap: str = "allow"
    overlap_lease_ms: int = 30_000
    overlap_queued_ms: int = 3_600_000
    #: How often each instance compares every runtime job's version with those it runs: how soon
    #: it acts on a change it was not told of (it is told of each within about a second).
    runtime_check_ms: int = 30_000
    #: The port (and address) each beat serves its health probes and metrics on; None: none.
    metrics_port: int | None = None
    metrics_address: str = "0.0.0.0"
    #: How long the scheduler loop may go without a sign of progress (past the end of the sleep
    #: it announced) before its liveness probe fails.
    health_stall_ms: int = 60_000
    #: The port each worker serves its own metrics on (on ``metrics_address``); None: none.
    worker_metrics_port: int | None = None
    #: The settings the app gave (the others are defaults), without the ``anarchon_`` prefix.
    given: frozenset[str] = frozenset()
    #: How the app spelt the settings it gave (``CELERY_ANARCHON_LEASE_MS``), by key, for messages.
    spelt: tuple[tuple[str, str], ...] = ()

    def name_of(self, key: str) -> str:
        """The setting ``key`` as the app wrote it (``anarchon_<key>`` when it is a default)."""
        return dict(self.spelt).get(key, f"{_OURS}{key}")

    def __post_init__(self) -> None:
        for key, minimum in MINIMUMS.items():
            check_minimum(f"{_OURS}{key}", getattr(self, key), minimum)
        if self.backup_runners > MAX_BACKUP_RUNNERS:
            raise ConfigError(f"{_OURS}backup_runners must be at most {MAX_BACKUP_RUNNERS}, not {self.backup_runners}")
        if not isinstance(self.prefix, str):
            raise ConfigError(f"{_OURS}prefix must be a string, not {self.prefix!r}")
        object.__setattr__(self, "catch_up", check_catch_up(f"{_OURS}catch_up", self.catch_up))
        object.__setattr__(self, "overlap", check_overlap(f"{_OURS}overlap", self.overlap))
        check_port(f"{_OURS}metrics_port", self.metrics_port)
        check_port(f"{_OURS}worker_metrics_port", self.worker_metrics_port)
        if not isinstance(self.metrics_address, str):
            raise ConfigError(f"{_OURS}metrics_address must be a string, not {self.metrics_address!r}")

    @classmethod
    def from_app(cls, app: Any) -> Settings:
        """Read the settings from ``app.conf``, under the app's namespace too
        (``CELERY_ANARCHON_PREFIX`` after ``config_from_object(obj, namespace="CELERY")``).

        Names meant for anarchon_celery that Celery would not read (misspelt, or without the
        namespace) are an error, with the closest known setting as the user would spell it.
        """
        conf = app.conf
        spelling = _Spelling(getattr(app, "namespace", None))
        present = {key for key in conf if isinstance(key, str)}
        error = spelling.unknown(present)
        if error is not None:
            raise error
        values: dict[str, Any] = {}
        given = set()
        spelt = []
        for name, default in DEFAULTS.items():
            key = name[len(_OURS) :]
            value = conf.get(name)  # Celery looks under the namespace first
            if value is not None:
                given.add(key)
                spelt.append((key, spelling.shown(name, present)))
            values[key] = default if value is None and key != "backend" else value
            if key == "prefix" and value is None:
                values[key] = default_prefix(app)
            if key in MINIMUMS:  # named as the user wrote it
                check_minimum(spelling.shown(name, present), values[key], MINIMUMS[key])
            elif key == "catch_up":
                values[key] = check_catch_up(spelling.shown(name, present), values[key])
            elif key == "overlap":
                values[key] = check_overlap(spelling.shown(name, present), values[key])
            elif key in ("metrics_port", "worker_metrics_port"):
                values[key] = check_port(spelling.shown(name, present), values[key])
            elif key in ("prefix", "metrics_address") and not isinstance(values[key], str):
                raise ConfigError(f"{spelling.shown(name, present)} must be a string, not {values[key]!r}")
        return cls(**values, given=frozenset(given), spelt=tuple(spelt))
