-- lock-renew-1: extend a lock's lease, only for its owner (the watchdog).
--
-- KEYS[1] lock   HASH owner record
-- ARGV[1] owner  string, the caller's owner id
-- ARGV[2] ttl    integer ms, new lease from now
-- Returns {status, now}: status 1 renewed, 0 lost (expired or someone else's),
-- 2 renewed but another runner asked the holder to stop (concurrency replace).
--@include _now.lua

local now = now_ms()
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
  return {0, now}
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
if redis.call('HEXISTS', KEYS[1], 'cancel') == 1 then
  return {2, now}
end
return {1, now}
