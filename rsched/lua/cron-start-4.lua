-- cron-start-4: take the run lock for a tick this runner already claimed
-- (concurrency replace, after the previous holder stopped).
--
-- KEYS[1] lock     HASH run lock (see _lock.lua)
-- KEYS[2] fence    STRING fencing counter
-- KEYS[3] state    HASH cron state
-- KEYS[4] history  STREAM execution records
-- ARGV[1] fire     integer ms, the tick
-- ARGV[2] owner    string, owner id
-- ARGV[3] ttl      integer ms, lease
-- ARGV[4] host     string
-- ARGV[5] pid      integer
-- ARGV[6] give_up  1 = do not wait any longer: record the tick skipped if still held
-- ARGV[7] maxlen   integer, history cap
-- ARGV[8] name     string, the cron's name
-- Returns {'run', now, token} | {'held', now} | {'skipped', now}.
--@include _now.lua
--@include _record.lua
--@include _lock.lua
--@include _cron.lua

local now = now_ms()
local fire, host, pid = ARGV[1], ARGV[4], ARGV[5]
local tok = lock_try(KEYS[1], KEYS[2], ARGV[2], tonumber(ARGV[3]), host, pid, now)
if tok then
  redis.call('HSET', KEYS[1], 'fire', fire)
  redis.call('HSET', KEYS[3], 'last_run_fire', fire, 'last_result', 'running', 'last_host', host)
  return {'run', now, tok}
end
if ARGV[6] == '1' then
  cron_note(KEYS[4], ARGV[7], ARGV[8], fire, now, 'skipped', 'the running job did not stop in time to be replaced', host, pid)
  return {'skipped', now}
end
redis.call('HSET', KEYS[1], 'cancel', fire)
return {'held', now}
