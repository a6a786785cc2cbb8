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
import re
import secrets
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from .. import docs
from ..errors import BrokerError, BrokerRefused, BrokerUnavailable, ConfigError
from .base import Claim, Outcome
from .leases import RunRecord
from .peers import Peers
from .redis_births import RedisBirths
from .redis_busy import RedisOverlap, freed_of
from .redis_client import (
    OPTIONS,
    REDIS_SCHEMES,
    describe_client,
    login_refusal,
    make_client,
    server_info,
    split_options,
)
from .redis_defs import RedisDefinitions
from .redis_history import RedisHistory
from .redis_pauses import RedisPauses
from .redis_persistence import RedisPersistence
from .redis_scripts import CLAIM, HAND_BACK, MARK_SENT, TAKE_OVER
from .store import DEFAULT_LEASE_MS, Answer, StoreBackend

__all__ = ["REDIS_SCHEMES", "NotReplicated", "RedisBackend"]

logger = logging.getLogger(__name__)

#: Announcements of job definitions kept in the stream (a few per instance start).
PEERS_KEPT = 1_000


def _redis() -> Any:
    try:
        import redis
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigError("the Redis backend needs redis-py: pip install 'anarchon_celery[redis]'") from exc
    return redis


class NotReplicated(Exception):
    """Fewer replicas than ``wait_replicas`` acknowledged a decision within ``wait_timeout_ms``:
    the decision may be lost in a failover, so its answer counts as lost (asked again)."""


class RedisBackend(
    RedisDefinitions, RedisPauses, RedisBirths, RedisHistory, RedisOverlap, RedisPersistence, StoreBackend
):
    """Decides runs in Redis (5 or newer), shared by instances on any number of hosts.

    Arguments:
        url: ``redis://[:password@]host:port/db`` (``rediss://`` for TLS), or the master behind
            Redis Sentinel: ``sentinel://[:password@]host:port/db;sentinel://host:port/db?master_name=NAME``
            (see :mod:`.redis_client`). ``?wait_replicas=N&wait_timeout_ms=T&allow_eviction=1`` in
            the URL set the arguments of those names below.
        client: your own ``redis.Redis`` (or ``Sentinel(...).master_for(...)``); you keep
            ownership, it is never closed here. Give it a ``socket_timeout``, or a Redis that
            stops answering can hold a claim up, and no retries (``retry=Retry(NoBackoff(), 0)``):
            redis-py sending a claim again by itself after its answer was lost makes the run lost
            rather than won.
        prefix: prefix of every key.
        slot_ttl_ms: how long the record of a run won is kept. Runs are never decided twice
            whatever it is: each job's cursor says so.
        timeout: seconds any answer of Redis is awaited (connect and read).
        lease_ms: how long a winner holds its run before the run's backups may take it over
            (see :mod:`.leases`).
        wait_replicas: a win (or a takeover) counts only once this many replicas have it
            (``WAIT``), so that a failover to a replica cannot forget it and let the run be won
            again. 0 (the default): not waited for. A win not acknowledged within
            ``wait_timeout_ms`` is asked again (found won, or won again on the new master) until
            the run's deadline: with fewer replicas up than this, no run is sent.
        wait_timeout_ms: how long a decision waits for its replicas.
        allow_eviction: start on a Redis whose ``maxmemory-policy`` evicts keys when memory is
            full, with a warning. An evicted record or cursor lets a run be won again, so by
            default such a Redis is refused at start (set ``maxmemory-policy noeviction``).
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
        wait_replicas: int | None = None,
        wait_timeout_ms: int | None = None,
        allow_eviction: bool | None = None,
    ) -> None:
        super().__init__(prefix, slot_ttl_ms, timeout, lease_ms)
        redis = _redis()
        self._sentinel: Any = None
        options: dict[str, int] = {}
        if client is None:
            if not isinstance(url, str) or url.split("://", 1)[0] not in REDIS_SCHEMES:
                raise ConfigError(f"RedisBackend needs a redis://, rediss:// or sentinel:// URL, not {url!r}")
            url, options = split_options(url)
            client, self._sentinel = make_client(redis, url, self.timeout)
            self.owned = True
        elif not isinstance(client, redis.Redis):
            raise ConfigError(f"client must be a redis.Redis, not {type(client).__name__}")
        else:
            self.owned = False
        self.wait_replicas = _count("wait_replicas", wait_replicas, options)
        self.wait_timeout_ms = _count("wait_timeout_ms", wait_timeout_ms, options)
        allowed = _count("allow_eviction", None if allow_eviction is None else int(allow_eviction), options)
        if allowed > 1:
            raise ConfigError(f"allow_eviction in the Redis URL must be 0 or 1, not {allowed}")
        self.allow_eviction = bool(allowed)
        self.client = client
        self._errors: tuple[type[BaseException], ...] = (redis.ConnectionError, redis.TimeoutError, OSError)
        self._refused = redis.ResponseError
        #: Refusals that may pass by themselves: a read-only replica in a failover, out of memory.
        self._passing: tuple[type[BaseException], ...] = (
            redis.exceptions.ReadOnlyError,
            *((redis.exceptions.OutOfMemoryError,) if hasattr(redis.exceptions, "OutOfMemoryError") else ()),
        )
        self._login_refused = redis.AuthenticationError
        self.answer_lost_errors = (*self._errors, NotReplicated)
        self.failure_errors = (redis.ResponseError,)  # a read-only replica, out of memory, scripts refused
        scripts = [client.register_script(script) for script in (CLAIM, TAKE_OVER, MARK_SENT, HAND_BACK)]
        self._claim_script, self._take_over_script, self._mark_sent_script, self._hand_back_script = scripts
        self._register_overlap()
        self._peers: Peers | None = None
        self._pubsub: Any = None  # subscribed to the leases handed back
        self._heard = "$"
        self._checked = False
        self._version_text = "?"

    # -- the connection -------------------------------------------------------------------------

    def open(self) -> None:
        if self._checked:
            return
        try:
            info = self.client.info("server")
        except self._login_refused as exc:  # a ConnectionError to redis-py, but no outage
            raise BrokerRefused(login_refusal(self.describe(), self.client, exc)) from exc
        except self._errors as exc:
            raise BrokerUnavailable(f"{self.describe()} does not answer ({type(exc).__name__}: {exc})") from exc
        except self._refused as exc:
            raise self._refusal("serve this backend", exc) from exc
        version = tuple(int(part) for part in str(info.get("redis_version", "0")).split(".")[:2] if part.isdigit())
        if version < (5, 0):
            found = info.get("redis_version")
            raise ConfigError(f"{self.describe()} is Redis {found}: anarchon_celery needs Redis 5 or newer")
        self._version_text = str(info.get("redis_version"))
        self._check_eviction()
        self._check_replicas()
        self._read_persistence((self._refused, *self._errors))
        self._checked = True

    def _check_replicas(self) -> None:
        """With ``wait_replicas``: say when fewer replicas are connected, since no run is won then."""
        connected = server_info(self.client, "replication", "connected_slaves", (self._refused, *self._errors))
        if self.wait_replicas and connected is not None and int(connected) < self.wait_replicas:
            logger.error(
                "anarchon: %s has %s replica(s) connected, fewer than wait_replicas (%d): no run is won "
                "until enough are (each is asked again until its deadline)",
                self.describe(),
                connected,
                self.wait_replicas,
            )

    def _check_eviction(self) -> None:
        """An evicted record or cursor lets a claim win its run again: refuse a Redis that evicts
        keys (BrokerRefused), unless ``allow_eviction``; then say so."""
        policy = server_info(self.client, "memory", "maxmemory_policy", (self._refused, *self._errors))
        if not policy or policy == "noeviction":
            return  # (or INFO refused, by an ACL: nothing to read)
        risk = (
            f"{self.describe()} evicts keys when its memory is full (maxmemory-policy {policy}): a run "
            "whose record or cursor is evicted can be won again, and run twice"
        )
        if not self.allow_eviction:
            raise BrokerRefused(
                f"{risk}. Set maxmemory-policy noeviction (CONFIG SET maxmemory-policy noeviction, and "
                "in redis.conf), or accept the risk with allow_eviction=1 in the backend's URL "
                f"(see {docs.REDIS_NEEDS})"
            )
        logger.warning("anarchon: %s; allow_eviction is set, so the backend runs on it", risk)

    # -- claims ---------------------------------------------------------------------------------

    def _decide(self, claims: Sequence[Claim], instance: str, recover: Collection[tuple[str, int]]) -> list[Answer]:
        """One script for the batch (see :data:`.redis_scripts.CLAIM`), its claims in job and slot
        order (as :func:`.ordered.decide` takes them); the answers in the claims' order."""
        order = sorted(range(len(claims)), key=lambda i: (claims[i].job, claims[i].slot))
        flags = "".join("1" if (claims[i].job, claims[i].slot) in recover else "0" for i in order)
        args: list[Any] = [self.prefix, instance, self.slot_ttl_ms, flags or "0", self.lease_ms]
        for claim in (claims[i] for i in order):
            deadline = claim.deadline_ms if claim.deadline_ms is not None else -1
            args += [claim.job, str(claim.slot), str(deadline), str(claim.backups), claim.key, claim.kind]
            args += [claim.overlap, str(claim.queued_ms), str(claim.version)]
        answers = self._decided(
            self._claim_script, args, "claims", lambda answer: answer.startswith((b"won", b"not:", b"paused"))
        )
        results: list[Answer] = [Answer(Outcome.UNDECIDED)] * len(claims)
        for i, answer in zip(order, answers):
            results[i] = self._answer(answer)
        self._freed += [found for answer in answers[len(order) :] if (found := freed_of(answer)) is not None]
        return results

    @staticmethod
    def _answer(answer: bytes) -> Answer:
        """One claim's answer from the script."""
        outcome, *amounts = answer.decode().split(":")
        if outcome == "backup":
            return Answer(Outcome.LOST, int(amounts[0]), int(amounts[1]))
        if outcome == "won":
            return Answer(Outcome.WON, after=int(amounts[0]) if amounts else None)
        if outcome == "not":  # won, not sent: its job is busy
            return Answer(Outcome.LOST, after=int(amounts[1]) if len(amounts) > 1 else None, verdict=amounts[0])
        return Answer(Outcome(outcome), int(amounts[0]) if amounts else 0)

    def _take_over(self, claims: Sequence[Claim], instance: str) -> list[tuple[str, int]]:
        args: list[Any] = [self.prefix, instance, self.lease_ms]
        for claim in claims:
            args += [claim.job, str(claim.slot)]
        answers = []
        for answer in self._decided(self._take_over_script, args, "takeovers", lambda a: a.startswith(b"won:")):
            kind, _, value = answer.decode().partition(":")
            answers.append((kind, int(value)))
        return answers

    def _decided(self, script: Any, args: list[Any], what: str, won: Callable[[bytes], bool]) -> list[bytes]:
        """The answers of a deciding script. With ``wait_replicas``, the script and Redis's ``WAIT``
        go in one pipeline, so that WAIT waits for this very connection's writes; a win that fewer
        replicas acknowledged raises NotReplicated."""
        if not self.wait_replicas:
            return list(script(args=args))
        pipe = self.client.pipeline(transaction=False)
        script(args=args, client=pipe)
        pipe.execute_command("WAIT", self.wait_replicas, self.wait_timeout_ms)
        answers, acknowledged = pipe.execute()
        if int(acknowledged) < self.wait_replicas and any(won(answer) for answer in answers):
            raise NotReplicated(
                f"{what} acknowledged by {acknowledged} replica(s) of the {self.wait_replicas} wanted "
                f"(wait_replicas) within {self.wait_timeout_ms} ms"
            )
        return list(answers)

    def _mark_sent(self, runs: Sequence[tuple[str, int, int]]) -> list[bool]:
        args: list[Any] = [self.prefix]
        for job, slot, token in runs:
            args += [job, str(slot), str(token)]
        return [bool(marked) for marked in self._mark_sent_script(args=args)]

    def _hand_back(self, runs: Sequence[tuple[str, int, int]], instance: str) -> int:
        args: list[Any] = [self.prefix, instance]
        for job, slot, token in runs:
            args += [job, str(slot), str(token)]
        return int(self._hand_back_script(args=args))

    def _mark_backfilled(self, job: str, slots: Sequence[int], instance: str) -> list[bool]:
        """A field per run in the hash ``<prefix>backfill.<job>``, set unless it is there."""
        key = f"{self.prefix}backfill.{job}"
        with self.client.pipeline(transaction=True) as pipe:
            for slot in slots:
                pipe.hsetnx(key, str(slot), instance)
            return [bool(added) for added in pipe.execute()]

    def _unmark_backfilled(self, job: str, slots: Sequence[int]) -> None:
        if slots:
            self.client.hdel(f"{self.prefix}backfill.{job}", *(str(slot) for slot in slots))

    def _backfilled(self, job: str, slots: Sequence[int]) -> set[int]:
        if not slots:
            return set()
        found = self.client.hmget(f"{self.prefix}backfill.{job}", [str(slot) for slot in slots])
        return {slot for slot, value in zip(slots, found) if value is not None}

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
            with self._outages.asking("read the instances' announcements"):
                found = self.client.xread({f"{self.prefix}peers": self._heard}, count=100)
            for _, entries in found:
                for entry_id, fields in entries:
                    self._heard = entry_id.decode()
                    peers.heard(fields.get(b"announcement", b""))
            if peers.answer_due:
                with self._outages.asking("announce this instance's jobs"):
                    self._announce(hello=False)
        except (self._refused, *self._errors) as exc:
            logger.debug("anarchon: announcements not shared through %s (%s)", self.describe(), exc)

    # -- what removed jobs leave ----------------------------------------------------------------

    def _job_keys(self, pattern_job: str) -> dict[str, list[bytes]]:
        """The keys of jobs matching ``pattern_job`` (a glob), by job: cursor, catch-up key, run records, history."""
        escaped = re.sub(r"([\\*?\[\]])", r"\\\1", self.prefix)
        found: dict[str, list[bytes]] = {}
        for kind in ("cursor", "born", "catchup", "busy", "pause", "run", "history", "backfill"):
            for key in self.client.scan_iter(match=f"{escaped}{kind}.{pattern_job}", count=1000):
                rest = key.decode()[len(self.prefix) + len(kind) + 1 :]
                found.setdefault(rest.split(".", 1)[0], []).append(key)
        return found

    def _store_id(self) -> str:
        key = f"{self.prefix}store-id"  # under the prefix: an ACL may allow no other key
        self.client.set(key, secrets.token_hex(8), nx=True)
        value = self.client.get(key)
        return value.decode() if isinstance(value, bytes) else str(value)

    def jobs_with_state(self, prefix: str, jobs: Sequence[str]) -> list[str]:
        try:
            with self.client.pipeline(transaction=False) as pipe:
                for job in jobs:
                    pipe.exists(f"{prefix}cursor.{job}")
                counts = pipe.execute()
        except (self._refused, *self._errors) as exc:
            raise BrokerUnavailable(f"cannot look up jobs in {self.describe()}: {exc}") from exc
        return sorted(job for job, count in zip(jobs, counts) if count)

    def stored_jobs(self) -> list[str]:
        try:
            return sorted(self._job_keys("*"))
        except (self._refused, *self._errors) as exc:
            raise BrokerUnavailable(f"cannot list the jobs in {self.describe()}: {exc}") from exc

    def forget_job(self, job: str) -> None:
        try:
            keys = self._job_keys(f"{job}*").get(job, [])  # "job*": run keys are job.slot
            if keys:
                self.client.delete(*keys)
            self.client.srem(f"{self.prefix}paused", job)
        except (self._refused, *self._errors) as exc:
            raise BrokerUnavailable(f"cannot delete job {job!r} from {self.describe()}: {exc}") from exc

    def check_claims(self) -> None:
        """Run the claim script on nothing: scripts disabled, a read-only replica or an ACL
        without EVALSHA fail here."""
        try:
            self._claim_script(args=[self.prefix, "check", self.slot_ttl_ms, "0", self.lease_ms])
            self.client.set(f"{self.prefix}check", b"1", px=1000)
        except self._refused as exc:
            raise self._refusal("decide claims", exc) from exc
        except self._errors as exc:
            raise BrokerUnavailable(f"{self.describe()} cannot decide claims: {exc}") from exc

    def _refusal(self, doing: str, exc: BaseException) -> BrokerError:
        """An error Redis answered with: BrokerRefused unless it may pass by itself (a replica
        read-only during a failover, memory full)."""
        text = f"{self.describe()} cannot {doing}: {exc}"
        if isinstance(exc, self._passing):
            return BrokerUnavailable(text)
        return BrokerRefused(
            f"{text}. Its user needs scripts and every command on the keys and channels under the "
            f"prefix (the ACL '+@all ~{self.prefix}* &{self.prefix}*', or more)"
        )

    def store_version(self) -> str:
        """What the store is, for ``check`` (after :meth:`open`)."""
        return f"Redis {self._version_text}"

    def describe(self) -> str:
        return f"{describe_client(self.client)} (prefix {self.prefix!r})"

    def close(self) -> None:
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                self._pubsub.close()
            self._pubsub = None
        if self.owned:
            self.client.close()
            if self._sentinel is not None:
                self._sentinel.close()


def _count(name: str, given: int | None, options: dict[str, int]) -> int:
    """The value of ``wait_replicas`` or ``wait_timeout_ms``: the argument, else the URL's, else
    the default; an integer >= 0."""
    if given is not None and name in options and options[name] != given:
        raise ConfigError(f"{name} is {given!r} but the Redis URL says {options[name]!r}: give it once")
    value = given if given is not None else options.get(name, OPTIONS[name])
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{name} must be an integer >= 0, not {value!r}")
    return value
