"""RedisBackend: runs decided in Redis by one Lua script per batch, on Redis's own clock.

Each job keeps a cursor (``<prefix>cursor.<job>``), the latest slot decided, and a win leaves a
record (``<prefix>run.<job>.<slot>``, kept ``slot_ttl_ms``) naming its instance. A claim wins
while its run has no record and the cursor has not passed it long ago (the rule of
:mod:`.ordered`), all inside one script, so a run decided once is never won again, however late
an instance comes. The script reads ``TIME``, Redis's clock, so an instance whose clock is wrong
can neither win a run early nor win it twice. A claim whose answer was lost with its connection
is made again on a new one, and the script then knows the run was already won by this very
instance.

History is a list per job (``<prefix>history.<job>``), trimmed by size; the instances' job
definitions (see :mod:`.peers`) go through a stream (``<prefix>peers``).

Needs redis-py (``pip install anarchon_celery[redis]``) and Redis 5 or newer.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import BrokerUnavailable, ConfigError
from ..history import EVENTS_PER_RUN, decode_event
from .base import Claim, Outcome
from .leases import RunRecord
from .peers import Peers
from .store import DEFAULT_LEASE_MS, Answer, StoreBackend

__all__ = ["REDIS_SCHEMES", "RedisBackend"]

logger = logging.getLogger(__name__)

REDIS_SCHEMES = ("redis", "rediss")
#: Announcements of job definitions kept in the stream (a few per instance start).
PEERS_KEPT = 1_000

# The store's clock, in the scripts: TIME, as epoch milliseconds (number and text).
_TIME = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_text = t[1] .. string.format('%03d', math.floor(tonumber(t[2]) / 1000))
"""

# KEYS: none (the keys are made from the prefix: one deployment lives on one Redis, not a
# cluster). ARGV: prefix, instance, slot_ttl_ms, recover (1: a run this instance holds already
# counts as won: the answer of an earlier try was lost), lease_ms, then job, slot, deadline (-1:
# none) and backups wanted for each claim. Returns, per claim: "won", "lost", "undecided:<ms>",
# "early:<ms>" or "backup:<ms left on the lease>:<rank>" (lost, and armed as a backup).
_CLAIM = (
    _TIME
    + """
local prefix, instance, ttl, recover, lease = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4] == '1', tonumber(ARGV[5])
local out = {}
local i = 6
while i <= #ARGV do
  local job, slot_text, deadline, wanted = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  local slot = tonumber(slot_text)
  local cursor_key = prefix .. 'cursor.' .. job
  local run_key = prefix .. 'run.' .. job .. '.' .. slot_text
  if deadline >= 0 and now > deadline then
    out[#out + 1] = 'undecided:' .. string.format('%d', now - deadline)
  elseif now < slot then
    out[#out + 1] = 'early:' .. string.format('%d', slot - now)
  else
    local cursor = tonumber(redis.call('GET', cursor_key))
    local run = redis.call('HMGET', run_key, 'holder', 'state', 'backups', 'lease_end_ms', 'deadline_ms')
    if run[1] then  -- decided already
      local run_deadline = tonumber(run[5])
      if recover and run[1] == instance then
        out[#out + 1] = 'won'
      elseif wanted > 0 and run[2] == 'claimed' and (tonumber(run[3]) or 0) < wanted and (tonumber(run[4]) or 0) > 0
          and not (run_deadline and run_deadline >= 0 and now > run_deadline) then
        local rank = redis.call('HINCRBY', run_key, 'backups', 1)
        local left = math.max(0, (tonumber(run[4]) or 0) - now)
        out[#out + 1] = 'backup:' .. string.format('%d', left) .. ':' .. rank
      else
        out[#out + 1] = 'lost'
      end
    elseif cursor and cursor >= slot and now - slot >= math.floor(ttl / 2) then
      out[#out + 1] = 'lost'  -- passed over by the cursor, and its record, had it one, may be gone
    else
      if not cursor or cursor < slot then
        redis.call('SET', cursor_key, slot_text)
      end
      redis.call('HSET', run_key, 'holder', instance, 'token', '1', 'state', 'claimed', 'decided_ms', now_text,
                 'deadline_ms', ARGV[i + 2], 'lease_end_ms', string.format('%d', now + lease), 'backups', '0')
      redis.call('PEXPIRE', run_key, ttl)
      out[#out + 1] = 'won'
    end
  end
  i = i + 4
end
return out
"""
)

# ARGV: prefix, instance, lease_ms, then job and slot for each run. Per run: "won:<token>",
# "held:<ms left>", "done:0" or "late:<ms>" (see leases.take_over).
_TAKE_OVER = (
    _TIME
    + """
local prefix, instance, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])
local out = {}
for i = 4, #ARGV, 2 do
  local run_key = prefix .. 'run.' .. ARGV[i] .. '.' .. ARGV[i + 1]
  local run = redis.call('HMGET', run_key, 'holder', 'token', 'state', 'lease_end_ms', 'deadline_ms')
  local deadline = tonumber(run[5])
  if run[3] ~= 'claimed' or (tonumber(run[4]) or 0) == 0 then  -- (0: won before leases, no token sent)
    out[#out + 1] = 'done:0'
  elseif deadline and deadline >= 0 and now > deadline then
    out[#out + 1] = 'late:' .. string.format('%d', now - deadline)
  elseif now < (tonumber(run[4]) or 0) then
    if run[1] == instance then
      out[#out + 1] = 'won:' .. run[2]
    else
      out[#out + 1] = 'held:' .. string.format('%d', tonumber(run[4]) - now)
    end
  else
    local token = redis.call('HINCRBY', run_key, 'token', 1)
    redis.call('HSET', run_key, 'holder', instance, 'lease_end_ms', string.format('%d', now + lease))
    out[#out + 1] = 'won:' .. token
  end
end
return out
"""
)

# ARGV: prefix, then job, slot and token for each run. Per run: 1 (marked sent) or 0.
_MARK_SENT = """
local prefix = ARGV[1]
local out = {}
for i = 2, #ARGV, 3 do
  local run_key = prefix .. 'run.' .. ARGV[i] .. '.' .. ARGV[i + 1]
  local run = redis.call('HMGET', run_key, 'token', 'state')
  if run[1] ~= ARGV[i + 2] then
    out[#out + 1] = 0
  else
    if run[2] == 'claimed' then
      redis.call('HSET', run_key, 'state', 'sent')
    end
    out[#out + 1] = 1
  end
end
return out
"""

# ARGV: prefix, job, slot, token, redelivered (1 or 0). Returns "unknown", "yes" or "no".
_START = """
local run_key = ARGV[1] .. 'run.' .. ARGV[2] .. '.' .. ARGV[3]
local run = redis.call('HMGET', run_key, 'token', 'state')
if not run[1] then
  return 'unknown'
elseif run[1] ~= ARGV[4] then
  return 'no'
elseif run[2] == 'started' then
  if ARGV[5] == '1' then return 'yes' else return 'no' end
end
redis.call('HSET', run_key, 'state', 'started')
return 'yes'
"""

# ARGV: prefix, instance, then job, slot and token for each run. Each run given back is published
# on <prefix>handback as "<job> <slot>"; returns how many were given back.
_HAND_BACK = (
    _TIME
    + """
local prefix, instance = ARGV[1], ARGV[2]
local given = 0
for i = 3, #ARGV, 3 do
  local run_key = prefix .. 'run.' .. ARGV[i] .. '.' .. ARGV[i + 1]
  local run = redis.call('HMGET', run_key, 'holder', 'token', 'state', 'lease_end_ms')
  if run[1] == instance and run[2] == ARGV[i + 2] and run[3] == 'claimed' then
    if (tonumber(run[4]) or 0) > now then
      redis.call('HSET', run_key, 'lease_end_ms', string.format('%d', now))
    end
    redis.call('PUBLISH', prefix .. 'handback', ARGV[i] .. ' ' .. ARGV[i + 1])
    given = given + 1
  end
end
return given
"""
)


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
        lease_ms: how long a winner holds its run before the run's backups may take it over
            (see :mod:`.leases`).
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
        lease_ms: int = DEFAULT_LEASE_MS,
    ) -> None:
        super().__init__(prefix, slot_ttl_ms, timeout, lease_ms)
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
        self._take_over_script = client.register_script(_TAKE_OVER)
        self._mark_sent_script = client.register_script(_MARK_SENT)
        self._start_script = client.register_script(_START)
        self._hand_back_script = client.register_script(_HAND_BACK)
        self._peers: Peers | None = None
        self._pubsub: Any = None  # subscribed to the leases handed back
        self._heard = "$"
        self._checked = False
        self._version_text = "?"

    @classmethod
    def from_url(
        cls, url: str, *, prefix: str = "cron.", slot_ttl_ms: int = 300_000, lease_ms: int = DEFAULT_LEASE_MS
    ) -> RedisBackend:
        return cls(url, prefix=prefix, slot_ttl_ms=slot_ttl_ms, lease_ms=lease_ms)

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

    def _decide(self, claims: Sequence[Claim], instance: str, recover: bool) -> list[Answer]:
        """One script for the batch (see ``_CLAIM``)."""
        args: list[Any] = [self.prefix, instance, self.slot_ttl_ms, "1" if recover else "0", self.lease_ms]
        for claim in claims:
            deadline = claim.deadline_ms if claim.deadline_ms is not None else -1
            args += [claim.job, str(claim.slot), str(deadline), str(claim.backups)]
        results = []
        for answer in self._claim_script(args=args):
            outcome, *amounts = answer.decode().split(":")
            if outcome == "backup":
                results.append(Answer(Outcome.LOST, int(amounts[0]), int(amounts[1])))
            else:
                results.append(Answer(Outcome(outcome), int(amounts[0]) if amounts else 0))
        return results

    def _take_over(self, claims: Sequence[Claim], instance: str) -> list[tuple[str, int]]:
        args: list[Any] = [self.prefix, instance, self.lease_ms]
        for claim in claims:
            args += [claim.job, str(claim.slot)]
        answers = []
        for answer in self._take_over_script(args=args):
            kind, _, value = answer.decode().partition(":")
            answers.append((kind, int(value)))
        return answers

    def _mark_sent(self, runs: Sequence[tuple[str, int, int]]) -> list[bool]:
        args: list[Any] = [self.prefix]
        for job, slot, token in runs:
            args += [job, str(slot), str(token)]
        return [bool(marked) for marked in self._mark_sent_script(args=args)]

    def _start(self, job: str, slot: int, token: int, redelivered: bool) -> bool | None:
        answer = self._start_script(args=[self.prefix, job, str(slot), str(token), "1" if redelivered else "0"])
        return {b"yes": True, b"no": False}.get(answer)

    def _hand_back(self, runs: Sequence[tuple[str, int, int]], instance: str) -> int:
        args: list[Any] = [self.prefix, instance]
        for job, slot, token in runs:
            args += [job, str(slot), str(token)]
        return int(self._hand_back_script(args=args))

    def _handed_back(self) -> list[tuple[str, int]]:
        pubsub = self._pubsub
        if pubsub is None:
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(f"{self.prefix}handback")
            except BaseException:
                pubsub.close()
                raise
            self._pubsub = pubsub
            return []  # from now on
        found = []
        try:
            while (message := pubsub.get_message(timeout=0)) is not None:
                job, _, slot = message["data"].decode().rpartition(" ")
                if job and slot.isdigit():
                    found.append((job, int(slot)))
        except BaseException:
            self._pubsub = None
            pubsub.close()
            raise
        return found

    def run_record(self, job: str, slot: int) -> RunRecord | None:
        """The record of a run won, while it is kept: for tests and diagnostics."""
        fields = self.client.hgetall(f"{self.prefix}run.{job}.{slot}")
        if not fields:
            return None
        get = {key.decode(): value.decode() for key, value in fields.items()}
        deadline = int(get["deadline_ms"])
        return RunRecord(
            get["holder"],
            int(get["token"]),
            get["state"],
            int(get.get("lease_end_ms", 0)),
            None if deadline < 0 else deadline,
            int(get.get("backups", 0)),
        )

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
            self._claim_script(args=[self.prefix, "check", self.slot_ttl_ms, "0", self.lease_ms])
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
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                self._pubsub.close()
            self._pubsub = None
        if self.owned:
            self.client.close()
