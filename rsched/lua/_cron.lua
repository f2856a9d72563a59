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

-- Whether tick `fire` falls while the cron is or was paused: paused now (the
-- `paused` key), or inside the last pause (state fields pause_from_ms / pause_to_ms,
-- written by cron-pause-2 on resume), so that ticks a runner catches up on after
-- a pause are recorded `skipped` (paused), not `missed`.
local function cron_paused(paused, state, fire)
  if redis.call('EXISTS', paused) == 1 then
    return true
  end
  local p = redis.call('HMGET', state, 'pause_from_ms', 'pause_to_ms')
  local f = tonumber(fire)
  return p[1] ~= false and p[2] ~= false and f >= tonumber(p[1]) and f < tonumber(p[2])
end

-- An execution record for a tick (or a run asked for) that did not run (skipped /
-- missed); `extra` (optional): more fields (a run asked for: cause, triggered_by, trigger).
local function cron_note(hist, maxlen, name, fire, now, result, err, host, pid, extra)
  local rec = {kind = 'cron', name = name, fire_ms = tonumber(fire), started_ms = now,
    finished_ms = now, duration_ms = 0, result = result, host = host, pid = tonumber(pid), error = err}
  if extra then
    for f, v in pairs(extra) do rec[f] = v end
  end
  history(hist, maxlen, rec)
end

-- The record fields of the run waiting to replace (state replace_extra, a JSON
-- object, when a run asked for waits), or nil (a tick waits).
local function cron_replace_extra(state)
  local raw = redis.call('HGET', state, 'replace_extra')
  if raw then return cjson.decode(raw) end
  return nil
end

-- concurrency replace: at most one tick waits for the running job to stop (the state
-- field `replace_fire`). A newer tick supersedes it: the older one is recorded
-- `skipped` here, once (its runner sees the field changed and records nothing), with
-- the cause and trigger fields of a run asked for (replace_extra).
local function cron_supersede(state, hist, maxlen, name, fire, now, host, pid)
  local prev = redis.call('HGET', state, 'replace_fire')
  if prev and prev ~= fire then
    cron_note(hist, maxlen, name, prev, now, 'skipped',
      'superseded by a newer tick (' .. fire .. ') while waiting for the running job to stop', host, pid,
      cron_replace_extra(state))
  end
  if prev then
    redis.call('HDEL', state, 'replace_fire', 'replace_extra')
  end
end

-- Ask the run lock's holder to stop for tick `fire`: the `cancel` field its renewals
-- see, and a wake-up on `wake` (a ZSET; the holder's watchdog blocks on it with
-- BZPOPMIN) so that it renews, and learns it, at once. Only when not asked already.
local function cron_ask_stop(lock, wake, fire, ttl)
  if redis.call('HGET', lock, 'cancel') ~= fire then
    redis.call('HSET', lock, 'cancel', fire)
    redis.call('ZADD', wake, fire, 'w')
    redis.call('PEXPIRE', wake, ttl)
  end
end
