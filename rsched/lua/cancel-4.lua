-- cancel-4: remove a task in any state.
--
-- KEYS[1] sched, KEYS[2] proc, KEYS[3] dead (ZSETs); KEYS[4] tasks (HASH)
-- ARGV[1] member
-- Returns the state it was in ("scheduled"|"due"|"processing"|"dead"), or false if absent.
-- A cancelled processing task's handler keeps running; its ack is then refused.
--@include _now.lua

local m = ARGV[1]
local state = false
local s = redis.call('ZSCORE', KEYS[1], m)
if s then
  state = (tonumber(s) <= now_ms()) and 'due' or 'scheduled'
elseif redis.call('ZSCORE', KEYS[2], m) then
  state = 'processing'
elseif redis.call('ZSCORE', KEYS[3], m) then
  state = 'dead'
end
redis.call('ZREM', KEYS[1], m)
redis.call('ZREM', KEYS[2], m)
redis.call('ZREM', KEYS[3], m)
local had = redis.call('HDEL', KEYS[4], m)
if not state and had == 1 then state = 'orphan' end
return state
