-- add-7: schedule one or many tasks of one queue, atomically.
--
-- KEYS[1] sched    ZSET  member -> due (ms)
-- KEYS[2] proc     ZSET  member -> lease expiry (ms)
-- KEYS[3] dead     ZSET  member -> died at (ms)
-- KEYS[4] tasks    HASH  member -> record (see _record.lua); field "#partitions" -> N
--                        when this (logical) queue is partitioned (see queue/queues.py)
-- KEYS[5] wake     ZSET  wake-up marker for idle consumers
-- KEYS[6] prio     ZSET  tasks of a priority other than 0 (see _prio.lua)
-- KEYS[7] ready    ZSET  due tasks of a priority other than 0, out of sched
-- ARGV[1] mode     "keep" | "replace" | "error" (what to do with an existing task)
-- ARGV[2] reply    "tasks" (3 entries per task) | "text" (the same as one string)
--                  | "counts" ({added, kept, replaced})
--                  | "one" (one task, with what a kept task's result needs)
-- ARGV[3] checks   letters: "t" check the keys' types first (a caller does it once
--                  per connection and queue, not on every call); "p" refuse to add
--                  when the queue is partitioned (the caller assumed it is not); "P"
--                  the groups are of 5 (with a priority): without it, priority 0
-- ARGV[4..] groups of 4 (5 with "P"):
--   member       "TYPE ID"
--   due          "+N": N ms after the server's now | "N": at epoch ms N (integers)
--   payload      JSON text
--   max_attempts integer >= 1, or 0 for "the consumer's default"
--   (priority)   integer -1000..1000
-- Returns, for reply "tasks", a flat array of 3 entries per task: status
-- ("added"|"kept"|"replaced"), state ("scheduled"|"due"|"processing"|"dead"),
-- due (ms); for reply "text", those entries as one string, separated by single
-- spaces (one bulk reply: cheaper to parse for a pure-Python client, the asyncio
-- client's batches); for reply "counts", {added, kept, replaced}; for reply "one":
-- {status, due, now} (added, replaced: due or scheduled by due <= now), or
-- {"kept", state, due, now, record, score} with the stored record and its score
-- in sched, proc or dead (as text), or {"partitioned", N} when "p" found the
-- queue partitioned (nothing written). ("now": the server's clock, ms.)
-- Errors: RSCHED_CONFLICT when mode is "error" and any task exists (nothing written).

-- Write the one task of reply "one" (ARGV[4..7]) at the server's time `now`;
-- returns its due time. Consumers are woken when it is the earliest task (no
-- score below its due).
local function write_one(now)
  local m, spec, maxa = ARGV[4], ARGV[5], tonumber(ARGV[7])
  local due
  if string.byte(spec, 1) == 43 then due = now + tonumber(string.sub(spec, 2)) else due = tonumber(spec) end
  local pri = tonumber(ARGV[8] or '0')
  if pri ~= 0 then
    redis.call('HSET', KEYS[4], m, cjson.encode({ARGV[6], 0, maxa, '', '', cjson.null, 0, pri}))
    redis.call('ZADD', KEYS[6], due, m)
  elseif maxa == 0 then
    redis.call('HSET', KEYS[4], m, cjson.encode({ARGV[6]}))
  else
    redis.call('HSET', KEYS[4], m, cjson.encode({ARGV[6], 0, maxa}))
  end
  redis.call('ZADD', KEYS[1], due, m)
  -- (parked tasks score below 0: the consumers that run them know of them already)
  if redis.call('ZCOUNT', KEYS[1], 0, string.format('(%.17g', due)) == 0 then
    redis.call('ZADD', KEYS[5], due, 'w')
  end
  return due
end

-- A new task, reply "one", no type check (rs.add(), `rsched add`: the path of one
-- round trip per task), first: the fragments included below cost every call that
-- runs past them. An existing task goes on to the general rules below.
if ARGV[2] == 'one' and not string.find(ARGV[3], 't', 1, true) then
  local got = redis.call('HMGET', KEYS[4], ARGV[4], '#partitions')
  if got[2] and string.find(ARGV[3], 'p', 1, true) then return {'partitioned', tonumber(got[2])} end
  if not got[1] then
    if redis.replicate_commands then pcall(redis.replicate_commands) end
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    return {'added', write_one(now), now}
  end
end

--@include _now.lua
--@include _record.lua
--@include _types.lua
--@include _bulk.lua
--@include _prio.lua

local checks = ARGV[3]
if string.find(checks, 't', 1, true) then
  local want = {KEYS[1], 'zset', KEYS[2], 'zset', KEYS[3], 'zset', KEYS[4], 'hash', KEYS[5], 'zset'}
  if string.find(checks, 'P', 1, true) then -- the priority keys: only an add that writes them
    want[#want + 1] = KEYS[6]; want[#want + 1] = 'zset'; want[#want + 1] = KEYS[7]; want[#want + 1] = 'zset'
  end
  local bad = check_types(want)
  if bad then return bad end
end
local mode = ARGV[1]
local tasks_reply = ARGV[2] ~= 'counts'
local text_reply = ARGV[2] == 'text'
local one_reply = ARGV[2] == 'one'
local partitioned = string.find(checks, 'p', 1, true)
if partitioned and not one_reply then
  local parts = redis.call('HGET', KEYS[4], '#partitions')
  if parts then return {'partitioned', tonumber(parts)} end
end
local now = now_ms()
local G = string.find(checks, 'P', 1, true) and 5 or 4
local n = (#ARGV - 3) / G

local function where(m, r)
  local s = redis.call('ZSCORE', KEYS[1], m)
  if s then
    if tonumber(s) <= now then return 'due', tonumber(s), s end
    return 'scheduled', tonumber(s), s
  end
  local d = r[P_DUE] or now
  s = redis.call('ZSCORE', KEYS[7], m)
  if s then
    local rd = ready_due(tonumber(s))
    return 'due', rd, string.format('%d', rd)
  end
  s = redis.call('ZSCORE', KEYS[2], m)
  if s then return 'processing', d, s end
  s = redis.call('ZSCORE', KEYS[3], m)
  if s then return 'dead', d, s end
  return 'orphan', d
end

-- One task, reply "one" (rs.add(), `rsched add`): the same rules as below, in
-- the fewest commands (this is the path of one round trip per task).
if one_reply then
  local m = ARGV[4]
  local got = redis.call('HMGET', KEYS[4], m, '#partitions')
  if partitioned and got[2] then return {'partitioned', tonumber(got[2])} end
  local raw = got[1]
  local status = 'added'
  if raw then
    local st, d, score = where(m, rec_decode(raw))
    if mode == 'error' then
      return redis.error_reply('RSCHED_CONFLICT task "' .. m .. '" already exists (' .. st .. ')')
    end
    if mode == 'keep' and st ~= 'orphan' then
      redis.call('HSET', KEYS[4], m, raw) -- a write, so that a following WAIT covers it
      return {'kept', st, d, now, raw, score}
    end
    status = 'replaced'
    redis.call('ZREM', KEYS[2], m)
    redis.call('ZREM', KEYS[3], m)
    redis.call('ZREM', KEYS[7], m)
  end
  return {status, write_one(now), now}
end

if mode == 'error' then
  for i = 0, n - 1 do
    local m = ARGV[4 + i * G]
    local raw = redis.call('HGET', KEYS[4], m)
    if raw then
      local st = where(m, rec_decode(raw))
      return redis.error_reply('RSCHED_CONFLICT task "' .. m .. '" already exists (' .. st .. ')')
    end
  end
end

local members, dues, recs, pris = {}, {}, {}, {}
for i = 1, n do
  local b = 4 + (i - 1) * G
  local m = ARGV[b]
  local spec = ARGV[b + 1]
  local due
  if string.byte(spec, 1) == 43 then -- '+'
    due = now + tonumber(string.sub(spec, 2))
  else
    due = tonumber(spec)
  end
  local maxa = tonumber(ARGV[b + 3])
  members[i] = m
  dues[i] = due
  local pri = (G == 5) and tonumber(ARGV[b + 4]) or 0
  pris[i] = pri
  if pri ~= 0 then
    recs[i] = cjson.encode({ARGV[b + 2], 0, maxa, '', '', cjson.null, 0, pri})
  elseif maxa == 0 then
    recs[i] = cjson.encode({ARGV[b + 2]})
  else
    recs[i] = cjson.encode({ARGV[b + 2], 0, maxa})
  end
end

-- One HMGET tells which tasks exist; then one HSET and one ZADD write the rest.
local existing = bulk('HMGET', KEYS[4], members)
local out = {}
local added, kept, replaced = 0, 0, 0
local hset, zadd, zrem, pzadd = {}, {}, {}, {}
local first_due = {} -- member -> due, for a task given twice in one call
local min_due = nil
for i = 1, n do
  local m, due = members[i], dues[i]
  local status = 'added'
  local st, d
  if existing[i] or first_due[m] then
    if mode == 'replace' then
      status = 'replaced'
    elseif first_due[m] then
      status = 'kept'
      d = first_due[m]
      st = (d <= now) and 'due' or 'scheduled'
    else
      st, d = where(m, rec_decode(existing[i]))
      status = (st == 'orphan') and 'replaced' or 'kept'
    end
  end
  if status == 'kept' then
    kept = kept + 1
  else
    if status == 'added' then added = added + 1 else replaced = replaced + 1 end
    if existing[i] then zrem[#zrem + 1] = m end
    hset[#hset + 1] = m
    hset[#hset + 1] = recs[i]
    zadd[#zadd + 1] = due
    zadd[#zadd + 1] = m
    if pris[i] ~= 0 then
      pzadd[#pzadd + 1] = due
      pzadd[#pzadd + 1] = m
    end
    first_due[m] = due
    if min_due == nil or due < min_due then min_due = due end
    st, d = (due <= now) and 'due' or 'scheduled', due
  end
  if text_reply then
    out[#out + 1] = status .. ' ' .. st .. ' ' .. string.format('%d', d)
  elseif tasks_reply then
    out[#out + 1] = status
    out[#out + 1] = st
    out[#out + 1] = d
  end
end
if #zrem > 0 then
  bulk('ZREM', KEYS[2], zrem)
  bulk('ZREM', KEYS[3], zrem)
  bulk('ZREM', KEYS[7], zrem)
end
if #hset > 0 then
  bulk('HSET', KEYS[4], hset)
  bulk('ZADD', KEYS[1], zadd)
  if #pzadd > 0 then bulk('ZADD', KEYS[6], pzadd) end
elseif kept > 0 then
  -- Every task was kept: rewrite one record unchanged, so that this call is a
  -- write. A following WAIT then covers the kept tasks (they were written
  -- before it): Valkey (and Redis >= 7.2) count only the connection's own
  -- writes, and a connection that wrote nothing returns at once.
  for i = 1, n do
    if existing[i] then
      redis.call('HSET', KEYS[4], members[i], existing[i])
      break
    end
  end
end

if min_due ~= nil then
  local first = redis.call('ZRANGEBYSCORE', KEYS[1], 0, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if first[2] and tonumber(first[2]) >= min_due then
    redis.call('ZADD', KEYS[5], min_due, 'w')
  end
end
if not tasks_reply then return {added, kept, replaced} end
if text_reply then return table.concat(out, ' ') end

return out
