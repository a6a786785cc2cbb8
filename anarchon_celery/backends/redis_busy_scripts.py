"""The Lua of overlap protection on Redis: the rules of :mod:`.busy`, which the SQL stores run in
Python, on each job's state ``<prefix>busy.<job>`` (the same JSON as :meth:`.busy.JobBusy.encode`).

:data:`BUSY` is a prelude of functions that the claim, takeover and mark-sent scripts include
(after ``TIME``, with ``prefix`` set); :data:`START`, :data:`RENEW`, :data:`END` and
:data:`NEXT_PENDING` are the worker's and the pending runs' scripts. A run whose hold ran out is
told as ``freed:`` and a JSON list ``[job, slot, run, worker, abandoned]``.
"""

from __future__ import annotations

from .busy import BUFFER_ALL_CAP

__all__ = ["BUSY", "END", "NEXT_PENDING", "RENEW", "START"]

TIME = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_text = t[1] .. string.format('%03d', math.floor(tonumber(t[2]) / 1000))
"""

BUSY = (
    """
local freed = {}
local function busy_get(job)
  local text = redis.call('GET', prefix .. 'busy.' .. job)
  if not text then return nil end
  local b = cjson.decode(text)
  if b.s == cjson.null then b.s = nil end
  if type(b.pd) ~= 'table' then b.pd = {} end
  b.u = tonumber(b.u) or 0
  b.q = tonumber(b.q) or 0
  if type(b.r) ~= 'string' then b.r = '' end
  if type(b.w) ~= 'string' then b.w = '' end
  if type(b.st) ~= 'string' then b.st = '' end
  return b
end
local function busy_put(job, b)
  local pending = {}
  for k = 1, #b.pd do pending[k] = string.format('%d', b.pd[k]) end
  local slot = b.s and string.format('%d', b.s) or 'null'
  redis.call('SET', prefix .. 'busy.' .. job, '{"p":' .. cjson.encode(b.p) .. ',"s":' .. slot .. ',"r":' ..
    cjson.encode(b.r) .. ',"st":' .. cjson.encode(b.st) .. ',"u":' .. string.format('%d', b.u) .. ',"w":' ..
    cjson.encode(b.w) .. ',"q":' .. string.format('%d', b.q) .. ',"pd":[' .. table.concat(pending, ',') .. ']}')
end
local function busy_expire(job, b, own_slot)
  if not b.s or b.u > now then return end
  if b.s ~= own_slot then
    freed[#freed + 1] = 'freed:' .. cjson.encode({job, string.format('%d', b.s), b.r, b.w, b.st == 'running'})
  end
  b.s, b.r, b.st, b.u, b.w = nil, '', '', 0, ''
end
local function busy_take(b, slot, state, until_ms, run, worker)
  b.s, b.st, b.u, b.r, b.w = slot, state, until_ms, run, worker
  for k = #b.pd, 1, -1 do
    if b.pd[k] == slot then table.remove(b.pd, k) end
  end
end
local function busy_keep(b, slot)
  for k = 1, #b.pd do
    if b.pd[k] == slot then return 'pending' end
  end
  local cap = 0
  if b.p == 'buffer_one' then cap = 1 elseif b.p == 'buffer_all' then cap = """
    + str(BUFFER_ALL_CAP)
    + """ end
  if #b.pd >= cap then
    if b.p == 'buffer_all' then return 'dropped' end
    return 'skipped'
  end
  b.pd[#b.pd + 1] = slot
  table.sort(b.pd)
  return 'pending'
end
-- A run just won: '' (send it: it holds its job for the winner's lease), or why not.
local function busy_admit(job, slot, policy, queued_ms, hold_ms)
  if policy == '' or policy == 'allow' then
    local b = busy_get(job)
    if b and b.p ~= 'allow' then
      b.p = 'allow'
      busy_put(job, b)
    end
    return ''
  end
  local b = busy_get(job) or {p = policy, s = nil, r = '', st = '', u = 0, w = '', q = 0, pd = {}}
  b.p, b.q = policy, queued_ms
  busy_expire(job, b, nil)
  local verdict = ''
  if b.s ~= slot then
    if policy == 'skip' then b.pd = {} end
    if not b.s and #b.pd == 0 then
      busy_take(b, slot, 'queued', now + hold_ms, '', '')
    elseif policy == 'skip' then
      verdict = 'skipped'
    else
      verdict = busy_keep(b, slot)
    end
  end
  busy_put(job, b)
  return verdict
end
-- A run sent (to hold its job until a worker starts it; pending no more), or taken over (for its
-- new lease).
local function busy_hold(job, slot, until_ms, queued)
  local b = busy_get(job)
  if b and b.s == slot and b.st == 'queued' then
    if queued then
      until_ms = now + b.q
      for k = #b.pd, 1, -1 do
        if b.pd[k] == slot then table.remove(b.pd, k) end
      end
    end
    if until_ms > b.u then b.u = until_ms end
    busy_put(job, b)
  end
end
-- Whether holder ('node#main.pool'; 'node#*': any process of that node) holds the run.
local function busy_holds(b, holder)
  if holder:sub(-2) == '#*' then
    return b.w:sub(1, #holder - 1) == holder:sub(1, -2)
  end
  return b.w == holder
end
"""
)

# ARGV: prefix, job, slot, token (0: a message without one), redelivered (1 or 0), run, worker,
# lease_ms. Returns {allowed ("yes", "no" or "unknown"), overlap ("", "skipped", "pending" or
# "wait"), ms left on the hold (wait), a freed run or "", 1 when the run now holds its job}.
START = (
    TIME
    + """
local prefix, job, slot_text, token, redelivered = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local run_id, worker, lease = ARGV[6], ARGV[7], tonumber(ARGV[8])
local slot = tonumber(slot_text)
"""
    + BUSY
    + """
local run_key = prefix .. 'run.' .. job .. '.' .. slot_text
local run = redis.call('HMGET', run_key, 'token', 'state')
local allowed = 'unknown'
if token ~= '0' and run[1] then
  if run[1] ~= token then return {'no', '', 0, '', 0} end
  if run[2] == 'started' and redelivered ~= '1' then return {'no', '', 0, '', 0} end
  allowed = 'yes'
end
local holds = 0
local b = busy_get(job)
if b and b.p ~= 'allow' then
  busy_expire(job, b, slot)
  local verdict = ''
  if b.s == slot and b.st == 'running' and b.w ~= worker then
    verdict = 'wait'
  elseif not b.s or b.s == slot then
    busy_take(b, slot, 'running', now + lease, run_id, worker)
  elseif b.p == 'skip' or not run[1] then
    verdict = 'skipped'
  else
    verdict = busy_keep(b, slot)
    if verdict == 'dropped' then verdict = 'skipped' end
  end
  busy_put(job, b)
  if verdict ~= '' then return {'no', verdict, math.max(0, b.u - now), freed[1] or '', 0} end
  holds = 1
end
if allowed == 'yes' and run[2] ~= 'started' then redis.call('HSET', run_key, 'state', 'started') end
return {allowed, '', 0, freed[1] or '', holds}
"""
)

# ARGV: prefix, lease_ms, then job, slot and holder for each run. Per run: "renewed", "late" (its
# hold had run out, nobody having taken the job: renewed), "lost" (the job is held by another run,
# or by this run elsewhere) or "" (the job is not protected, free, or held by the run as queued).
RENEW = (
    TIME
    + """
local prefix, lease = ARGV[1], tonumber(ARGV[2])
"""
    + BUSY
    + """
local out = {}
for i = 3, #ARGV, 3 do
  local job, slot, holder = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
  local b = busy_get(job)
  if not b or b.p == 'allow' or not b.s or (b.s == slot and b.st == 'queued') then
    out[#out + 1] = ''
  elseif b.s ~= slot or b.w ~= holder then
    out[#out + 1] = 'lost'
  else
    if b.u <= now then out[#out + 1] = 'late' else out[#out + 1] = 'renewed' end
    b.u = now + lease
    busy_put(job, b)
  end
end
return out
"""
)

# ARGV: prefix, job, slot, holder ("": told by a process that did not start it), retrying (1: the
# run will be tried again, and holds its job as a queued run does). Returns 1 when the run held
# its job, which is now free (or held by the retry).
END = (
    TIME
    + """
local prefix, job, slot, holder, again = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
"""
    + BUSY
    + """
local b = busy_get(job)
if not b or b.s ~= slot then return 0 end
if b.st == 'running' and not (holder ~= '' and busy_holds(b, holder)) then return 0 end
if again == '1' then
  b.st, b.w, b.u = 'queued', '', now + math.max(b.q, 1000)
else
  b.s, b.r, b.st, b.u, b.w = nil, '', '', 0, ''
end
busy_put(job, b)
return 1
"""
)

# ARGV: prefix, instance, lease_ms, slot_ttl_ms, then job and deadline (-1: none) for each job.
# Returns "taken:<job>:<slot>:<token>" for each pending run now held by the instance, then the
# runs freed.
NEXT_PENDING = (
    TIME
    + """
local prefix, instance, lease, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
"""
    + BUSY
    + """
local out = {}
for i = 5, #ARGV, 2 do
  local job, deadline = ARGV[i], ARGV[i + 1]
  local b = busy_get(job)
  if b then
    busy_expire(job, b, nil)
    if not b.s and #b.pd > 0 then  -- (pending until sent: busy_hold)
      local slot = b.pd[1]
      b.s, b.st, b.u, b.r, b.w = slot, 'queued', now + lease, '', ''
      local slot_text = string.format('%d', slot)
      local run_key = prefix .. 'run.' .. job .. '.' .. slot_text
      local token = redis.call('HINCRBY', run_key, 'token', 1)
      redis.call('HSET', run_key, 'holder', instance, 'state', 'claimed', 'decided_ms', now_text,
                 'deadline_ms', deadline, 'lease_end_ms', string.format('%d', now + lease), 'backups', '0')
      redis.call('PEXPIRE', run_key, ttl)
      out[#out + 1] = 'taken:' .. job .. ':' .. slot_text .. ':' .. token
    end
    busy_put(job, b)
  end
end
for k = 1, #freed do out[#out + 1] = freed[k] end
return out
"""
)
