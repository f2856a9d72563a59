-- expired-arm-3: set a keyspace trigger key with a TTL and record its expiry in
-- the backup-sweep set, in one atomic call, so that both agree on the time
-- (the server's clock). A `run expired --backup-sweep` fires the entry if the
-- key is gone and no subscriber handled its expiry event.
--
-- KEYS[1] trigger  the user's key (any name, outside the namespace): SET to
--                  ARGV[2] with PX ARGV[1]; its name is also the member below
-- KEYS[2] armed    ZSET trigger key name -> expiry (ms, server clock)
-- KEYS[3] values   HASH trigger key name -> value (handed to the handler on stdin)
-- ARGV[1] ttl      integer ms, > 0
-- ARGV[2] value    string stored in the trigger key (and in KEYS[3])
-- Returns {expiry_ms, replaced 0|1}: replaced = the key was armed already (the
--         new expiry replaces the old one; an earlier arming fires no more)
--@include _now.lua
--@include _types.lua

local bad = check_types({KEYS[2], 'zset', KEYS[3], 'hash'})
if bad then return bad end
local ttl = tonumber(ARGV[1])
if not ttl or ttl <= 0 then
  return redis.error_reply('RSCHED_BADINPUT ttl_ms must be a positive number of milliseconds')
end
local now = now_ms()
redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl)
-- The key's own absolute expiry (Redis >= 7.0), so the entry and the key agree
-- to the millisecond; older servers: the same instant by TIME.
local ok, expiry = pcall(redis.call, 'PEXPIRETIME', KEYS[1])
if not ok or type(expiry) ~= 'number' or expiry < 0 then expiry = now + ttl end
local replaced = redis.call('ZADD', KEYS[2], expiry, KEYS[1]) == 0 and 1 or 0
redis.call('HSET', KEYS[3], KEYS[1], ARGV[2])
return {expiry, replaced}
