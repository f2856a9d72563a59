-- fragment: cancel one task (cancel-9, cancel-batch-9). Needs _now.lua, _record.lua
-- and _after.lua.
-- k: {sched, proc, dead, tasks, history, ready, waiting, children, events} (KEYS of
-- both scripts, in that order).

-- The state member `m` is in ("scheduled"|"due"|"processing"|"dead"|"waiting"), or false.
local function task_state(k, m, now)
  local s = redis.call('ZSCORE', k[1], m)
  if s then
    return (tonumber(s) <= now) and 'due' or 'scheduled'
  elseif redis.call('ZSCORE', k[6], m) then
    return 'due'
  elseif redis.call('ZSCORE', k[2], m) then
    return 'processing'
  elseif redis.call('ZSCORE', k[3], m) then
    return 'dead'
  elseif redis.call('ZSCORE', k[7], m) then
    return 'waiting'
  end
  return false
end

-- Remove `m` (in `state`, from task_state) in any state. A processing task's run is
-- recorded `cancelled` and its claim token published on `channel`, so that the
-- consumer running it stops its handler. The tasks waiting for it go dead (a
-- task.dead event each, in a stream capped at `evmax`). Returns the state,
-- "orphan" (a record in no set) or false (absent).
local function cancel_task(k, m, state, now, maxlen, queue, channel, by, evmax)
  local raw = redis.call('HGET', k[4], m)
  redis.call('ZREM', k[1], m)
  redis.call('ZREM', k[2], m)
  redis.call('ZREM', k[3], m)
  redis.call('ZREM', k[6], m)
  redis.call('ZREM', k[7], m)
  local had = redis.call('HDEL', k[4], m)
  if not state and had == 1 then state = 'orphan' end
  if state == 'processing' and raw then
    local r = rec_decode(raw)
    local t, id = string.match(m, '^(%S+) (.*)$')
    history(k[5], maxlen, {kind = 'task', queue = queue, type = t, id = id,
      fire_ms = r[P_DUE] or now, finished_ms = now, result = 'cancelled', attempt = r[P_ATTEMPTS],
      token = r[P_TOKEN], error = 'cancelled while running, by ' .. by})
    -- pcall: a user without PUBLISH still cancels; the handler then stops at its
    -- consumer's next heartbeat (the task is gone: the lease is lost)
    if r[P_TOKEN] ~= '' then redis.pcall('PUBLISH', channel, r[P_TOKEN]) end
  end
  if had == 1 then
    after_kill({tasks = k[4], dead = k[3], waiting = k[7], children = k[8], events = k[9],
      evmax = evmax}, m, 'was cancelled', now)
  end
  return state
end
