-- fragment: move tasks whose lease expired back to the due set, or to the dead
-- set when they have used all their attempts. Needs _now.lua and _record.lua.
-- Each lapsed lease is a `run.lost` event in `events` (capped at `evmax`; nil or
-- 0: none), and a task it sends dead also a `task.dead` (result `lost`), written
-- here with the history record, so in the same step as the reap.
-- The tasks waiting for one it sends dead (`waiting`, `children`; _after.lua, which
-- the script includes before this) go dead too.
-- Returns requeued, dead, and whether more stale entries remain past `limit`.
local function reap(sched, proc, dead, tasks, hist, now, limit, maxlen, queue, dry, defmax, events, evmax,
                    waiting, children)
  local stale = redis.call('ZRANGEBYSCORE', proc, '-inf', now, 'LIMIT', 0, limit + 1)
  local more = 0
  if #stale > limit then
    more = 1
    stale[#stale] = nil
  end
  local requeued, died = 0, 0
  for _, m in ipairs(stale) do
    local raw = redis.call('HGET', tasks, m)
    if not raw then
      if not dry then redis.call('ZREM', proc, m) end
    else
      local r = rec_decode(raw)
      local maxa = eff_max(r, defmax)
      local is_dead = r[P_ATTEMPTS] >= maxa
      if is_dead then died = died + 1 else requeued = requeued + 1 end
      if not dry then
        local lost_token = r[P_TOKEN]
        redis.call('ZREM', proc, m)
        r[P_TOKEN] = ''
        if is_dead then
          r[P_ERROR] = 'lease expired (attempt ' .. r[P_ATTEMPTS] .. ' of ' .. maxa .. ')'
          redis.call('ZADD', dead, now, m)
        else
          r[P_ERROR] = 'lease expired (attempt ' .. r[P_ATTEMPTS] .. ')'
          redis.call('ZADD', sched, now, m)
        end
        redis.call('HSET', tasks, m, rec_encode(r))
        local t, id = string.match(m, '^(%S+) (.*)$')
        local rec = {kind = 'task', queue = queue, type = t, id = id,
          fire_ms = r[P_DUE] or now, finished_ms = now, result = 'lost', attempt = r[P_ATTEMPTS],
          token = lost_token, error = r[P_ERROR]}
        history(hist, maxlen, rec)
        if events and evmax then
          event(events, evmax, 'run.lost', now, rec)
          if is_dead then event(events, evmax, 'task.dead', now, rec) end
        end
        if is_dead then
          after_kill({tasks = tasks, dead = dead, waiting = waiting, children = children,
            events = events, evmax = evmax}, m, 'went dead', now)
        end
      end
    end
  end
  return requeued, died, more
end
