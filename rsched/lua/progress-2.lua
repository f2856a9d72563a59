-- progress-2: a running task's handler reports how far it is (`task.progress()`,
-- RSCHED_PROGRESS_FD): kept in its record until the next claim. Owner-checked by
-- claim token: a run whose lease was lost writes nothing.
--
-- KEYS[1] proc     ZSET member -> lease expiry
-- KEYS[2] tasks    HASH member -> record (_record.lua)
-- ARGV[1] member
-- ARGV[2] token    the run's claim token
-- ARGV[3] fraction number 0..1 (checked by the caller)
-- ARGV[4] message  text (at most 200 characters, checked by the caller)
-- Returns 1 written, 0 refused (not this run's any more).
--@include _now.lua
--@include _record.lua

local m = ARGV[1]
local raw = redis.call('HGET', KEYS[2], m)
if not raw or not redis.call('ZSCORE', KEYS[1], m) then return 0 end
local r = rec_decode(raw)
if r[P_TOKEN] ~= ARGV[2] then return 0 end
r[P_PROG] = {tonumber(ARGV[3]), ARGV[4], now_ms()}
redis.call('HSET', KEYS[2], m, rec_encode(r))
return 1
