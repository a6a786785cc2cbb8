"""The Lua scripts of the Redis backend: each decides, or changes, a batch of runs in one atomic
step on Redis's own clock (``TIME``). Run records are hashes ``<prefix>run.<job>.<slot>``; each
job's cursor is ``<prefix>cursor.<job>``. The rules are those of :mod:`.ordered` (claims) and
:mod:`.leases` (takeovers, marks, hand-backs), which the SQL stores run in Python; the worker's start
check and overlap protection are in :mod:`.redis_busy_scripts`."""

from __future__ import annotations

__all__ = ["CLAIM", "HAND_BACK", "MARK_SENT", "TAKE_OVER"]

from .redis_busy_scripts import BUSY, TIME
from .redis_pauses import PAUSES

# KEYS: none (the keys are made from the prefix: one deployment lives on one Redis, not a
# cluster). ARGV: prefix, instance, slot_ttl_ms, recover (a '1' or '0' per claim, in order; 1: a run
# this instance holds already counts as won, with the gap its win left: the answer of an earlier
# try was lost), lease_ms, then job, slot, deadline (-1: none), backups wanted, catch-up key ('' :
# none), kind ('', 'catch_up' or 'gap'), overlap policy ('' : allow), queued_ms and the version of the
# job's definition (0: defined in code; else checked against <prefix>defs) for each claim.
# Returns, per claim: "stale" (made under another version of its runtime job than the one kept),
# "won", "won:<cursor>" (the win left a gap after that cursor), "paused" (won,
# its job paused: not sent, see redis_pauses), "not:<verdict>"
# or "not:<verdict>:<cursor>" (won, not sent: its job is busy, see busy.admit), "lost",
# "undecided:<ms>", "early:<ms>" or "backup:<ms left on the lease>:<rank>" (lost, and armed as a
# backup); then the runs freed (see redis_busy_scripts). Each job's catch-up key is
# <prefix>catchup.<job>.
CLAIM = (
    TIME
    + """
local prefix, instance, ttl, recovering, lease = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
"""
    + BUSY
    + PAUSES
    + """
local out = {}
local i = 6
local versions = {}
-- The version of the runtime job's definition kept (0: none).
local function defined_version(job)
  if versions[job] == nil then
    local text = redis.call('HGET', prefix .. 'defs', job)
    local found = 0
    if text then
      local ok, d = pcall(cjson.decode, text)
      if ok and type(d) == 'table' then found = tonumber(d['v']) or 0 end
    end
    versions[job] = found
  end
  return versions[job]
end
-- A run won: recorded, and admitted by its job's overlap policy (unless it is paused); its answer.
local function record(run_key, deadline_text, after, job, slot, policy, queued_ms)
  if paused(job) then
    redis.call('HSET', run_key, 'holder', instance, 'token', '1', 'state', 'paused', 'decided_ms', now_text,
               'deadline_ms', deadline_text, 'lease_end_ms', now_text, 'backups', '0')
    redis.call('PEXPIRE', run_key, ttl)
    return 'paused'
  end
  local verdict = busy_admit(job, slot, policy, queued_ms, lease)
  local state = 'claimed'
  if verdict == 'pending' then state = 'pending' elseif verdict ~= '' then state = 'skipped' end
  redis.call('HSET', run_key, 'holder', instance, 'token', '1', 'state', state, 'decided_ms', now_text,
             'deadline_ms', deadline_text, 'lease_end_ms', string.format('%d', now + lease), 'backups', '0')
  if after then redis.call('HSET', run_key, 'after', after) end  -- the gap it left, for a recovery
  redis.call('PEXPIRE', run_key, ttl)
  if verdict ~= '' then
    return 'not:' .. verdict .. (after and (':' .. after) or '')
  end
  return after and ('won:' .. after) or 'won'
end
local function keep_key(key_key, key)
  if key == '' then redis.call('DEL', key_key) else redis.call('SET', key_key, key) end
end
while i <= #ARGV do
  local job, slot_text, deadline, wanted = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  local key, kind, policy, queued_ms = ARGV[i + 4], ARGV[i + 5], ARGV[i + 6], tonumber(ARGV[i + 7])
  local version = tonumber(ARGV[i + 8])
  local recover = recovering:sub(#out + 1, #out + 1) == '1'
  local slot = tonumber(slot_text)
  local cursor_key = prefix .. 'cursor.' .. job
  local key_key = prefix .. 'catchup.' .. job
  local run_key = prefix .. 'run.' .. job .. '.' .. slot_text
  paused(job)  -- (first: a pause that ran out moves the cursor)
  if version > 0 and defined_version(job) ~= version then
    out[#out + 1] = 'stale'
  elseif deadline >= 0 and now > deadline then
    out[#out + 1] = 'undecided:' .. string.format('%d', now - deadline)
  elseif now < slot then
    out[#out + 1] = 'early:' .. string.format('%d', slot - now)
  else
    local cursor = tonumber(redis.call('GET', cursor_key))
    local run = redis.call('HMGET', run_key, 'holder', 'state', 'backups', 'lease_end_ms', 'deadline_ms', 'after')
    if run[1] then  -- decided already
      local run_deadline = tonumber(run[5])
      if recover and run[1] == instance then
        if run[2] == 'paused' then
          out[#out + 1] = 'paused'
        elseif run[2] == 'skipped' or run[2] == 'pending' then  -- won, not sent: its job was busy
          out[#out + 1] = 'not:' .. run[2] .. (run[6] and (':' .. run[6]) or '')
        else
          out[#out + 1] = run[6] and ('won:' .. run[6]) or 'won'
        end
      elseif wanted > 0 and run[2] == 'claimed' and (tonumber(run[3]) or 0) < wanted and (tonumber(run[4]) or 0) > 0
          and not (run_deadline and run_deadline >= 0 and now > run_deadline) then
        local rank = redis.call('HINCRBY', run_key, 'backups', 1)
        local left = math.max(0, (tonumber(run[4]) or 0) - now)
        out[#out + 1] = 'backup:' .. string.format('%d', left) .. ':' .. rank
      else
        out[#out + 1] = 'lost'
      end
    elseif kind == 'gap' then  -- inside a gap this instance won: the cursor is past it already
      out[#out + 1] = record(run_key, ARGV[i + 2], nil, job, slot, policy, queued_ms)
    elseif kind == 'catch_up' then
      if not cursor or (redis.call('GET', key_key) or '') ~= key then  -- new, or changed: from now on
        keep_key(key_key, key)
        if not cursor or cursor < slot then redis.call('SET', cursor_key, slot_text) end
        out[#out + 1] = 'lost'
      elseif cursor >= slot then
        out[#out + 1] = 'lost'
      else
        redis.call('SET', cursor_key, slot_text)
        out[#out + 1] = record(run_key, ARGV[i + 2], string.format('%d', cursor), job, slot, policy, queued_ms)
      end
    elseif cursor and cursor >= slot and now - slot >= math.floor(ttl / 2) then
      out[#out + 1] = 'lost'  -- passed over by the cursor, and its record, had it one, may be gone
    else
      local after = nil
      if not cursor or cursor < slot then
        redis.call('SET', cursor_key, slot_text)
        if key == '' then
          redis.call('DEL', key_key)  -- (nothing is written when there is none)
        elseif (redis.call('GET', key_key) or '') == key then
          if cursor then after = string.format('%d', cursor) end
        else
          redis.call('SET', key_key, key)
        end
      end
      out[#out + 1] = record(run_key, ARGV[i + 2], after, job, slot, policy, queued_ms)
    end
  end
  i = i + 9
end
for k = 1, #freed do out[#out + 1] = freed[k] end
return out
"""
)

# ARGV: prefix, instance, lease_ms, then job and slot for each run. Per run: "won:<token>",
# "held:<ms left>", "done:0" or "late:<ms>" (see leases.take_over).
TAKE_OVER = (
    TIME
    + """
local prefix, instance, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])
"""
    + BUSY
    + """
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
    busy_hold(ARGV[i], tonumber(ARGV[i + 1]), now + lease, false)  -- the run holds its job as long
    out[#out + 1] = 'won:' .. token
  end
end
return out
"""
)

# ARGV: prefix, then job, slot and token for each run. Per run: 1 (marked sent) or 0.
MARK_SENT = (
    TIME
    + """
local prefix = ARGV[1]
"""
    + BUSY
    + """
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
    busy_hold(ARGV[i], tonumber(ARGV[i + 1]), 0, true)  -- sent: its job is held until a worker starts it
    out[#out + 1] = 1
  end
end
return out
"""
)

# ARGV: prefix, instance, then job, slot and token for each run. Each run given back is published
# on <prefix>handback as "<job> <slot>"; returns how many were given back.
HAND_BACK = (
    TIME
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
