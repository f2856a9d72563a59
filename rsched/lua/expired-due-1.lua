-- expired-due-1: one page of backup-sweep entries that are due, by the server's
-- clock: expiry at or before now - grace (the grace leaves each expiry to the
-- event path first). Read-only; the caller filters them by its pattern and
-- fires each with expired-fire-4 (mode "sweep"), which re-checks atomically.
--
-- KEYS[1] armed   ZSET trigger key name -> expiry (ms)
-- ARGV[1] grace   integer ms
-- ARGV[2] offset  integer, entries to skip (those of other patterns)
-- ARGV[3] count   integer, page size
-- Returns {now, next_expiry|-1 (first entry after the horizon), then key, expiry pairs}
--@include _now.lua
--@include _types.lua

local bad = check_types({KEYS[1], 'zset'})
if bad then return bad end
local now = now_ms()
local horizon = now - tonumber(ARGV[1])
local out = {now, -1}
local nxt = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. horizon, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
if nxt[2] then out[2] = tonumber(nxt[2]) end
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', horizon, 'WITHSCORES', 'LIMIT', tonumber(ARGV[2]), tonumber(ARGV[3]))
for i = 1, #due, 2 do
  out[#out + 1] = due[i]
  out[#out + 1] = tonumber(due[i + 1])
end
return out
