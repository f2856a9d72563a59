-- lock-acquire-2: take an owned lock with a TTL and a new fencing token.
--
-- KEYS[1] lock   HASH owner record (see _lock.lua), expires after the TTL
-- KEYS[2] fence  STRING fencing counter (INCR per acquisition, never reset)
-- ARGV[1] owner  string, the caller's random owner id
-- ARGV[2] ttl    integer ms, lease length
-- ARGV[3] host   string, for listings
-- ARGV[4] pid    integer, for listings
-- Returns {1, token, now} when acquired, or
--         {0, now, holder_host, holder_pid, holder_token, pttl_ms} when held.
--@include _now.lua
--@include _types.lua
--@include _lock.lua

local bad = check_types({KEYS[1], 'hash', KEYS[2], 'string'})
if bad then return bad end
local now = now_ms()
local tok = lock_try(KEYS[1], KEYS[2], ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], now)
if tok then
  return {1, tok, now}
end
local h = lock_holder(KEYS[1])
return {0, now, h[1], h[2], h[3], h[4]}
