-- cancel-5: remove a task in any state. A processing task's run is recorded
-- `cancelled` in the history, and the consumers of the queue are told (PUBLISH of
-- its claim token) so that the one running it stops its handler.
--
-- KEYS[1] sched, KEYS[2] proc, KEYS[3] dead (ZSETs); KEYS[4] tasks (HASH)
-- KEYS[5] history  STREAM execution records
-- ARGV[1] member
-- ARGV[2] maxlen   integer, history cap
-- ARGV[3] queue    queue name (for the history record)
-- ARGV[4] channel  the queue's cancel channel (Pub/Sub: not a key)
-- ARGV[5] by       who cancelled ("HOST pid N"), for the record's error text
-- Returns the state it was in ("scheduled"|"due"|"processing"|"dead"|"orphan"),
-- or false if absent.
--@include _now.lua
--@include _record.lua

local m = ARGV[1]
local now = now_ms()
local state = false
local s = redis.call('ZSCORE', KEYS[1], m)
if s then
  state = (tonumber(s) <= now) and 'due' or 'scheduled'
elseif redis.call('ZSCORE', KEYS[2], m) then
  state = 'processing'
elseif redis.call('ZSCORE', KEYS[3], m) then
  state = 'dead'
end
local raw = redis.call('HGET', KEYS[4], m)
redis.call('ZREM', KEYS[1], m)
redis.call('ZREM', KEYS[2], m)
redis.call('ZREM', KEYS[3], m)
local had = redis.call('HDEL', KEYS[4], m)
if not state and had == 1 then state = 'orphan' end
if state == 'processing' and raw then
  local r = rec_decode(raw)
  local t, id = string.match(m, '^(%S+) (.*)$')
  history(KEYS[5], ARGV[2], {kind = 'task', queue = ARGV[3], type = t, id = id,
    fire_ms = r[P_DUE] or now, finished_ms = now, result = 'cancelled', attempt = r[P_ATTEMPTS],
    token = r[P_TOKEN], error = 'cancelled while running, by ' .. ARGV[5]})
  -- pcall: a user without PUBLISH still cancels; the handler then stops at its
  -- consumer's next heartbeat (the task is gone: the lease is lost)
  if r[P_TOKEN] ~= '' then redis.pcall('PUBLISH', ARGV[4], r[P_TOKEN]) end
end
return state
