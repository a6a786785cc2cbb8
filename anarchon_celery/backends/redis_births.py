"""When each job came to be, on Redis (see :mod:`.births`): ``<prefix>born.<job>``, beside the
job's cursor, written by one script per batch of jobs. A part of :class:`~.redis.RedisBackend`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["INTRODUCE", "RedisBirths"]

#: Jobs per script call: a start with 100,000 jobs holds Redis up a few milliseconds at a time.
CHUNK = 2_000

# ARGV: prefix, then job and since (epoch ms) for each job. Returns each job's birth, in order
# (births.born: the one kept, lowered by an earlier since; none kept, the cursor's slot at most).
INTRODUCE = """
local prefix = ARGV[1]
local out = {}
for i = 2, #ARGV, 2 do
  local born_key = prefix .. 'born.' .. ARGV[i]
  local since = tonumber(ARGV[i + 1])
  local kept = tonumber(redis.call('GET', born_key))
  local value = since
  if kept then
    value = math.min(kept, since)
  else
    local cursor = tonumber(redis.call('GET', prefix .. 'cursor.' .. ARGV[i]))
    if cursor then value = math.min(cursor, since) end
  end
  if value ~= kept then redis.call('SET', born_key, string.format('%d', value)) end
  out[#out + 1] = string.format('%d', value)
end
return out
"""


class RedisBirths:
    """The births step of the Redis backend, which gives ``client`` and ``prefix``."""

    client: Any
    prefix: str

    def _introduce(self, since: Mapping[str, int]) -> dict[str, int]:
        script = self.client.register_script(INTRODUCE)
        jobs = sorted(since)
        found: dict[str, int] = {}
        for start in range(0, len(jobs), CHUNK):
            chunk = jobs[start : start + CHUNK]
            args: list[Any] = [self.prefix]
            for job in chunk:
                args += [job, since[job]]
            found.update(zip(chunk, (int(value) for value in script(args=args))))
        return found
