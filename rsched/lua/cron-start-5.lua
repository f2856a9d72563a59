-- cron-start-5: take the run lock for a tick this runner already claimed
-- (concurrency replace: the tick waits, as the state's replace_fire, for the
-- previous holder to stop; the caller polls this script until it runs).
--
-- KEYS[1] lock     HASH run lock (see _lock.lua)
-- KEYS[2] fence    STRING fencing counter
-- KEYS[3] state    HASH cron state (replace_fire: the one tick waiting to replace)
-- KEYS[4] history  STREAM execution records
-- KEYS[5] wake     ZSET wake-up of the holder (see _cron.lua)
-- ARGV[1] fire     integer ms, the tick
-- ARGV[2] owner    string, owner id
-- ARGV[3] ttl      integer ms, lease
-- ARGV[4] host     string
-- ARGV[5] pid      integer
-- ARGV[6] give_up  '' = keep waiting; anything else: stop waiting and record the tick
--                  `skipped` with this text as the reason, unless it can run right now
--                  (a run asked for: with its cause and trigger fields, replace_extra)
-- ARGV[7] maxlen   integer, history cap
-- ARGV[8] name     string, the cron's name
-- ARGV[9] take     '0': with give_up, do not take a free lock either (the runner stops)
-- Returns {'run', now, token} | {'held', now} | {'skipped', now} |
--   {'superseded', now}: a newer tick took this one's place (and recorded it `skipped`),
--   or this one was already dealt with: nothing to do, nothing written.
--@include _now.lua
--@include _record.lua
--@include _lock.lua
--@include _cron.lua

local now = now_ms()
local fire, host, pid = ARGV[1], ARGV[4], ARGV[5]
if redis.call('HGET', KEYS[3], 'replace_fire') ~= fire then
  return {'superseded', now}
end
local tok = nil
if ARGV[6] == '' or ARGV[9] ~= '0' then
  tok = lock_try(KEYS[1], KEYS[2], ARGV[2], tonumber(ARGV[3]), host, pid, now)
end
if tok then
  redis.call('HSET', KEYS[1], 'fire', fire)
  redis.call('HDEL', KEYS[3], 'replace_fire', 'replace_extra')
  redis.call('DEL', KEYS[5])  -- a new run starts with no stale wake-up
  redis.call('HSET', KEYS[3], 'last_run_fire', fire, 'last_result', 'running', 'last_host', host)
  return {'run', now, tok}
end
if ARGV[6] ~= '' then
  local extra = cron_replace_extra(KEYS[3])
  redis.call('HDEL', KEYS[3], 'replace_fire', 'replace_extra')
  cron_note(KEYS[4], ARGV[7], ARGV[8], fire, now, 'skipped', ARGV[6], host, pid, extra)
  return {'skipped', now}
end
-- Held: by the run this tick replaces, or by one that took the lock after it expired.
cron_ask_stop(KEYS[1], KEYS[5], fire, tonumber(ARGV[3]))
return {'held', now}
