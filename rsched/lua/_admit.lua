-- fragment: the concurrency policy of a run about to start, shared by a tick's
-- (cron-tick-9, fire = the tick) and a run asked for (cron-trigger-claim-8, fire =
-- the server's now). Needs _lock.lua and _cron.lua (and _record.lua) before it.
-- `c`: {lock, fence, state, hist, wake, conc, owner, ttl, host, pid, now, maxlen, name}
-- (KEYS and ARGV of the caller); `extra`: nil for a tick, else the record fields of
-- the run asked for (cause, triggered_by, trigger[, after_token]).
-- Returns one of:
--   'run', token     run it (the run lock taken with `token`, unless concurrency allow;
--                    the state's last_run_fire / last_result / last_host say running)
--   'replace', holder  concurrency replace and a run is active: this run now waits as
--                    the state's replace_fire (and replace_extra), its holder was asked
--                    to stop; an older waiting run is recorded `skipped` (superseded)
--   'skipped', why   concurrency forbid and a run is active: recorded `skipped`
local function cron_admit(c, fire, extra)
  local tok
  if c.conc == 'allow' then
    tok = redis.call('INCR', c.fence)
  else
    tok = lock_try(c.lock, c.fence, c.owner, c.ttl, c.host, c.pid, c.now)
    if not tok then
      local h = lock_holder(c.lock)
      if c.conc == 'replace' then
        cron_supersede(c.state, c.hist, c.maxlen, c.name, fire, c.now, c.host, c.pid)
        redis.call('HSET', c.state, 'replace_fire', fire)
        if extra then
          redis.call('HSET', c.state, 'replace_extra', cjson.encode(extra))
        else
          redis.call('HDEL', c.state, 'replace_extra')
        end
        cron_ask_stop(c.lock, c.wake, fire, c.ttl)
        return 'replace', h
      end
      local why = 'previous run still active (host ' .. h[1] .. ', pid ' .. h[2] .. ', token ' .. h[3] .. ')'
      cron_note(c.hist, c.maxlen, c.name, fire, c.now, 'skipped', why, c.host, c.pid, extra)
      return 'skipped', why
    end
    redis.call('HSET', c.lock, 'fire', fire)
    if c.conc == 'replace' then
      cron_supersede(c.state, c.hist, c.maxlen, c.name, fire, c.now, c.host, c.pid)
      redis.call('DEL', c.wake)  -- a new run starts with no stale wake-up
    end
  end
  redis.call('HSET', c.state, 'last_run_fire', fire, 'last_result', 'running', 'last_host', c.host)
  return 'run', tok
end
