-- lock-release-5: release a lock only if the caller owns it, wake one waiter,
-- and append the run's execution record and its event (run.failed, run.lost).
--
-- KEYS[1] lock     HASH owner record
-- KEYS[2] history  STREAM execution records (capped)
-- KEYS[3] wake     LIST the lock's waiters BLPOP on (see _lock.lua)
-- KEYS[4] stats    HASH the run-duration histogram of the record's runs (_duration.lua)
-- KEYS[5] events   STREAM the lock's events (capped)
-- ARGV[1] owner    string, the caller's owner id
-- ARGV[2] maxlen   integer, history cap (0 = no record)
-- ARGV[3] record   JSON object text, the execution record ("" = none);
--                  its finished_ms is set here from the server clock unless it
--                  has one (a record written late, after an outage)
-- ARGV[4] keep     integer ms, how long an unclaimed wake-up stays (for a waiter
--                  between its failed try and its BLPOP)
-- ARGV[5] events_max integer, events stream cap (0: no events)
-- Returns {released 1|0, now}.
--@include _now.lua
--@include _record.lua
--@include _lock.lua
--@include _duration.lua

local now = now_ms()
local released = 0
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  lock_wake(KEYS[3], tonumber(ARGV[4]))
  released = 1
end
if ARGV[3] ~= '' then
  local rec = cjson.decode(ARGV[3])
  if rec['finished_ms'] == nil then rec['finished_ms'] = now end
  history(KEYS[2], ARGV[2], rec)
  duration_observe(KEYS[4], rec['duration_ms'], '')
  local ev = run_event(rec['result'])
  if ev then event(KEYS[5], ARGV[5], ev, now, rec) end
end
return {released, now}
