-- fail-10: a run failed: retry the task after a backoff, or dead-letter it
-- when it has used all its attempts (event task.dead); the tasks waiting for a
-- dead-lettered one go dead too (_after.lua). Owner-checked by claim token.
--
-- KEYS[1] sched    ZSET member -> due
-- KEYS[2] proc     ZSET member -> lease expiry
-- KEYS[3] dead     ZSET member -> died at
-- KEYS[4] tasks    HASH member -> record
-- KEYS[5] history  STREAM execution records
-- KEYS[6] stats    HASH counters; the run-duration histogram (_duration.lua)
-- KEYS[7] wake     ZSET wake-up marker
-- KEYS[8] events   STREAM the queue's events (capped)
-- KEYS[9] waiting  ZSET tasks waiting for parents -> due
-- KEYS[10] children HASH parent member -> JSON array of its waiting children
-- ARGV[1] maxlen   integer, history cap
-- ARGV[2] member
-- ARGV[3] token
-- ARGV[4] error    text (exit status and the last lines of stderr)
-- ARGV[5] backoff  integer ms before the next attempt
-- ARGV[6] history  JSON object text ("" for none)
-- ARGV[7] result   "failed" | "timeout"
-- ARGV[8] dead_now "1" to dead-letter whatever the attempts (e.g. payload refused)
-- ARGV[9] defmax   integer, max attempts for tasks added without one
-- ARGV[10] events_max integer, events stream cap (0: no events)
-- Returns {"retry", due} | {"dead", died_at} | {"stale", 0}
--@include _now.lua
--@include _record.lua
--@include _duration.lua
--@include _after.lua

local m, tok = ARGV[2], ARGV[3]
local raw = redis.call('HGET', KEYS[4], m)
if not raw or not redis.call('ZSCORE', KEYS[2], m) then return {'stale', 0} end
local r = rec_decode(raw)
if r[P_TOKEN] ~= tok then return {'stale', 0} end

local now = now_ms()
redis.call('ZREM', KEYS[2], m)
r[P_TOKEN] = ''
r[P_ERROR] = ARGV[4]
if ARGV[6] ~= '' and tonumber(ARGV[1]) > 0 then
  redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[1], '*', 'j', ARGV[6])
end
local t = task_type(m)
redis.call('HINCRBY', KEYS[6], ARGV[7] .. '|' .. t, 1)
if ARGV[6] ~= '' then
  duration_observe(KEYS[6], string.match(ARGV[6], '"duration_ms":(%d+)'), '|' .. t)
end
if ARGV[8] == '1' or r[P_ATTEMPTS] >= eff_max(r, tonumber(ARGV[9])) then
  redis.call('ZADD', KEYS[3], now, m)
  redis.call('HSET', KEYS[4], m, rec_encode(r))
  redis.call('HINCRBY', KEYS[6], 'dead|' .. t, 1)
  local ev = {kind = 'task', type = t, id = string.sub(m, #t + 2), result = ARGV[7], error = ARGV[4],
    attempt = r[P_ATTEMPTS], token = tok}
  if ARGV[6] ~= '' then ev = cjson.decode(ARGV[6]) end
  event(KEYS[8], ARGV[10], 'task.dead', now, ev)
  after_kill({tasks = KEYS[4], dead = KEYS[3], waiting = KEYS[9], children = KEYS[10],
    stats = KEYS[6], events = KEYS[8], evmax = ARGV[10]}, m, 'went dead', now)
  return {'dead', now}
end
local due = now + tonumber(ARGV[5])
r[P_DUE] = due
redis.call('HSET', KEYS[4], m, rec_encode(r))
redis.call('ZADD', KEYS[1], due, m)
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] and tonumber(first[2]) >= due then
  redis.call('ZADD', KEYS[7], due, 'w')
end
return {'retry', due}
