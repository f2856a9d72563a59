-- exec-acquire-3: `rsched exec`: take the lock and, with --once-per, claim the
-- tick, atomically. A tick is claimed once ever: a second host whose cron
-- fires late (or early, for the same tick) finds it taken.
--
-- KEYS[1] lock   HASH owner record (see _lock.lua)
-- KEYS[2] fence  STRING fencing counter
-- KEYS[3] ticks  ZSET member fire_ms -> claim time (ms), trimmed by age
-- ARGV[1] owner  string, the caller's random owner id
-- ARGV[2] ttl    integer ms, lease length
-- ARGV[3] host   string
-- ARGV[4] pid    integer
-- ARGV[5] fire   integer ms, the tick to claim; -1 without --once-per
-- ARGV[6] keep   integer ms, how long claimed ticks are remembered
-- Returns {'ok', now, token} | {'done', now, claimed_at_ms} (tick already run)
--       | {'locked', now, host, pid, token, pttl_ms} | {'early', now} (tick is in the future)
--@include _now.lua
--@include _types.lua
--@include _lock.lua

local bad = check_types({KEYS[1], 'hash', KEYS[2], 'string', KEYS[3], 'zset'})
if bad then return bad end
local now = now_ms()
local fire = tonumber(ARGV[5])
if fire >= 0 then
  if fire > now then
    return {'early', now}
  end
  local at = redis.call('ZSCORE', KEYS[3], ARGV[5])
  if at then
    return {'done', now, at}
  end
end
local tok = lock_try(KEYS[1], KEYS[2], ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], now)
if not tok then
  local h = lock_holder(KEYS[1])
  return {'locked', now, h[1], h[2], h[3], h[4]}
end
if fire >= 0 then
  redis.call('ZADD', KEYS[3], now, ARGV[5])
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - tonumber(ARGV[6]))
  redis.call('HSET', KEYS[1], 'fire', ARGV[5])
end
return {'ok', now, tok}
