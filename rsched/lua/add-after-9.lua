-- add-after-9: schedule one task that waits for parents (`add --after`), atomically.
-- It is in state waiting (the `waiting` ZSET, at its own due time) until every
-- parent finished ok (ack-9 then moves it to sched); a parent that goes dead or is
-- cancelled sends it dead (_after.lua). Only for an unpartitioned queue: parents and
-- child must be in the keys of one slot.
--
-- KEYS[1..7] as add-7: sched, proc, dead, tasks, wake, prio, ready
-- KEYS[8] waiting   ZSET  waiting member -> due (ms)
-- KEYS[9] children  HASH  parent member -> JSON array of its waiting children
-- ARGV[1] mode      "keep" | "replace" | "error" (what to do with an existing task)
-- ARGV[2] member    "TYPE ID"
-- ARGV[3] due       "+N": N ms after the server's now | "N": at epoch ms N
-- ARGV[4] payload   JSON text
-- ARGV[5] max_attempts integer >= 1, or 0
-- ARGV[6] priority  integer -1000..1000
-- ARGV[7..] parents "TYPE ID" (at least one, none the member itself)
-- Returns {status ("added"|"replaced"), state ("waiting"|"dead"), due, now[, dead parent]} |
-- {"kept", state, due, now, record, score} (as add-7) | {"missing", parent} |
-- {"partitioned", N} (nothing written for these two).
-- Errors: RSCHED_CONFLICT when mode is "error" and the task exists.
--@include _now.lua
--@include _record.lua
--@include _types.lua
--@include _prio.lua
--@include _after.lua

local bad = check_types({KEYS[1], 'zset', KEYS[2], 'zset', KEYS[3], 'zset', KEYS[4], 'hash',
  KEYS[5], 'zset', KEYS[6], 'zset', KEYS[7], 'zset', KEYS[8], 'zset', KEYS[9], 'hash'})
if bad then return bad end
local m, mode = ARGV[2], ARGV[1]
local parts = redis.call('HGET', KEYS[4], '#partitions')
if parts then return {'partitioned', tonumber(parts)} end
local now = now_ms()

local function state_of(x)
  local s = redis.call('ZSCORE', KEYS[1], x)
  if s then return (tonumber(s) <= now) and 'due' or 'scheduled', s end
  s = redis.call('ZSCORE', KEYS[7], x)
  if s then return 'due', string.format('%d', ready_due(tonumber(s))) end
  s = redis.call('ZSCORE', KEYS[8], x)
  if s then return 'waiting', s end
  s = redis.call('ZSCORE', KEYS[2], x)
  if s then return 'processing', s end
  s = redis.call('ZSCORE', KEYS[3], x)
  if s then return 'dead', s end
  return 'orphan', nil
end

local parents, seen, dead_parent = {}, {}, nil
for i = 7, #ARGV do
  local p = ARGV[i]
  if not seen[p] then
    seen[p] = true
    if redis.call('HEXISTS', KEYS[4], p) == 0 then return {'missing', p} end
    parents[#parents + 1] = p
    if not dead_parent and redis.call('ZSCORE', KEYS[3], p) then dead_parent = p end
  end
end

local raw = redis.call('HGET', KEYS[4], m)
local status = 'added'
if raw then
  local st, score = state_of(m)
  if mode == 'error' then
    return redis.error_reply('RSCHED_CONFLICT task "' .. m .. '" already exists (' .. st .. ')')
  end
  if mode == 'keep' and st ~= 'orphan' then
    redis.call('HSET', KEYS[4], m, raw) -- a write, so that a following WAIT covers it
    local r = rec_decode(raw)
    local d = (st == 'processing' or st == 'dead') and (r[P_DUE] or now) or tonumber(score)
    return {'kept', st, d, now, raw, score}
  end
  status = 'replaced'
  for _, key in ipairs({KEYS[1], KEYS[2], KEYS[3], KEYS[6], KEYS[7], KEYS[8]}) do
    redis.call('ZREM', key, m)
  end
end

local spec = ARGV[3]
local due
if string.byte(spec, 1) == 43 then due = now + tonumber(string.sub(spec, 2)) else due = tonumber(spec) end
local r = {ARGV[4], 0, tonumber(ARGV[5]), '', '', false, 0, tonumber(ARGV[6]), false, parents}
if dead_parent then
  r[P_AFTER] = false
  r[P_ERROR] = 'parent ' .. dead_parent .. ' is dead'
  redis.call('HSET', KEYS[4], m, rec_encode(r))
  redis.call('ZADD', KEYS[3], now, m)
  return {status, 'dead', due, now, dead_parent}
end
redis.call('HSET', KEYS[4], m, rec_encode(r))
redis.call('ZADD', KEYS[8], due, m)
for _, p in ipairs(parents) do
  local got = redis.call('HGET', KEYS[9], p)
  local list = got and cjson.decode(got) or {}
  local has = false
  for _, c in ipairs(list) do if c == m then has = true end end
  if not has then
    list[#list + 1] = m
    redis.call('HSET', KEYS[9], p, cjson.encode(list))
  end
end
return {status, 'waiting', due, now}
