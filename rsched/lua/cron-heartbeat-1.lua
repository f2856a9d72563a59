-- cron-heartbeat-1: a waiting runner keeps its registration and reads the server clock.
--
-- KEYS[1] runners  ZSET runner id -> registration expiry (ms)
-- ARGV[1] runner   string, runner id
-- ARGV[2] ttl      integer ms, registration lifetime
-- Returns {live runners, now}.
--@include _now.lua
--@include _cron.lua

local now = now_ms()
cron_register(KEYS[1], ARGV[1], tonumber(ARGV[2]), now)
return {redis.call('ZCARD', KEYS[1]), now}
