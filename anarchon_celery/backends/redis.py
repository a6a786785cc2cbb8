"""RedisBackend: runs decided in Redis by one Lua script per batch, on Redis's own clock.

Each job keeps a cursor (``<prefix>cursor.<job>``), the latest slot decided: a claim wins only
while its slot is past the cursor, which moves to it, all inside one script, so a run decided
once is never won again, however late an instance comes. The script reads ``TIME``, Redis's
clock, so an instance whose clock is wrong can neither win a run early nor win it twice. A win
leaves a record (``<prefix>run.<job>.<slot>``, kept ``slot_ttl_ms``) naming its instance: a claim
whose answer was lost with its connection is made again on a new one, and the script then knows
the run was already won by this very instance.

History is a list per job (``<prefix>history.<job>``), trimmed by size; the instances' job
definitions (see :mod:`.peers`) go through a stream (``<prefix>peers``).

Needs redis-py (``pip install anarchon_celery[redis]``) and Redis 5 or newer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import BrokerUnavailable, ConfigError
from ..history import EVENTS_PER_RUN, decode_event
from .base import Claim, Outcome
from .peers import Peers
from .store import StoreBackend

__all__ = ["REDIS_SCHEMES", "RedisBackend"]

logger = logging.getLogger(__name__)

REDIS_SCHEMES = ("redis", "rediss")
#: Announcements of job definitions kept in the stream (a few per instance start).
PEERS_KEPT = 1_000

# KEYS: none (the keys are made from the prefix: one deployment lives on one Redis, not a
# cluster). ARGV: prefix, instance, slot_ttl_ms, recover (1: a run this instance holds already
# counts as won: the answer of an earlier try was lost), then job, slot, deadline (-1: none)
# for each claim. Returns, per claim: "won", "lost", "undecided" or "early:<ms>".
_CLAIM = """
local prefix, instance, ttl, recover = ARGV[1], ARGV[2], ARGV[3], ARGV[4] == '1'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_text = t[1] .. string.format('%03d', math.floor(tonumber(t[2]) / 1000))
local out = {}
local i = 5
while i <= #ARGV do
  local job, slot_text, deadline = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local slot = tonumber(slot_text)
  local cursor_key = prefix .. 'cursor.' .. job
  local run_key = prefix .. 'run.' .. job .. '.' .. slot_text
  if deadline >= 0 and now > deadline then
    out[#out + 1] = 'undecided:' .. string.format('%d', now - deadline)
  elseif now < slot then
    out[#out + 1] = 'early:' .. string.format('%d', slot - now)
  else
    local cursor = tonumber(redis.call('GET', cursor_key))
    if cursor and cursor >= slot then
      if recover and redis.call('HGET', run_key, 'holder') == instance then
        out[#out + 1] = 'won'
      else
        out[#out + 1] = 'lost'
      end
    else
      redis.call('SET', cursor_key, slot_text)
      redis.call('HSET', run_key, 'holder', instance, 'token', '1', 'state', 'claimed', 'decided_ms', now_text,
                 'deadline_ms', ARGV[i + 2])
      redis.call('PEXPIRE', run_key, ttl)
      out[#out + 1] = 'won'
    end
  end
  i = i + 3
end
return out
"""


def _redis() -> Any:
    try:
        import redis
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigError("the Redis backend needs redis-py: pip install 'anarchon_celery[redis]'") from exc
    return redis


class RedisBackend(StoreBackend):
    """Decides runs in Redis (5 or newer), shared by instances on any number of hosts.

    Arguments:
        url: ``redis://[:password@]host:port/db`` (``rediss://`` for TLS).
        client: your own ``redis.Redis``; you keep ownership, it is never closed here. Give it a
            ``socket_timeout``, or a Redis that stops answering can hold a claim up, and no
            retries (``retry=Retry(NoBackoff(), 0)``): redis-py sending a claim again by itself
            after its answer was lost makes the run lost rather than won.
        prefix: prefix of every key.
        slot_ttl_ms: how long the record of a run won is kept. Runs are never decided twice
            whatever it is: each job's cursor says so.
        timeout: seconds any answer of Redis is awaited (connect and read).
    """

    clock_name = "Redis's clock"

    def __init__(
        self,
        url: str | None = "redis://localhost:6379/0",
        *,
        client: Any = None,
        prefix: str = "cron.",
        slot_ttl_ms: int = 300_000,
        timeout: float = 5.0,
    ) -> None:
        super().__init__(prefix, slot_ttl_ms, timeout)
        redis = _redis()
        if client is None:
            if not isinstance(url, str) or url.split("://", 1)[0] not in REDIS_SCHEMES:
                raise ConfigError(f"RedisBackend needs a redis:// or rediss:// URL, not {url!r}")
            from redis.backoff import NoBackoff
            from redis.retry import Retry

            # No retry of ours behind our back: a claim's script sent again after its answer was
            # lost would find its own win and call it lost. claim() tries again itself, knowingly.
            client = redis.Redis.from_url(
                url,
                socket_timeout=self.timeout,
                socket_connect_timeout=self.timeout,
                retry=Retry(NoBackoff(), 0),
                decode_responses=False,
            )
            self.owned = True
        elif not isinstance(client, redis.Redis):
            raise ConfigError(f"client must be a redis.Redis, not {type(client).__name__}")
        else:
            self.owned = False
        self.client = client
        self._errors: tuple[type[BaseException], ...] = (redis.ConnectionError, redis.TimeoutError, OSError)
        self._refused = redis.ResponseError
        self.answer_lost_errors = self._errors
        self.failure_errors = (redis.ResponseError,)  # a read-only replica, out of memory, scripts refused
        self._claim_script = client.register_script(_CLAIM)
        self._peers: Peers | None = None
        self._heard = "$"
        self._checked = False
        self._version_text = "?"

    @classmethod
    def from_url(cls, url: str, *, prefix: str = "cron.", slot_ttl_ms: int = 300_000) -> RedisBackend:
        return cls(url, prefix=prefix, slot_ttl_ms=slot_ttl_ms)

    # -- the connection -------------------------------------------------------------------------

    def open(self) -> None:
        if self._checked:
            return
        try:
            info = self.client.info("server")
        except self._errors as exc:
            raise BrokerUnavailable(f"{self.describe()} does not answer ({type(exc).__name__}: {exc})") from exc
        except self._refused as exc:
            raise BrokerUnavailable(f"{self.describe()} refused us: {exc}") from exc
        version = tuple(int(part) for part in str(info.get("redis_version", "0")).split(".")[:2] if part.isdigit())
        if version < (5, 0):
            found = info.get("redis_version")
            raise ConfigError(f"{self.describe()} is Redis {found}: anarchon_celery needs Redis 5 or newer")
        self._version_text = str(info.get("redis_version"))
        self._warn_about_eviction()
        self._checked = True

    def _warn_about_eviction(self) -> None:
        """An evicted cursor could let a late claim win its run again: say so when it can happen."""
        try:
            policy = self.client.config_get("maxmemory-policy").get("maxmemory-policy")
        except (self._refused, *self._errors):
            return  # CONFIG is often disabled on managed Redis: nothing to read
        if isinstance(policy, bytes):
            policy = policy.decode()
        if policy and policy != "noeviction":
            logger.warning(
                "anarchon: %s evicts keys when full (maxmemory-policy %s): an evicted cursor lets a late "
                "instance win a run again. Set maxmemory-policy noeviction",
                self.describe(),
                policy,
            )

    # -- claims ---------------------------------------------------------------------------------

    def _decide(self, claims: Sequence[Claim], instance: str, recover: bool) -> list[tuple[Outcome, int]]:
        """One script for the batch (see ``_CLAIM``)."""
        args: list[Any] = [self.prefix, instance, self.slot_ttl_ms, "1" if recover else "0"]
        for claim in claims:
            args += [claim.job, str(claim.slot), str(claim.deadline_ms if claim.deadline_ms is not None else -1)]
        results = []
        for answer in self._claim_script(args=args):
            outcome, _, amount = answer.decode().partition(":")
            results.append((Outcome(outcome), int(amount or 0)))
        return results

    def holder(self, job: str, slot: int) -> str | None:
        """The instance that won a run, while its record is kept: for tests and diagnostics."""
        value = self.client.hget(f"{self.prefix}run.{job}.{slot}", "holder")
        return value.decode() if value is not None else None

    def store_now_ms(self) -> int:
        """Redis's clock: for tests and ``check``."""
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    # -- instances' definitions -----------------------------------------------------------------

    def share_definitions(self, instance: str, definitions: Mapping[str, Mapping[str, str]]) -> None:
        """Say hello with our definitions on the stream; the instances running answer with theirs
        when they next wake (an announcement of an instance long gone is never read)."""
        self._peers = Peers(instance, definitions)
        try:
            self._heard = self._announce(hello=True)
        except (self._refused, *self._errors) as exc:
            logger.info("anarchon: job definitions not shared through %s (%s)", self.describe(), exc)

    def _announce(self, *, hello: bool) -> str:
        assert self._peers is not None
        self._peers.answer_due = False
        entry = self.client.xadd(
            f"{self.prefix}peers",
            {"announcement": self._peers.announcement(hello=hello)},
            maxlen=PEERS_KEPT,
            approximate=True,
        )
        return entry.decode()

    def maintain(self) -> None:
        peers = self._peers
        if peers is None:
            return
        try:
            found = self.client.xread({f"{self.prefix}peers": self._heard}, count=100)
            for _, entries in found:
                for entry_id, fields in entries:
                    self._heard = entry_id.decode()
                    peers.heard(fields.get(b"announcement", b""))
            if peers.answer_due:
                self._announce(hello=False)
        except (self._refused, *self._errors) as exc:
            logger.debug("anarchon: announcements not shared through %s (%s)", self.describe(), exc)

    # -- history --------------------------------------------------------------------------------

    def record(self, job: str, event: bytes, history_size: int) -> bool:
        return self.record_many([(job, event, history_size)]) == 1

    def record_many(self, events: Sequence[tuple[str, bytes, int]]) -> int:
        kept = [(job, event, size) for job, event, size in events if decode_event(event) is not None]
        if not kept:
            return 0
        pipe = self.client.pipeline(transaction=False)
        for job, event, _ in kept:
            pipe.rpush(f"{self.prefix}history.{job}", event)
        for job, size in {job: size for job, _, size in kept}.items():
            pipe.ltrim(f"{self.prefix}history.{job}", -size * (EVENTS_PER_RUN + 1), -1)
        try:
            pipe.execute()
        except (self._refused, *self._errors) as exc:
            logger.warning("anarchon: %d history event(s) not written to %s (%s)", len(kept), self.describe(), exc)
            return 0
        return len(kept)

    def read_history(self, jobs: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        pipe = self.client.pipeline(transaction=False)
        for job in jobs:
            pipe.lrange(f"{self.prefix}history.{job}", 0, -1)
        try:
            lists = pipe.execute() if jobs else []
        except (self._refused, *self._errors) as exc:
            raise BrokerUnavailable(f"cannot read history from {self.describe()}: {exc}") from exc
        found: dict[str, list[dict[str, Any]]] = {}
        for job, raw in zip(jobs, lists):
            found[job] = [decoded for event in raw if (decoded := decode_event(event)) is not None]
        return found

    def check_claims(self) -> None:
        """Run the claim script on nothing: scripts disabled, a read-only replica or an ACL
        without EVALSHA fail here."""
        try:
            self._claim_script(args=[self.prefix, "check", self.slot_ttl_ms, "0"])
            self.client.set(f"{self.prefix}check", b"1", px=1000)
        except (self._refused, *self._errors) as exc:
            raise BrokerUnavailable(f"{self.describe()} cannot decide claims: {exc}") from exc

    def store_version(self) -> str:
        """What the store is, for ``check`` (after :meth:`open`)."""
        return f"Redis {self._version_text}"

    def describe(self) -> str:
        pool = self.client.connection_pool
        kwargs = pool.connection_kwargs
        where = kwargs.get("path") or f"{kwargs.get('host', '?')}:{kwargs.get('port', 6379)}"
        scheme = "rediss" if "SSL" in getattr(pool.connection_class, "__name__", "") else "redis"
        return f"Redis at {scheme}://{where}/{kwargs.get('db', 0)} (prefix {self.prefix!r})"

    def close(self) -> None:
        if self.owned:
            self.client.close()
