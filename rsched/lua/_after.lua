-- fragment: tasks that wait for parents (`add --after`). Needs _record.lua.
-- A waiting task is in the `waiting` ZSET (score: its own due time) with its pending
-- parents in its record (P_AFTER); the `children` HASH maps each parent member to
-- the JSON array of the members added after it. Entries of a child that was since
-- cancelled or replaced are stale and skipped (a child must still be waiting, and
-- still name the parent).
-- k: {tasks=, sched=, wake=, prio=, dead=, waiting=, children=, stats=, events=, evmax=}
-- (the keys a caller lacks may be nil when it calls only what does not need them).

-- The children recorded for `parent`, and their entry removed; {} when none.
local function after_take(k, parent)
  local raw = redis.call('HGET', k.children, parent)
  if not raw then return {} end
  redis.call('HDEL', k.children, parent)
  return cjson.decode(raw)
end

-- `c`'s record when it is waiting and names `parent`, else nil.
local function after_waiting(k, c, parent)
  local due = redis.call('ZSCORE', k.waiting, c)
  if not due then return nil end
  local raw = redis.call('HGET', k.tasks, c)
  if not raw then return nil end
  local r = rec_decode(raw)
  for _, p in ipairs(r[P_AFTER] or {}) do
    if p == parent then return r, tonumber(due) end
  end
  return nil
end

-- `parent` finished ok: its children drop it; a child with no parent left pending
-- moves to sched at its own due time (and prio with a priority), waking consumers
-- when it is the earliest task.
local function after_release(k, parent, list)
  for _, c in ipairs(list) do
    local r, due = after_waiting(k, c, parent)
    if r then
      local left = {}
      for _, p in ipairs(r[P_AFTER]) do
        if p ~= parent then left[#left + 1] = p end
      end
      if #left > 0 then
        r[P_AFTER] = left
        redis.call('HSET', k.tasks, c, rec_encode(r))
      else
        r[P_AFTER] = false
        redis.call('HSET', k.tasks, c, rec_encode(r))
        redis.call('ZREM', k.waiting, c)
        redis.call('ZADD', k.sched, due, c)
        if r[P_PRIO] ~= 0 then redis.call('ZADD', k.prio, due, c) end
        if redis.call('ZCOUNT', k.sched, 0, string.format('(%.17g', due)) == 0 then
          redis.call('ZADD', k.wake, due, 'w')
        end
      end
    end
  end
end

-- `parent` went dead (`why`: "went dead" | "was cancelled"): its waiting children
-- go dead, with an error naming it, and theirs in turn (a task.dead event each,
-- when k.events is given). Returns how many went dead.
local function after_kill(k, parent, why, now)
  local todo = {{parent, after_take(k, parent), why}}
  local n, i = 0, 1
  while todo[i] do
    local p, list, how = todo[i][1], todo[i][2], todo[i][3]
    i = i + 1
    for _, c in ipairs(list) do
      local r = after_waiting(k, c, p)
      if r then
        r[P_AFTER] = false
        r[P_ERROR] = 'parent ' .. p .. ' ' .. how
        redis.call('ZREM', k.waiting, c)
        redis.call('ZADD', k.dead, now, c)
        redis.call('HSET', k.tasks, c, rec_encode(r))
        local t = task_type(c)
        if k.stats then redis.call('HINCRBY', k.stats, 'dead|' .. t, 1) end
        if k.events then
          event(k.events, k.evmax, 'task.dead', now, {kind = 'task', type = t,
            id = string.sub(c, #t + 2), result = 'parent', error = r[P_ERROR], attempt = 0})
        end
        n = n + 1
        todo[#todo + 1] = {c, after_take(k, c), 'went dead'}
      end
    end
  end
  return n
end
