-- event-silent-2: record `cron.silent` (the dead-man's switch) once per silence:
-- a tick passed and nothing ran the cron since `seen`. The state field
-- `silent_fire` keeps the silence's tick: while nothing ran after it (seen <=
-- silent_fire) the silence is the same one and nothing is written.
--
-- KEYS[1] state    HASH the cron's state (field silent_fire)
-- KEYS[2] events   STREAM the cron's events (capped)
-- ARGV[1] fire     integer ms, the unrun tick
-- ARGV[2] seen     integer ms, the latest thing a runner did for the cron
-- ARGV[3] name     string, the cron's name
-- ARGV[4] host     string, the host that noticed
-- ARGV[5] events_max integer, events stream cap
-- Returns 1 when recorded, 0 when this silence has its event already.
--@include _now.lua
--@include _record.lua

local sf = tonumber(redis.call('HGET', KEYS[1], 'silent_fire') or '-1')
if sf >= tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 'silent_fire', ARGV[1])
event(KEYS[2], ARGV[5], 'cron.silent', now_ms(), {kind = 'cron', name = ARGV[3],
  fire_ms = tonumber(ARGV[1]), result = 'missed', host = ARGV[4],
  error = 'nothing ran the tick (no live runner)'})
return 1
