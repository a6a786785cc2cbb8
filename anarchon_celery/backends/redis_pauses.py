"""Pauses on Redis (see :mod:`.pauses`): each paused job's pause is ``<prefix>pause.<job>`` (its
JSON form), and the set ``<prefix>paused`` names them. :data:`PAUSES` is the prelude the claim
script includes (after ``TIME``, with ``prefix`` set): a pause that ran out is ended there, in the
claim. A part of :class:`~.redis.RedisBackend`."""

from __future__ import annotations

from typing import Any

from .pauses import Pause

__all__ = ["PAUSES", "RESUME", "RedisPauses"]

PAUSES = """
local pauses = {}
-- Whether the job is paused now. A pause whose until has passed is ended: forgotten, and the
-- job's cursor moved up to its end, so that catch-up never replays the paused range.
local function paused(job)
  local known = pauses[job]
  if known ~= nil then return known end
  known = false
  local pause_key = prefix .. 'pause.' .. job
  local text = redis.call('GET', pause_key)
  if text then
    local ok, pause = pcall(cjson.decode, text)
    local until_ms = nil
    if ok and type(pause) == 'table' then until_ms = tonumber(pause['until']) end
    if not ok or type(pause) ~= 'table' or type(pause['at']) ~= 'number' then
      known = false  -- not a pause of ours
    elseif until_ms and until_ms <= now then
      redis.call('DEL', pause_key)
      redis.call('SREM', prefix .. 'paused', job)
      local cursor_key = prefix .. 'cursor.' .. job
      local cursor = tonumber(redis.call('GET', cursor_key))
      if cursor and cursor < until_ms then redis.call('SET', cursor_key, string.format('%d', until_ms)) end
    else
      known = true
    end
  end
  pauses[job] = known
  return known
end
"""

# ARGV: prefix, job. Ends the job's pause, its cursor moved up to now (or to the pause's end, had
# it passed); returns the pause's JSON and the time, or nothing when the job was not paused.
RESUME = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prefix, job = ARGV[1], ARGV[2]
local pause_key = prefix .. 'pause.' .. job
local text = redis.call('GET', pause_key)
redis.call('SREM', prefix .. 'paused', job)
if not text then return false end
redis.call('DEL', pause_key)
local at = now
local ok, pause = pcall(cjson.decode, text)
if ok and type(pause) == 'table' and tonumber(pause['until']) and tonumber(pause['until']) < now then
  at = tonumber(pause['until'])
end
local cursor_key = prefix .. 'cursor.' .. job
local cursor = tonumber(redis.call('GET', cursor_key))
if cursor and cursor < at then redis.call('SET', cursor_key, string.format('%d', at)) end
return {text, string.format('%d', now)}
"""


class RedisPauses:
    """The pause steps of the Redis backend, which gives ``client`` and ``prefix``."""

    client: Any
    prefix: str

    def _pause(self, job: str, pause: Pause) -> None:
        with self.client.pipeline(transaction=True) as pipe:
            pipe.set(f"{self.prefix}pause.{job}", pause.encode())
            pipe.sadd(f"{self.prefix}paused", job)
            pipe.execute()

    def _resume(self, job: str) -> Pause | None:
        answer = self.client.register_script(RESUME)(args=[self.prefix, job])
        if not answer:
            return None
        pause = Pause.decode(answer[0])
        return pause if pause is not None and pause.in_effect(int(answer[1])) else None

    def _pauses(self) -> dict[str, Pause]:
        jobs = sorted(member.decode() for member in self.client.smembers(f"{self.prefix}paused"))
        if not jobs:
            return {}
        seconds, micros = self.client.time()
        now = int(seconds) * 1000 + int(micros) // 1000
        texts = self.client.mget([f"{self.prefix}pause.{job}" for job in jobs])
        found = {job: Pause.decode(text) for job, text in zip(jobs, texts)}
        return {job: pause for job, pause in found.items() if pause is not None and pause.in_effect(now)}
