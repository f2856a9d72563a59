-- cron-trigger-claim-8: a runner claims one run request (from cron-trigger-5)
-- and runs it like a tick fired at the server's now: the same pause switch,
-- concurrency policy, run lock and fencing token as cron-tick-9 (_admit.lua). Only one
-- runner's ZREM removes the request: that runner, and only it, acts on it.
--
-- KEYS[1] triggers  ZSET request JSON -> when asked (ms)
-- KEYS[2] reply     LIST the asker's answer (a JSON object; expires after 60 s)
-- KEYS[3] state     HASH cron state (last_run_fire, last_result, last_host, replace_fire)
-- KEYS[4] lock      HASH the run lock (see _lock.lua)
-- KEYS[5] fence     STRING fencing counter
-- KEYS[6] paused    STRING present while paused
-- KEYS[7] history   STREAM execution records (capped)
-- KEYS[8] wake      ZSET wake-up of the run lock's holder (concurrency replace)
-- ARGV[1] request   the request's member text, as read from `triggers`
-- ARGV[2] owner     string, owner id for the run lock
-- ARGV[3] ttl       integer ms, run-lock lease
-- ARGV[4] host      string
-- ARGV[5] pid       integer
-- ARGV[6] concurrency 'forbid' | 'allow' | 'replace'
-- ARGV[7] maxlen    integer, history cap
-- ARGV[8] name      string, the cron's name
-- Returns {status, now[, token]}; status (also sent to the asker as {"status": ...}):
--   'gone'     another runner claimed it, or the asker withdrew it (nothing written)
--   'expired'  nobody claimed it in time: dropped (recorded `missed` for an --after run)
--   'paused'   recorded `skipped` (paused)
--   'skipped'  concurrency forbid and a run is active: recorded `skipped`
--   'replace'  concurrency replace: the running job was asked to stop; this run waits
--              as replace_fire = now (take it with cron-start-5), token not known yet
--   'run'      run it now with fencing token `token` (fire_ms = now)
--@include _now.lua
--@include _record.lua
--@include _lock.lua
--@include _cron.lua
--@include _admit.lua

local now = now_ms()
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then
  return {'gone', now}
end
local req = cjson.decode(ARGV[1])
local host, pid, maxlen, name = ARGV[4], ARGV[5], ARGV[7], ARGV[8]
local extra = {cause = req['cause'], triggered_by = req['by'], trigger = req['id'],
  after_token = req['after_token']}
local function note(result, err)
  cron_note(KEYS[7], maxlen, name, now, now, result, err, host, pid, extra)
end
local function answer(t)
  redis.call('LPUSH', KEYS[2], cjson.encode(t))
  redis.call('PEXPIRE', KEYS[2], 60000)
end
if tonumber(req['exp'] or now) < now then
  if req['after_token'] then
    note('missed', 'no runner claimed it within ' .. (now - tonumber(req['exp'])) .. ' ms of its bound')
  end
  return {'expired', now}
end
if redis.call('EXISTS', KEYS[6]) == 1 then
  note('skipped', 'paused')
  answer({status = 'paused', host = host})
  return {'paused', now}
end
local st, got = cron_admit({lock = KEYS[4], fence = KEYS[5], state = KEYS[3], hist = KEYS[7],
  wake = KEYS[8], conc = ARGV[6], owner = ARGV[2], ttl = tonumber(ARGV[3]), host = host, pid = pid,
  now = now, maxlen = maxlen, name = name}, tostring(now), extra)
if st == 'replace' then
  answer({status = 'replace', host = host, fire_ms = now,
    message = 'the running job (token ' .. got[3] .. ') was asked to stop'})
  return {'replace', now}
elseif st == 'skipped' then
  answer({status = 'skipped', host = host, message = got})
  return {'skipped', now}
end
answer({status = 'run', host = host, token = got, fire_ms = now})
return {'run', now, got}
