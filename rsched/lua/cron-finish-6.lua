-- cron-finish-6: a cron run ended: release the run lock (owner-checked), keep
-- the last result in the state hash, append the execution record and its event
-- (run.failed, run.lost, or run.recovered: the first ok after a run that was not).
--
-- KEYS[1] lock     HASH run lock (see _lock.lua)
-- KEYS[2] state    HASH last_run_fire, last_result, last_host, last_done (the last
--                  finished run's result: run.recovered), ...
-- KEYS[3] history  STREAM execution records (capped)
-- KEYS[4] stats    HASH result -> count; the run-duration histogram (_duration.lua)
-- KEYS[5] wake     ZSET wake-up of the holder's watchdog (concurrency replace)
-- KEYS[6] events   STREAM the cron's events (capped)
-- ARGV[1] owner    string, owner id ("" when the run held no lock)
-- ARGV[2] maxlen   integer, history cap
-- ARGV[3] record   JSON object text (kind, name, fire_ms, started_ms, result, ...);
--                  finished_ms is set here from the server clock
-- ARGV[4] wake     '1': the run's watchdog blocks on `wake`: end its wait now
-- ARGV[5] events_max integer, events stream cap (0: no events)
-- Returns {released 1|0, now}.
--@include _now.lua
--@include _record.lua
--@include _duration.lua

local now = now_ms()
local released = 0
if ARGV[1] ~= '' and redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  released = 1
end
if ARGV[4] == '1' then
  redis.call('ZADD', KEYS[5], 0, 'end')
  redis.call('PEXPIRE', KEYS[5], 60000)
end
local rec = cjson.decode(ARGV[3])
rec['finished_ms'] = now
local last = tonumber(redis.call('HGET', KEYS[2], 'last_run_fire') or '-1')
local ev = run_event(rec['result'])
if tonumber(rec['fire_ms']) >= last then
  -- run.recovered: the first ok after a run that ended otherwise. last_result says
  -- "running" while a run goes on, so the finished runs' last result is kept apart
  -- (last_done); a skipped tick is no run and changes nothing.
  if rec['result'] ~= 'skipped' then
    local prev = redis.call('HGET', KEYS[2], 'last_done')
    if rec['result'] == 'ok' and prev and prev ~= 'ok' then ev = 'run.recovered' end
    redis.call('HSET', KEYS[2], 'last_done', rec['result'])
  end
  redis.call('HSET', KEYS[2], 'last_run_fire', rec['fire_ms'], 'last_result', rec['result'], 'last_host', rec['host'])
end
redis.call('HINCRBY', KEYS[4], rec['result'], 1)
duration_observe(KEYS[4], rec['duration_ms'], '')
history(KEYS[3], ARGV[2], rec)
if ev then event(KEYS[6], ARGV[5], ev, now, rec) end
return {released, now}
