-- fragment: cron bookkeeping shared by the cron-* scripts.
-- Register / refresh a runner in the heartbeat registry and drop expired ones.
local function cron_register(runners, id, ttl, now)
  if id ~= '' then
    redis.call('ZADD', runners, now + ttl, id)
  end
  redis.call('ZREMRANGEBYSCORE', runners, '-inf', now)
end

-- Claim tick `fire` once ever (ZADD NX); trims ticks claimed longer than `keep` ago.
-- A tick at or before the high-water mark `last_tick` counts as taken even when
-- it was trimmed from the set (runners claim ticks in order, so it was handled).
local function cron_claim_tick(ticks, state, fire, now, keep)
  local last = tonumber(redis.call('HGET', state, 'last_tick') or '-1')
  if tonumber(fire) <= last and not redis.call('ZSCORE', ticks, fire) then
    return false
  end
  local added = redis.call('ZADD', ticks, 'NX', now, fire)
  if added == 1 then
    redis.call('ZREMRANGEBYSCORE', ticks, '-inf', now - keep)
    if tonumber(fire) > last then
      redis.call('HSET', state, 'last_tick', fire)
    end
  end
  return added == 1
end

-- An execution record for a tick that did not run (skipped / missed).
local function cron_note(hist, maxlen, name, fire, now, result, err, host, pid)
  history(hist, maxlen, {kind = 'cron', name = name, fire_ms = tonumber(fire), started_ms = now,
    finished_ms = now, duration_ms = 0, result = result, host = host, pid = tonumber(pid), error = err})
end
