-- add-5: schedule one or many tasks of one queue, atomically.
--
-- KEYS[1] sched    ZSET  member -> due (ms)
-- KEYS[2] proc     ZSET  member -> lease expiry (ms)
-- KEYS[3] dead     ZSET  member -> died at (ms)
-- KEYS[4] tasks    HASH  member -> record
-- KEYS[5] wake     ZSET  wake-up marker for idle consumers
-- ARGV[1] mode     "keep" | "replace" | "error" (what to do with an existing task)
-- ARGV[2..] groups of 5:
--   member       "TYPE ID"
--   kind         "in" (value is a delay from the server's now) | "at" (value is epoch ms)
--   value        integer ms
--   payload      JSON text
--   max_attempts integer >= 1, or 0 for "the consumer's default"
-- Returns a flat array, 3 entries per task: status ("added"|"kept"|"replaced"),
-- state ("scheduled"|"due"|"processing"|"dead"), due (ms).
-- Errors: RSCHED_CONFLICT when mode is "error" and any task exists (nothing written).
--@include _now.lua
--@include _record.lua
--@include _types.lua

local bad = check_types({KEYS[1], 'zset', KEYS[2], 'zset', KEYS[3], 'zset', KEYS[4], 'hash', KEYS[5], 'zset'})
if bad then return bad end
local mode = ARGV[1]
local now = now_ms()
local n = (#ARGV - 1) / 5

local function where(m, r)
  local s = redis.call('ZSCORE', KEYS[1], m)
  if s then
    s = tonumber(s)
    if s <= now then return 'due', s end
    return 'scheduled', s
  end
  if redis.call('ZSCORE', KEYS[2], m) then return 'processing', tonumber(r[P_DUE]) end
  if redis.call('ZSCORE', KEYS[3], m) then return 'dead', tonumber(r[P_DUE]) end
  return 'orphan', tonumber(r[P_DUE])
end

if mode == 'error' then
  for i = 0, n - 1 do
    local m = ARGV[2 + i * 5]
    local raw = redis.call('HGET', KEYS[4], m)
    if raw then
      local st = where(m, cjson.decode(raw))
      return redis.error_reply('RSCHED_CONFLICT task "' .. m .. '" already exists (' .. st .. ')')
    end
  end
end

local out = {}
local min_due = nil
for i = 0, n - 1 do
  local b = 2 + i * 5
  local m = ARGV[b]
  local due = tonumber(ARGV[b + 2])
  if ARGV[b + 1] == 'in' then due = now + due end
  local raw = redis.call('HGET', KEYS[4], m)
  local status = 'added'
  if raw then
    local st, d = where(m, cjson.decode(raw))
    if mode == 'keep' and st ~= 'orphan' then
      status = 'kept'
      out[#out + 1] = status
      out[#out + 1] = st
      out[#out + 1] = d
    else
      status = 'replaced'
      redis.call('ZREM', KEYS[2], m)
      redis.call('ZREM', KEYS[3], m)
    end
  end
  if status ~= 'kept' then
    redis.call('HSET', KEYS[4], m, cjson.encode({ARGV[b + 3], 0, tonumber(ARGV[b + 4]), '', '', due, now}))
    redis.call('ZADD', KEYS[1], due, m)
    if min_due == nil or due < min_due then min_due = due end
    out[#out + 1] = status
    out[#out + 1] = (due <= now) and 'due' or 'scheduled'
    out[#out + 1] = due
  end
end

if min_due ~= nil then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if first[2] and tonumber(first[2]) >= min_due then
    redis.call('ZADD', KEYS[5], min_due, 'w')
  end
end
return out
