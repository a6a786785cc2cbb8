"""Backends decide which instance runs each slot. See :mod:`.base` for the contract."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from ..settings import Settings
from .base import Backend, Claim, JobState, LeaseStore, Outcome, StreamHistory, Takeover, TakeoverKind
from .memory import MemoryBackend
from .postgres import POSTGRES_SCHEMES, PostgresBackend
from .rabbitmq import AMQP_SCHEMES, RabbitMQBackend, app_connection_options
from .redis import REDIS_SCHEMES, RedisBackend
from .redis_client import SENTINEL_SCHEME
from .sqlite import SQLiteBackend

__all__ = [
    "Backend",
    "Claim",
    "JobState",
    "LeaseStore",
    "MemoryBackend",
    "Outcome",
    "PostgresBackend",
    "RabbitMQBackend",
    "RedisBackend",
    "SQLiteBackend",
    "StreamHistory",
    "Takeover",
    "TakeoverKind",
    "backend_for",
]

#: ``memory://`` backends, one per (prefix, slot_ttl_ms), shared by the schedulers of a process.
_MEMORY: dict[tuple[str, int], MemoryBackend] = {}


def backend_for(app: Any, settings: Settings, *, timeout: float | None = None) -> Backend:
    """The backend the settings name: an instance, a URL, or by default the app's RabbitMQ.
    ``timeout``: seconds a store made here from a URL waits for an answer (else its default); an
    instance given keeps its own."""
    chosen = settings.backend
    if isinstance(chosen, Backend):
        _check_instance(app, chosen)
        return chosen
    if chosen is None:  # the app's broker, when it can decide runs: RabbitMQ or Redis
        return _broker_backend(app, settings, timeout)
    if isinstance(chosen, str):
        return _url_backend(app, chosen, settings, timeout)
    if isinstance(chosen, (list, tuple)):  # the nodes of a cluster
        return RabbitMQBackend(
            chosen, prefix=settings.prefix, slot_ttl_ms=settings.slot_ttl_ms, **app_connection_options(app)
        )
    raise ConfigError(
        f"anarchon_backend must be a URL, a list of a cluster's URLs or a Backend instance, not {type(chosen).__name__}"
    )


#: The stores made from a URL, by scheme.
_STORES: dict[str, Any] = {
    **dict.fromkeys(REDIS_SCHEMES, RedisBackend),
    **dict.fromkeys(POSTGRES_SCHEMES, PostgresBackend),
    "sqlite": SQLiteBackend,
}


def _check_instance(app: Any, chosen: Backend) -> None:
    """A backend instance keeps its own prefix, slot_ttl_ms and lease_ms: settings that differ
    are an error, not silently ignored."""
    for key in ("prefix", "slot_ttl_ms", *(("lease_ms",) if chosen.leases else ())):
        given = app.conf.get(f"anarchon_{key}")
        if given is not None and given != getattr(chosen, key):
            raise ConfigError(
                f"anarchon_{key} is {given!r} but the anarchon_backend instance has {key} "
                f"{getattr(chosen, key)!r}: set it on the backend only"
            )


def _store(url: str, scheme: str, settings: Settings, timeout: float | None) -> Backend:
    options: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    store: Backend = _STORES[scheme].from_url(
        url, prefix=settings.prefix, slot_ttl_ms=settings.slot_ttl_ms, lease_ms=settings.lease_ms, **options
    )
    return store


def _broker_backend(app: Any, settings: Settings, timeout: float | None) -> Backend:
    """The backend of the app's broker: RabbitMQ's gates, or a Redis store."""
    connection = app.connection_for_write()
    try:
        transport = connection.transport_cls
        if transport in REDIS_SCHEMES:
            return _store(_redis_url_of(connection), transport, settings, timeout)
        if transport not in AMQP_SCHEMES:
            raise ConfigError(
                f"the app's broker is {connection.as_uri()}, neither RabbitMQ nor Redis: set "
                "anarchon_backend to an amqp://, redis://, postgresql:// or sqlite:/// URL, or a backend"
            )
    finally:
        connection.release()
    return RabbitMQBackend.from_app(app, prefix=settings.prefix, slot_ttl_ms=settings.slot_ttl_ms)


#: The form of a URL, by scheme, for the error about one that is malformed.
_FORMS = {
    **{scheme: f"{scheme}://[:PASSWORD@]host:port/db" for scheme in ("redis", "rediss")},
    SENTINEL_SCHEME: "sentinel://host:port;sentinel://host:port?master_name=NAME",
    **{scheme: f"{scheme}://[USER[:PASSWORD]@]host:port/database" for scheme in POSTGRES_SCHEMES},
    "sqlite": "sqlite:///absolute/path/of/anarchon.db",
    **{scheme: f"{scheme}://USER:PASSWORD@host:port/vhost" for scheme in AMQP_SCHEMES},
    "memory": "memory://",
}


def _malformed(url: str) -> ConfigError | None:
    """The error for a URL without ``://`` (``redis:/host:6379/0``); None for any other. The URL
    is shown as given, its password masked."""
    if "://" in url:
        return None
    scheme, _, rest = url.partition(":")
    user, at, where = rest.rpartition("@")
    # Whatever stands between the user's name and the last @ is masked, slashes and colons too.
    shown = f"{scheme}:{user.split(':', 1)[0]}:**@{where}" if at and ":" in user else url
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    expected = _FORMS.get(scheme, "scheme://..., such as redis://host:port/db or sqlite:///path/of/anarchon.db")
    return ConfigError(f"anarchon_backend {shown!r} is a malformed URL: expected {expected}")


def _url_backend(app: Any, url: str, settings: Settings, timeout: float | None) -> Backend:
    malformed = _malformed(url)
    if malformed is not None:
        raise malformed
    scheme = url.split("://", 1)[0]
    if scheme == "memory":
        shared = (settings.prefix, settings.slot_ttl_ms)
        if shared not in _MEMORY:
            _MEMORY[shared] = MemoryBackend(settings.prefix, settings.slot_ttl_ms)
        return _MEMORY[shared]
    if scheme in _STORES:
        return _store(url, scheme, settings, timeout)
    if scheme in AMQP_SCHEMES:
        return RabbitMQBackend(
            url, prefix=settings.prefix, slot_ttl_ms=settings.slot_ttl_ms, **app_connection_options(app)
        )
    raise ConfigError(
        f"anarchon_backend {scheme}:// is not supported: use an amqp://, redis://, sentinel:// or "
        "postgresql:// URL, sqlite:///file.db (the instances of one host), memory:// (one process, for tests) "
        "or a Backend instance"
    )


def _redis_url_of(connection: Any) -> str:
    """The URL of the app's Redis broker for the Redis backend: with Sentinel, every sentinel of
    the broker's URL, and the master's name from ``broker_transport_options``."""
    if connection.transport_cls != SENTINEL_SCHEME:
        return str(connection.as_uri(include_password=True))
    hosts = connection.alt or [connection.as_uri(include_password=True)]
    url = ";".join(hosts)
    master = connection.transport_options.get("master_name")
    if master and "master_name=" not in url:
        url += f"{'&' if '?' in url else '?'}master_name={master}"
    return url
