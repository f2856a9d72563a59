-- expired-disarm-3: cancel a keyspace trigger: delete the trigger key and its
-- backup-sweep entry together (a plain DEL of an armed key would look, to the
-- sweep, like an expiry whose event was lost, and fire it).
--
-- KEYS[1] trigger  the user's key; its name is also the member below
-- KEYS[2] armed    ZSET trigger key name -> expiry (ms)
-- KEYS[3] values   HASH trigger key name -> value
-- Returns {key_deleted 0|1, was_armed 0|1}
--@include _types.lua

local bad = check_types({KEYS[2], 'zset', KEYS[3], 'hash'})
if bad then return bad end
local deleted = redis.call('DEL', KEYS[1])
local armed = redis.call('ZREM', KEYS[2], KEYS[1])
redis.call('HDEL', KEYS[3], KEYS[1])
return {deleted, armed}
