-- retry-5: move dead tasks back to due now, with their attempts reset.
--
-- KEYS[1] dead   ZSET
-- KEYS[2] sched  ZSET
-- KEYS[3] tasks  HASH
-- KEYS[4] wake   ZSET
-- KEYS[5] prio   ZSET  tasks of a priority other than 0 (_prio.lua): readied by the next claim
-- ARGV[1..] members
-- Returns the number moved (members that were not dead are skipped).
--@include _now.lua
--@include _record.lua

local now = now_ms()
local n = 0
for i = 1, #ARGV do
  local m = ARGV[i]
  local raw = redis.call('HGET', KEYS[3], m)
  if raw and redis.call('ZREM', KEYS[1], m) == 1 then
    local r = rec_decode(raw)
    r[P_ATTEMPTS] = 0
    r[P_TOKEN] = ''
    r[P_DUE] = now
    redis.call('HSET', KEYS[3], m, rec_encode(r))
    redis.call('ZADD', KEYS[2], now, m)
    if r[P_PRIO] ~= 0 then redis.call('ZADD', KEYS[5], now, m) end
    n = n + 1
  end
end
if n > 0 then redis.call('ZADD', KEYS[4], now, 'w') end
return n
