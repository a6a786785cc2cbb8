"""The ``anarchon_*`` Celery settings, read once into a frozen, validated object."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

__all__ = ["DEFAULTS", "Settings"]

DEFAULTS: dict[str, Any] = {
    "anarchon_backend": None,
    "anarchon_prefix": "cron.",
    "anarchon_slot_ttl_ms": 300_000,
    "anarchon_jitter_ms": 2_000,
    "anarchon_max_late_ms": 60_000,
    "anarchon_history_size": 100,
    "anarchon_lead_ms": 10_000,
}


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

    def __post_init__(self) -> None:
        for key, minimum in (
            ("slot_ttl_ms", 1),
            ("jitter_ms", 0),
            ("max_late_ms", 0),
            ("history_size", 0),
            ("lead_ms", 0),
        ):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ConfigError(f"anarchon_{key} must be an integer >= {minimum}, not {value!r}")
        if not isinstance(self.prefix, str):
            raise ConfigError(f"anarchon_prefix must be a string, not {self.prefix!r}")

    @classmethod
    def from_app(cls, app: Any) -> Settings:
        """Read the settings from ``app.conf``; unknown ``anarchon_*`` keys are an error."""
        conf = app.conf
        unknown = sorted(
            key for key in conf if isinstance(key, str) and key.startswith("anarchon_") and key not in DEFAULTS
        )
        if unknown:
            raise ConfigError(f"unknown setting(s) {', '.join(unknown)}: known ones are {', '.join(sorted(DEFAULTS))}")
        values = {key[len("anarchon_") :]: conf.get(key, default) for key, default in DEFAULTS.items()}
        return cls(
            **{
                key: (DEFAULTS["anarchon_" + key] if value is None and key != "backend" else value)
                for key, value in values.items()
            }
        )
