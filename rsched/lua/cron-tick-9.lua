-- cron-tick-9: a runner claims one tick of a cron (not a lock: the tick
-- itself, once ever), by the server's clock, and decides what happens to it.
--
-- KEYS[1] ticks    ZSET member fire_ms -> claim time (ms), trimmed by age
-- KEYS[2] state    HASH last_tick, last_run_fire, last_result, last_host, ...
-- KEYS[3] lock     HASH the run lock's owner record (see _lock.lua)
-- KEYS[4] fence    STRING fencing counter
-- KEYS[5] paused   STRING present while the cron is paused
-- KEYS[6] history  STREAM execution records (capped)
-- KEYS[7] runners  ZSET runner id -> registration expiry (ms)
-- KEYS[8] wake     ZSET wake-up of the run lock's holder (concurrency replace; see _cron.lua)
-- KEYS[9] events   STREAM the cron's events (capped): `tick.missed`
-- ARGV[1]  fire         integer ms, the tick
-- ARGV[2]  mode         'fire' (run it if allowed) | 'missed' (only record it as missed)
-- ARGV[3]  runner       string, runner id for the registry
-- ARGV[4]  owner        string, owner id for the run lock
-- ARGV[5]  ttl          integer ms, run-lock lease
-- ARGV[6]  host         string
-- ARGV[7]  pid          integer
-- ARGV[8]  concurrency  'forbid' | 'allow' | 'replace'
-- ARGV[9]  deadline     integer ms: later than fire + deadline the tick is missed; -1 = no limit
-- ARGV[10] keep         integer ms, how long claimed ticks are remembered
-- ARGV[11] maxlen       integer, history cap
-- ARGV[12] name         string, the cron's name (for records)
-- ARGV[13] runner_ttl   integer ms, registry entry lifetime
-- ARGV[14] events_max   integer, events stream cap (0: no events)
-- Returns {status, now[, token]}; status:
--   'early'   the tick is in the future by the server's clock (nothing written)
--   'taken'   another runner claimed it already
--   'missed'  claimed, too late (or mode missed): recorded `missed`
--   'paused'  claimed, cron paused (now, or at the tick: see cron_paused): recorded
--             `skipped` (paused), even when it is also late
--   'skipped' claimed, previous run still active (forbid): recorded `skipped`
--   'replace' claimed, a run is active: its holder was asked to stop (and woken); this tick
--             is now the one waiting (state replace_fire): take the lock when free with
--             cron-start-5. An older waiting tick is recorded `skipped` (superseded).
--   'run'     claimed, run it with fencing token `token` (lock taken unless concurrency allow)
--@include _now.lua
--@include _record.lua
--@include _types.lua
--@include _lock.lua
--@include _cron.lua
--@include _admit.lua

local bad = check_types({KEYS[1], 'zset', KEYS[2], 'hash', KEYS[3], 'hash', KEYS[4], 'string',
  KEYS[6], 'stream', KEYS[7], 'zset', KEYS[8], 'zset'})
if bad then return bad end
local now = now_ms()
local fire = ARGV[1]
local maxlen, name, host, pid = ARGV[11], ARGV[12], ARGV[6], ARGV[7]
cron_register(KEYS[7], ARGV[3], tonumber(ARGV[13]), now)
if tonumber(fire) > now then
  return {'early', now}
end
if not cron_claim_tick(KEYS[1], KEYS[2], fire, now, tonumber(ARGV[10])) then
  return {'taken', now}
end
if cron_paused(KEYS[5], KEYS[2], fire) then
  cron_note(KEYS[6], maxlen, name, fire, now, 'skipped', 'paused', host, pid)
  return {'paused', now}
end
local deadline = tonumber(ARGV[9])
if ARGV[2] == 'missed' or (deadline >= 0 and now - tonumber(fire) > deadline) then
  cron_note(KEYS[6], maxlen, name, fire, now, 'missed', 'late by ' .. (now - tonumber(fire)) .. ' ms', host, pid)
  event(KEYS[9], ARGV[14], 'tick.missed', now, {kind = 'cron', name = name, fire_ms = tonumber(fire),
    result = 'missed', error = 'late by ' .. (now - tonumber(fire)) .. ' ms', host = host})
  return {'missed', now}
end
local st, got = cron_admit({lock = KEYS[3], fence = KEYS[4], state = KEYS[2], hist = KEYS[6],
  wake = KEYS[8], conc = ARGV[8], owner = ARGV[4], ttl = tonumber(ARGV[5]), host = host, pid = pid,
  now = now, maxlen = maxlen, name = name}, fire, nil)
if st == 'run' then return {'run', now, got} end
return {st, now}
