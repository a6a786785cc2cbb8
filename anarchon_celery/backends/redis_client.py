"""The Redis backend's client made from a URL, and named in logs: one server (``redis://``,
``rediss://``) or the master behind Redis Sentinel (``sentinel://``, as Celery writes it).

A Sentinel URL lists every sentinel, ``;``-separated, and names the master's service::

    sentinel://:password@10.0.0.1:26379/0;sentinel://:password@10.0.0.2:26379/0?master_name=mymaster

The password (and user name), if any, are the master's; the sentinels are asked without one (give
a client of your own, ``RedisBackend(client=Sentinel(...).master_for(...))``, for sentinels that
need one). Query parameters of ours go with any of these URLs and are taken out of it before
redis-py reads it: ``wait_replicas``, ``wait_timeout_ms`` and ``allow_eviction`` (see
:class:`~.redis.RedisBackend`).
"""

from __future__ import annotations

from typing import Any, NamedTuple
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from ..errors import ConfigError, clause

__all__ = [
    "REDIS_SCHEMES",
    "SENTINEL_SCHEME",
    "Made",
    "describe_client",
    "login_refusal",
    "make_client",
    "server_info",
    "split_options",
]

SENTINEL_SCHEME = "sentinel"
#: The URL schemes of the Redis backend.
REDIS_SCHEMES = ("redis", "rediss", SENTINEL_SCHEME)
#: Query parameters of ours, with their defaults.
OPTIONS = {"wait_replicas": 0, "wait_timeout_ms": 1_000, "allow_eviction": 0}


class Made(NamedTuple):
    """A client made from a URL, with the Sentinel object behind it (None: one server)."""

    client: Any
    sentinel: Any


def split_options(url: str) -> tuple[str, dict[str, int]]:
    """``url`` without our query parameters, and their values (each an integer >= 0)."""
    parts = urlsplit(url)
    kept, ours = [], {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in OPTIONS:
            if not value.isdigit():
                raise ConfigError(f"{key} in the Redis URL must be an integer >= 0, not {value!r}")
            ours[key] = int(value)
        else:
            kept.append((key, value))
    return urlunsplit(parts._replace(query=urlencode(kept))), ours


def make_client(redis: Any, url: str, timeout: float) -> Made:
    """A client for ``url`` (``redis://``, ``rediss://`` or ``sentinel://``) that waits at most
    ``timeout`` seconds for any answer and never sends a command again by itself: a claim's
    script sent again after its answer was lost would find its own win and call it lost (the
    backend makes a claim again itself, knowingly)."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    options: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),
        "decode_responses": False,
    }
    if url.split("://", 1)[0] != SENTINEL_SCHEME:
        return Made(redis.Redis.from_url(url, **options), None)
    sentinels, master, db, username, password = _parse_sentinel_url(url)
    from redis.sentinel import Sentinel

    sentinel = Sentinel(
        sentinels,
        sentinel_kwargs={"socket_timeout": timeout, "socket_connect_timeout": timeout, "retry": Retry(NoBackoff(), 0)},
    )
    client = sentinel.master_for(master, db=db, username=username, password=password, **options)
    return Made(client, sentinel)


def _parse_sentinel_url(url: str) -> tuple[list[tuple[str, int]], str, int, str | None, str | None]:
    """The sentinels, the master's service name, its database, user name and password."""
    sentinels: list[tuple[str, int]] = []
    master = None
    db, username, password = 0, None, None
    for chunk in url.split(";"):
        parts = urlsplit(chunk.strip())
        if parts.scheme != SENTINEL_SCHEME or not parts.hostname:
            raise ConfigError(
                f"{_shown(chunk)} is not a sentinel://host:port URL: a Sentinel URL lists every sentinel as "
                "sentinel://[:password@]host:port[/db], ';'-separated, with ?master_name=NAME"
            )
        sentinels.append((parts.hostname, parts.port or 26379))
        query = dict(parse_qsl(parts.query))
        master = query.get("master_name", master)
        if parts.path.strip("/"):
            if not parts.path.strip("/").isdigit():
                raise ConfigError(f"the database of {_shown(chunk)} must be a number, not {parts.path!r}")
            db = int(parts.path.strip("/"))
        if parts.password is not None:
            username = unquote(parts.username) if parts.username else None
            password = unquote(parts.password)
    if not master:
        raise ConfigError(
            f"{_shown(url)} names no master: add ?master_name=NAME, the name the sentinels monitor it by "
            "('sentinel monitor NAME host port quorum' in their configuration)"
        )
    return sentinels, master, db, username, password


def _shown(url: str) -> str:
    """``url`` (or each of its ``;``-separated URLs) with its password masked, for errors and logs."""
    shown = []
    for chunk in url.split(";"):
        parts = urlsplit(chunk)
        if parts.password is not None:
            chunk = urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":**@", 1)))
        shown.append(chunk)
    return ";".join(shown)


def describe_client(client: Any) -> str:
    """Where ``client`` decides runs, without a password: ``Redis at redis://host:port/db``, or
    ``Redis master 'name' (now host:port) through Sentinel host:port,host:port, database db``."""
    pool = client.connection_pool
    kwargs = pool.connection_kwargs
    manager = getattr(pool, "sentinel_manager", None)
    if manager is not None:
        sentinels = ",".join(
            f"{s.connection_pool.connection_kwargs.get('host', '?')}:{s.connection_pool.connection_kwargs.get('port')}"
            for s in manager.sentinels
        )
        now = getattr(getattr(pool, "proxy", None), "master_address", None)
        at = f" (now {now[0]}:{now[1]})" if now else ""
        return f"Redis master {pool.service_name!r}{at} through Sentinel {sentinels}, database {kwargs.get('db', 0)}"
    where = kwargs.get("path") or f"{kwargs.get('host', '?')}:{kwargs.get('port', 6379)}"
    scheme = "rediss" if "SSL" in getattr(pool.connection_class, "__name__", "") else "redis"
    return f"Redis at {scheme}://{where}/{kwargs.get('db', 0)}"


def login_refusal(where: str, client: Any, exc: BaseException) -> str:
    """The error for a login that ``client``'s Redis refused (``exc``, redis-py's
    AuthenticationError; ``where``: the backend as its logs name it, without a password). Without
    a password in the URL, Redis's own answer (to redis-py's HELLO, or AUTH with a user and no
    password) says nothing a reader can act on, and is left out; with one, it is kept."""
    kwargs = client.connection_pool.connection_kwargs
    user = kwargs.get("username")
    form = "redis://[USER]:PASSWORD@host:port/db"
    if kwargs.get("password") is None:
        whose = f" of user {user!r}" if user else ""
        return (
            f"{where} refused the login: authentication failed, Redis asks for a password and the URL "
            f"gives none. Give the password{whose} in the URL, {form}"
        )
    who = f"user {user!r}" if user else "the default user"
    return (
        f"{where} refused the login: authentication failed for {who} ({clause(exc)}). Give the right "
        f"password (and user) in the URL, {form}"
    )


def server_info(client: Any, section: str, field: str, errors: tuple[type[BaseException], ...]) -> str | None:
    """One field of the server's ``INFO section``, as text; None when it is missing or INFO is
    refused (an ACL) or fails (one of ``errors``)."""
    try:
        value = client.info(section).get(field)
    except errors:
        return None
    if isinstance(value, bytes):
        value = value.decode()
    return None if value is None else str(value)
