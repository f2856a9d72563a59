-- purge-2: delete dead tasks (all, or those dead for longer than a duration).
--
-- KEYS[1] dead   ZSET member -> died at (ms)
-- KEYS[2] tasks  HASH
-- ARGV[1] older  integer ms, or -1 for all
-- ARGV[2] limit  integer, entries to delete in this call
-- Returns {deleted, more 0|1}
--@include _now.lua

local max = '+inf'
if tonumber(ARGV[1]) >= 0 then max = '(' .. string.format('%d', now_ms() - tonumber(ARGV[1])) end
local limit = tonumber(ARGV[2])
local ms = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', max, 'LIMIT', 0, limit + 1)
local more = 0
if #ms > limit then more = 1; ms[#ms] = nil end
if #ms > 0 then
  redis.call('ZREM', KEYS[1], unpack(ms))
  redis.call('HDEL', KEYS[2], unpack(ms))
end
return {#ms, more}
