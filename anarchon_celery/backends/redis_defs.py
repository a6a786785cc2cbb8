"""Runtime jobs on Redis (see :mod:`.definitions`): the hash ``<prefix>defs`` holds each runtime
job's definition (the JSON of :meth:`.definitions.JobDef.encode`), and each change is appended to
the stream ``<prefix>changes``, which the instances read from where they last looked. Each change
is one script on Redis's clock, which checks the version it is based on. A part of
:class:`~.redis.RedisBackend`."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .definitions import JobConflict, JobDef
from .redis_busy_scripts import TIME

__all__ = ["PUT", "REMOVE", "RedisDefinitions"]

#: About how many changes the stream keeps (an instance further behind reads every definition).
CHANGES_KEPT = 100_000

_CURRENT = """
local defs = prefix .. 'defs'
local text = redis.call('HGET', defs, job)
local current = nil
if text then
  local ok, d = pcall(cjson.decode, text)
  if ok and type(d) == 'table' then current = tonumber(d['v']) end
end
local expected = tonumber(base)  -- (nil: a new job, or a removal whatever the version)
"""

# ARGV: prefix, job, base ('': a new job), the entry's JSON, who. Returns {'ok', version, time}
# or {'conflict', the version kept ('' : none)}.
PUT = (
    TIME
    + """
local prefix, job, base, entry, by = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
"""
    + _CURRENT
    + f"""
if expected ~= current then return {{'conflict', current and string.format('%d', current) or ''}} end
local version = string.format('%d', (current or 0) + 1)
redis.call('HSET', defs, job, '{{"at":' .. now_text .. ',"by":' .. cjson.encode(by) .. ',"e":' .. entry
  .. ',"v":' .. version .. '}}')
redis.call('XADD', prefix .. 'changes', 'MAXLEN', '~', '{CHANGES_KEPT}', '*', 'job', job, 'v', version)
return {{'ok', version, now_text}}
"""
)

# ARGV: prefix, job, base ('': whatever the version). Returns {'ok', the definition removed} or
# {'conflict', the version kept ('': none)}.
REMOVE = (
    TIME
    + """
local prefix, job, base = ARGV[1], ARGV[2], ARGV[3]
"""
    + _CURRENT
    + f"""
if not current or (expected and expected ~= current) then
  return {{'conflict', current and string.format('%d', current) or ''}}
end
redis.call('HDEL', defs, job)
redis.call('DEL', prefix .. 'pause.' .. job)
redis.call('SREM', prefix .. 'paused', job)
redis.call('XADD', prefix .. 'changes', 'MAXLEN', '~', '{CHANGES_KEPT}', '*', 'job', job, 'v', '0')
return {{'ok', text}}
"""
)


class RedisDefinitions:
    """The runtime job steps of the Redis backend, which gives ``client`` and ``prefix``."""

    client: Any
    prefix: str

    def _put_job(self, name: str, entry: Mapping[str, Any], base: int | None, by: str) -> JobDef:
        text = json.dumps(dict(entry), sort_keys=True)
        answer = self.client.register_script(PUT)(args=[self.prefix, name, "" if base is None else base, text, by])
        kind, value, *rest = (part.decode() if isinstance(part, bytes) else str(part) for part in answer)
        if kind == "conflict":
            raise JobConflict(name, base, int(value) if value else None)
        return JobDef(name, int(value), json.loads(text), by, int(rest[0]))

    def _remove_job(self, name: str, base: int | None) -> JobDef:
        answer = self.client.register_script(REMOVE)(args=[self.prefix, name, "" if base is None else base])
        kind, value = (part.decode() if isinstance(part, bytes) else str(part) for part in answer)
        gone = JobDef.decode(name, value) if kind == "ok" else None
        if gone is None:
            raise JobConflict(
                name, base if base is not None else 0, int(value) if kind == "conflict" and value else None
            )
        return gone

    def _runtime_jobs(self, names: Sequence[str] | None) -> dict[str, JobDef]:
        key = f"{self.prefix}defs"
        if names is None:
            texts = {job.decode(): text for job, text in self.client.hgetall(key).items()}
        else:
            unique = sorted(set(names))
            texts = dict(zip(unique, self.client.hmget(key, unique) if unique else []))
        found = {}
        for name, text in sorted(texts.items()):
            kept = JobDef.decode(name, text)
            if kept is not None:
                found[name] = kept
        return found

    def _job_changes(self, since: Any) -> tuple[set[str] | None, Any]:
        key = f"{self.prefix}changes"
        if since is None:
            last = self.client.xrevrange(key, count=1)
            return set(), last[0][0] if last else b"0-0"
        read = self.client.xread({key: since}, count=10_000)
        if not read:
            return set(), since
        entries = read[0][1]
        return {fields[b"job"].decode() for _, fields in entries}, entries[-1][0]
