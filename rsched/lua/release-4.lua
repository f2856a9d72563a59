-- release-4: give claimed tasks back to the due set without counting the
-- attempt (graceful shutdown). Owner-checked.
--
-- KEYS[1] sched  ZSET member -> due
-- KEYS[2] proc   ZSET member -> lease expiry
-- KEYS[3] tasks  HASH member -> record
-- KEYS[4] wake   ZSET wake-up marker
-- ARGV[1..] pairs: member, token
-- Returns the number of tasks released.
--@include _now.lua
--@include _record.lua

local now = now_ms()
local n = 0
for i = 1, #ARGV, 2 do
  local m, tok = ARGV[i], ARGV[i + 1]
  local raw = redis.call('HGET', KEYS[3], m)
  if raw and redis.call('ZSCORE', KEYS[2], m) then
    local r = rec_decode(raw)
    if r[P_TOKEN] == tok then
      redis.call('ZREM', KEYS[2], m)
      r[P_TOKEN] = ''
      r[P_ATTEMPTS] = math.max(0, r[P_ATTEMPTS] - 1)
      redis.call('HSET', KEYS[3], m, rec_encode(r))
      redis.call('ZADD', KEYS[1], math.min(r[P_DUE] or now, now), m)
      n = n + 1
    end
  end
end
if n > 0 then redis.call('ZADD', KEYS[4], now, 'w') end
return n
