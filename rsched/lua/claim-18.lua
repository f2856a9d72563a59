-- claim-18: claim up to N due tasks for one consumer, by the server's clock, of
-- the types it can run. Also registers the consumer (and the types it runs) and
-- reaps expired leases (bounded), so a running consumer is its own sweeper; the
-- script is atomic, so two consumers can never reap or claim the same entry.
--
-- KEYS[1] sched      ZSET member -> due (ms); a parked task: due - lane * 2^42 (_lanes.lua)
-- KEYS[2] proc       ZSET member -> lease expiry (ms)
-- KEYS[3] dead       ZSET member -> died at (ms)
-- KEYS[4] tasks      HASH member -> record
-- KEYS[5] wake       ZSET wake-up marker
-- KEYS[6] seq        STRING claim-token counter
-- KEYS[7] paused     STRING present while the queue is paused
-- KEYS[8] consumers  ZSET consumer id -> registration expiry (ms)
-- KEYS[9] history    STREAM execution records
-- KEYS[10] lanes     HASH type -> lane number of its parked tasks; '#' -> lanes given out
-- KEYS[11] handles   HASH consumer id -> JSON array of the type globs it runs
-- KEYS[12] prio      ZSET tasks of a priority other than 0 -> when to look at them (_prio.lua)
-- KEYS[13] ready     ZSET due tasks of a priority other than 0 -> band score (_prio.lua)
-- KEYS[14] rate      ZSET claim token -> when claimed (ms): the rate limit's sliding window;
--                    a type's own window (type_rate_limits): 't' .. token -> its lane * LANE
--                    + when claimed (one ZSET, each type in its own score range, O(log N))
-- KEYS[15] ratelimit STRING the rate limits (expires; see ARGV[12])
-- KEYS[16] events    STREAM the queue's events (capped): run.lost / task.dead of a reap
-- KEYS[17] waiting   ZSET tasks waiting for parents (_after.lua): a reap that sends a
--                    task dead sends those waiting for it dead too
-- KEYS[18] children  HASH parent member -> JSON array of its waiting children
-- ARGV[1] max        integer, tasks to claim at most (0 = only register/reap)
-- ARGV[2] lease      integer ms
-- ARGV[3] consumer   consumer id string
-- ARGV[4] ttl        integer ms the registration lasts
-- ARGV[5] reap       integer, stale leases to reap at most in this call
-- ARGV[6] maxlen     integer, history cap
-- ARGV[7] queue      queue name (for history records)
-- ARGV[8] defmax     integer, max attempts for tasks added without one (record holds 0)
-- ARGV[9] check      optional: "0" lets a call with nothing to do skip the key type checks
--                    (and the sweep of expired registrations); absent or anything else: check
-- ARGV[10] handles   optional: the JSON array stored in KEYS[11] when the consumer
--                    (re)registers or checks; "" or absent: store nothing
-- ARGV[11] park      optional integer: due tasks of other types parked at most per call
-- ARGV[12] rate      optional: the rate limits, lines: first the queue's "N WINDOW_MS TEXT"
--                    (`rate_limit = "N/DUR"`) or "- - -" (none), then one "N WINDOW_MS TYPE
--                    TEXT" per type (`type_rate_limits`); written to KEYS[15] by a call that
--                    finds due tasks (expiring after 2 registration ttls or 2 of its longest
--                    window, the longer); "" or absent: none given (a stored one still applies)
-- ARGV[13] events_max optional integer, events stream cap (absent or 0: no events)
-- ARGV[14..] types   optional: Lua patterns (anchored) of the types this consumer runs;
--                    none = every type (a `*` handler: parked tasks included)
-- Returns {now, next_due|-1, next_lease_expiry|-1, paused 0|1 (2: throttled by the rate
--          limit, next_due its next permit), reaped_requeued, reaped_dead,
--          then 7 entries per claimed task: member, payload, attempt, max_attempts, token, due, last_error}
-- next_due is the earliest due time of a task this consumer may take (its lanes' count
-- as now; a due task of another type that could not be parked does not count).
--
-- Priorities (_prio.lua): a call with due tasks first moves the due tasks of a
-- priority other than 0 into ready; then takes ready's bands of priority > 0, the
-- due tasks of sched, ready's bands of priority < 0 (a consumer of some types
-- reads at most N + park entries of each band range, taking those it runs).
--
-- Per-type rate limits: a call that may claim runs as a consumer of some types would
-- (below), a type with no permit left counting as one it does not run: its due tasks
-- are parked in its lane (once each), so the other types go on; the type's next permit
-- counts as the due time of its parked tasks.
--
-- Cost of an idle call (nothing due, no lease expired, check "0"): TIME, EXISTS, two
-- ZRANGE, one ZADD; with parked tasks in the queue a consumer that runs only some
-- types also reads the lanes (HGETALL) and the head of its own lanes and of the
-- unparked part. The type checks run before the first write of any call that may
-- write more than the registration (a reap, a claim, a park, a wake-up), so a key of
-- another type still stops it with a clear error and nothing written: the idle path
-- reads first, and its only write (the registration) is a single command. (Lua
-- scripts are not rolled back: a WRONGTYPE after a first write would leave that write.)
--
-- Claim cost: a consumer of every type takes the N earliest due (parked first: they
-- are the oldest); one of some types takes from its lanes, then from the unparked
-- due tasks, parking the others it meets on the way (at most ARGV[11] per call; each
-- task is parked once). So a claim reads O(log N + taken + parked) entries, never the
-- backlog of types it does not run.
--@include _now.lua
--@include _record.lua
--@include _after.lua
--@include _reap.lua
--@include _types.lua
--@include _bulk.lua
--@include _lanes.lua
--@include _prio.lua

local TYPES = {KEYS[1], 'zset', KEYS[2], 'zset', KEYS[3], 'zset', KEYS[4], 'hash', KEYS[5], 'zset',
  KEYS[6], 'string', KEYS[8], 'zset', KEYS[9], 'stream', KEYS[10], 'hash', KEYS[11], 'hash',
  KEYS[12], 'zset', KEYS[13], 'zset', KEYS[14], 'zset', KEYS[15], 'string', KEYS[16], 'stream',
  KEYS[17], 'zset', KEYS[18], 'hash'}
local maxc = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local park_limit = tonumber(ARGV[11] or '0') or 0
local pats = {}
for i = 14, #ARGV do pats[#pats + 1] = ARGV[i] end
local filtered = #pats > 0
local now = now_ms()

-- Per-type rate limits (type -> permits left in this call), once known (below).
local tleft = nil

local function runs(t)
  if tleft and tleft[t] and tleft[t] <= 0 then return false end
  if #pats == 0 then return true end
  for i = 1, #pats do
    if string.find(t, pats[i]) then return true end
  end
  return false
end

-- One claim of type t taken in this call: one permit fewer.
local function took(t)
  if tleft and tleft[t] then tleft[t] = tleft[t] - 1 end
end

-- An error reply of a command on a key we did not type-check: name the key, like check_types.
local function failed(res)
  if type(res) == 'table' and res.err then return check_types(TYPES) or res end
  return nil
end

-- Reads first: nothing is written before we know whether there is work.
-- One EXISTS tells both whether the queue is paused and whether ready holds tasks
-- (the idle call costs no more for it); a second only when one of them is there.
local paused = redis.call('EXISTS', KEYS[7], KEYS[13])
local has_ready = paused == 2
if paused == 2 then
  paused = 1
elseif paused == 1 then
  paused = redis.call('EXISTS', KEYS[7])
  has_ready = paused == 0
end
local l = redis.pcall('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local bad = failed(l)
if bad then return bad end
local f = redis.pcall('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
bad = failed(f)
if bad then return bad end

-- A consumer of some types: its own lanes, and the head of the unparked due tasks
-- (read only when something is parked: the head of the set is then in a lane).
local lanes = {}      -- type -> lane number (every lane)
local lane_type = {}  -- lane number -> type
-- A type's lane number (nil: none given out); ``create``: give it one while lanes last.
local function lane_of(t, create)
  local ln = lanes[t] or tonumber(redis.call('HGET', KEYS[10], t) or '')
  if not ln and create and tonumber(redis.call('HGET', KEYS[10], '#') or '0') < MAX_LANE then
    ln = redis.call('HINCRBY', KEYS[10], '#', 1)
    redis.call('HSET', KEYS[10], t, ln)
  end
  if ln then lanes[t] = ln end
  return ln
end
local mine = {}       -- lane numbers of the types this consumer runs
local mine_due = false
local function read_mine()
  mine, mine_due = {}, false
  local h = redis.pcall('HGETALL', KEYS[10])
  local bad_h = failed(h)
  if bad_h then return bad_h end
  for i = 1, #h, 2 do
    if h[i] ~= '#' then
      lanes[h[i]] = tonumber(h[i + 1])
      lane_type[tonumber(h[i + 1])] = h[i]
      if runs(h[i]) then
        local lo, hi = lane_bounds(tonumber(h[i + 1]))
        if #redis.call('ZRANGEBYSCORE', KEYS[1], lo, hi, 'LIMIT', 0, 1) > 0 then
          mine[#mine + 1] = tonumber(h[i + 1])
          mine_due = true
        end
      end
    end
  end
  return nil
end
local reap_now = l[2] ~= nil and tonumber(l[2]) <= now

-- The rate limits, read only by a call that may claim (the idle call does not).
local rate_n, rate_w, next_permit = nil, nil, nil
local trate = nil     -- type -> {n, window}
local rate_keep = 0   -- the longest window
local rl = nil
if (has_ready or reap_now or (f[2] ~= nil and tonumber(f[2]) <= now)) and paused == 0 and maxc > 0 then
  rl = ARGV[12]
  if not rl or rl == '' then rl = redis.pcall('GET', KEYS[15]) end
  if type(rl) ~= 'string' then rl = nil end
end
if rl then
  local first = true
  for line in string.gmatch(rl, '[^\n]+') do
    if first then
      local a, b = string.match(line, '^(%d+) (%d+)')
      rate_n, rate_w = tonumber(a), tonumber(b)
      if rate_w then rate_keep = rate_w end
      first = false
    else
      local a, b, t = string.match(line, '^(%d+) (%d+) (%S+)')
      if a then
        trate = trate or {}
        trate[t] = {tonumber(a), tonumber(b)}
        rate_keep = math.max(rate_keep, tonumber(b))
      end
    end
  end
end
-- A type's claims in its window: its entries in KEYS[14], in its lane's score range.
local function type_window(t)
  local ln = lane_of(t, false)
  if not ln then return nil end
  local base = ln * LANE
  return ln, '(' .. string.format('%d', base + now - trate[t][2]), string.format('%d', base + now)
end
if trate then
  filtered = true
  tleft = {}
  for t, nw in pairs(trate) do
    local ln, lo, hi = type_window(t)
    tleft[t] = nw[1] - (ln and redis.call('ZCOUNT', KEYS[14], lo, hi) or 0)
  end
end

if filtered and f[2] ~= nil and tonumber(f[2]) < 0 then
  bad = read_mine()
  if bad then return bad end
  f = redis.call('ZRANGEBYSCORE', KEYS[1], 0, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
end
local due_now = (f[2] ~= nil and tonumber(f[2]) <= now) or mine_due or has_ready

-- The rate limit: at most N claims in any WINDOW ms (the claims of the last WINDOW ms
-- are in KEYS[14]). With no permit left the call is an idle one (nothing due for it)
-- and answers the next permit, when the oldest claim leaves the window, as next due.
-- (the queue's own entries score below LANE; a type's are above, in its lane's range)
local QTOP = '(' .. string.format('%d', LANE)
if (due_now or reap_now) and paused == 0 and maxc > 0 and rl then
  if (rate_n or trate) and ARGV[12] and ARGV[12] ~= '' then -- a string key (SET replaces any type)
    redis.call('SET', KEYS[15], ARGV[12], 'PX', math.max(2 * tonumber(ARGV[4]), 2 * rate_keep))
  end
  if rate_n then
    local since = '(' .. string.format('%d', now - rate_w)
    local left = rate_n - redis.call('ZCOUNT', KEYS[14], since, QTOP)
    if left <= 0 then
      maxc = 0
      due_now = false
      local oldest = redis.call('ZRANGEBYSCORE', KEYS[14], since, QTOP, 'WITHSCORES', 'LIMIT', 0, 1)
      if oldest[2] then next_permit = tonumber(oldest[2]) + rate_w end
    elseif left < maxc then
      maxc = left
    end
  end
end

-- (a paused queue with due tasks writes nothing for them: no claim, no wake-up)
local checked = ARGV[9] ~= '0' or reap_now or (due_now and paused == 0)
if checked then
  bad = check_types(TYPES)
  if bad then return bad end
end

local added = redis.pcall('ZADD', KEYS[8], now + tonumber(ARGV[4]), ARGV[3])
bad = failed(added)
if bad then return bad end
if ARGV[10] and ARGV[10] ~= '' and (checked or added == 1) then
  redis.call('HSET', KEYS[11], ARGV[3], ARGV[10])
end
if checked then
  local gone = redis.call('ZRANGEBYSCORE', KEYS[8], '-inf', now)
  if #gone > 0 then
    bulk('ZREM', KEYS[8], gone)
    bulk('HDEL', KEYS[11], gone)
  end
end

local rq, rd = 0, 0
if reap_now then
  rq, rd = reap(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[9], now, tonumber(ARGV[5]), ARGV[6], ARGV[7], false, tonumber(ARGV[8]),
    KEYS[16], ARGV[13], KEYS[17], KEYS[18])
end
local out = {now, -1, -1, paused, rq, rd}

-- Due tasks of a priority other than 0: out of sched, into ready (see _prio.lua).
local function promote()
  local ms = redis.call('ZRANGEBYSCORE', KEYS[12], '-inf', now, 'LIMIT', 0, PROMOTE)
  if #ms == 0 then return end
  local raws = bulk('HMGET', KEYS[4], ms)
  local scs = mscore(KEYS[1], ms)
  local drop, unsched, readied, later = {}, {}, {}, {}
  for i, m in ipairs(ms) do
    local p = 0
    if raws[i] then p = rec_decode(raws[i])[P_PRIO] end
    local d = scs[i] and lane_due(tonumber(scs[i]))
    local l = (p ~= 0 and not scs[i]) and redis.call('ZSCORE', KEYS[2], m)
    if p == 0 then
      drop[#drop + 1] = m
    elseif d and d <= now then
      unsched[#unsched + 1] = m
      readied[#readied + 1] = ready_score(p, d)
      readied[#readied + 1] = m
      drop[#drop + 1] = m
    elseif d then
      later[#later + 1] = string.format('%d', d)
      later[#later + 1] = m
    elseif l then -- processing: look again when its lease may end
      later[#later + 1] = string.format('%d', math.max(tonumber(l), now + 1000))
      later[#later + 1] = m
    else -- dead, ready or gone
      drop[#drop + 1] = m
    end
  end
  if #unsched > 0 then
    bulk('ZREM', KEYS[1], unsched)
    bulk('ZADD', KEYS[13], readied)
    has_ready = true
  end
  if #drop > 0 then bulk('ZREM', KEYS[12], drop) end
  if #later > 0 then bulk('ZADD', KEYS[12], later) end
end

-- Ready tasks in [lo, hi] (band scores) appended to `dst` (member, due), up to
-- `want`; a consumer of some types reads `want + park` and takes those it runs.
-- Returns whether it left one it runs (there is more for it).
local function take_ready(dst, lo, hi, want)
  if want <= 0 then return true end
  local n = want
  if filtered then n = want + park_limit end
  local rows = redis.call('ZRANGEBYSCORE', KEYS[13], lo, hi, 'WITHSCORES', 'LIMIT', 0, n)
  local left = false
  for i = 1, #rows, 2 do
    local t = task_type(rows[i])
    if not filtered or runs(t) then
      if #dst / 2 < maxc then
        dst[#dst + 1] = rows[i]
        dst[#dst + 1] = ready_due(tonumber(rows[i + 1]))
        took(t)
      else
        left = true
      end
    end
  end
  return left
end

-- The due entries to take: a flat list of member, score.
local due = {}
local parked, park_full = 0, false
local ready_left = false
local working = paused == 0 and maxc > 0 and (due_now or rq > 0)
if working and rate_n then
  redis.call('ZREMRANGEBYSCORE', KEYS[14], '-inf', now - rate_w)
end
if working and trate then
  for t, nw in pairs(trate) do
    local ln = lane_of(t, false)
    if ln then
      redis.call('ZREMRANGEBYSCORE', KEYS[14], string.format('%d', ln * LANE), '(' .. string.format('%d', ln * LANE + now - nw[2]))
    end
  end
end
if working then
  local ph = redis.call('ZRANGE', KEYS[12], 0, 0, 'WITHSCORES')
  if ph[2] and tonumber(ph[2]) <= now then promote() end
  if has_ready then ready_left = take_ready(due, '-inf', '(' .. string.format('%d', PZERO), maxc) end
end
if working then
  if not filtered then
    if #due / 2 < maxc then
      local rows = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, maxc - #due / 2)
      for i = 1, #rows do due[#due + 1] = rows[i] end
    end
  else
    -- 1. this consumer's lanes: tasks parked by consumers that could not run them
    for _, ln in ipairs(mine) do
      if #due / 2 >= maxc then break end
      local lo, hi = lane_bounds(ln)
      local want = maxc - #due / 2
      local t = lane_type[ln]
      if tleft and tleft[t] then want = math.min(want, tleft[t]) end
      if want > 0 then
        local rows = redis.call('ZRANGEBYSCORE', KEYS[1], lo, hi, 'WITHSCORES', 'LIMIT', 0, want)
        for i = 1, #rows, 2 do
          due[#due + 1] = rows[i]
          due[#due + 1] = rows[i + 1]
          took(t)
        end
      end
    end
    -- 2. the unparked due tasks: take the ones it runs, park the others it meets
    -- (the first read asks for just what is wanted: the common case reads no more)
    local offset, seen, batch = 0, 0, maxc - #due / 2
    while #due / 2 < maxc and seen < maxc + park_limit do
      local rows = redis.call('ZRANGEBYSCORE', KEYS[1], 0, now, 'WITHSCORES', 'LIMIT', offset, batch)
      if #rows == 0 then break end
      for i = 1, #rows, 2 do
        local m, sc = rows[i], rows[i + 1]
        local t = task_type(m)
        seen = seen + 1
        if runs(t) then
          if #due / 2 < maxc then
            due[#due + 1] = m
            due[#due + 1] = sc
            took(t)
          end
          offset = offset + 1
        else
          local ln = lanes[t]
          if not ln and parked < park_limit then ln = lane_of(t, true) end
          if ln and parked < park_limit then
            redis.call('ZADD', KEYS[1], string.format('%d', tonumber(sc) - ln * LANE), m)
            parked = parked + 1
          else
            offset = offset + 1  -- stays where it is: no lane left, or parked enough for now
            if parked >= park_limit then park_full = true end
          end
        end
      end
      batch = maxc - #due / 2 + math.min(math.max(park_limit - parked, 0), 64)
    end
  end
  if has_ready then
    ready_left = take_ready(due, '(' .. string.format('%d', PZERO), '+inf', maxc - #due / 2) or ready_left
  end
end

local count = #due / 2
local claimed = false
if count > 0 then
  claimed = true
  local members = {}
  for i = 1, count do members[i] = due[2 * i - 1] end
  -- Everything that can fail (a counter that is not a number, a record that is not
  -- JSON) comes before the ZREM: an error leaves every task where it was.
  local raws = bulk('HMGET', KEYS[4], members)
  local last = redis.call('INCRBY', KEYS[6], count)
  local first = last - count
  local expiry = now + lease
  local defmax = tonumber(ARGV[8])
  local hset, zadd, relook = {}, {}, {}
  for i = 1, count do
    local m, raw = members[i], raws[i]
    if raw then
      local r = rec_decode(raw)
      r[P_ATTEMPTS] = r[P_ATTEMPTS] + 1
      local tok = string.format('%d', first + i)
      r[P_TOKEN] = tok
      r[P_PROG] = false
      -- due: kept from an earlier claim (a reaped task keeps its first due), else the score
      if not r[P_DUE] then r[P_DUE] = lane_due(tonumber(due[2 * i])) end
      hset[#hset + 1] = m
      hset[#hset + 1] = rec_encode(r)
      zadd[#zadd + 1] = expiry
      zadd[#zadd + 1] = m
      if r[P_PRIO] ~= 0 then
        relook[#relook + 1] = expiry
        relook[#relook + 1] = m
      end
      out[#out + 1] = m
      out[#out + 1] = r[P_PAYLOAD]
      out[#out + 1] = r[P_ATTEMPTS]
      out[#out + 1] = eff_max(r, defmax)
      out[#out + 1] = tok
      out[#out + 1] = r[P_DUE]
      out[#out + 1] = r[P_ERROR]
    end
  end
  bulk('ZREM', KEYS[1], members)
  if has_ready then bulk('ZREM', KEYS[13], members) end
  if #hset > 0 then
    bulk('HSET', KEYS[4], hset)
    bulk('ZADD', KEYS[2], zadd)
  end
  if #relook > 0 then bulk('ZADD', KEYS[12], relook) end
  if rate_n or trate then
    local log = {}
    for j = 7, #out, 7 do
      if rate_n then
        log[#log + 1] = now
        log[#log + 1] = out[j + 4]
      end
      local t = trate and task_type(out[j])
      local ln = t and trate[t] and lane_of(t, true)
      if ln then
        log[#log + 1] = string.format('%d', ln * LANE + now)
        log[#log + 1] = 't' .. out[j + 4]
      end
    end
    if #log > 0 then bulk('ZADD', KEYS[14], log) end
    redis.call('PEXPIRE', KEYS[14], rate_keep)
  end
end
if rate_n and not next_permit then
  local since = '(' .. string.format('%d', now - rate_w)
  if redis.call('ZCOUNT', KEYS[14], since, QTOP) >= rate_n then
    local oldest = redis.call('ZRANGEBYSCORE', KEYS[14], since, QTOP, 'WITHSCORES', 'LIMIT', 0, 1)
    if oldest[2] then next_permit = tonumber(oldest[2]) + rate_w end
  end
end

-- The earliest due and lease: read again only when this call changed them.
local more_mine = false
if not filtered then
  if claimed or rq > 0 then f = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES') end
  if f[2] then out[2] = lane_due(tonumber(f[2])) end
else
  if claimed or rq > 0 or parked > 0 then
    f = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    if f[2] ~= nil and tonumber(f[2]) < 0 then
      bad = read_mine()
      if bad then return bad end
      f = redis.call('ZRANGEBYSCORE', KEYS[1], 0, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    else
      mine_due = false
    end
  end
  more_mine = mine_due
  if more_mine or park_full then
    out[2] = now
  elseif f[2] then
    local head = tonumber(f[2])
    if head <= now and not runs(task_type(f[1])) then
      -- a due task of another type that found no lane: not ours to wait for
      local nxt = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. string.format('%d', now), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
      if nxt[2] then out[2] = tonumber(nxt[2]) end
    else
      out[2] = head
    end
  end
end
if ready_left or (has_ready and not filtered and redis.call('EXISTS', KEYS[13]) == 1) then out[2] = now end
-- A type out of permits with tasks parked in its lane (or left in ready): they are
-- due at its next permit, when its oldest claim leaves its window.
if trate then
  local soonest = nil
  for t, nw in pairs(trate) do
    if tleft[t] <= 0 then
      local ln, lo, hi = type_window(t)
      local waiting = false
      if ln then
        local plo, phi = lane_bounds(ln)
        waiting = #redis.call('ZRANGEBYSCORE', KEYS[1], plo, phi, 'LIMIT', 0, 1) > 0
      end
      if ln and (waiting or has_ready) then
        local oldest = redis.call('ZRANGEBYSCORE', KEYS[14], lo, hi, 'WITHSCORES', 'LIMIT', 0, 1)
        local at = now + 1
        if oldest[2] then at = tonumber(oldest[2]) - ln * LANE + nw[2] end
        if not soonest or at < soonest then soonest = at end
      end
    end
  end
  if soonest and (out[2] == -1 or soonest < out[2]) then
    out[2] = soonest
    out[4] = 2
  end
end
-- Throttled: what is due waits for the next permit (no wake-up, no busy claims).
if next_permit and out[2] ~= -1 and out[2] < next_permit then
  out[2] = next_permit
  out[4] = 2
end
if claimed or reap_now then l = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES') end
if l[2] then out[3] = tonumber(l[2]) end
-- More is due than this consumer took, or it parked tasks another consumer may run:
-- wake another idle consumer.
if paused == 0 and ((out[2] ~= -1 and out[2] <= now) or parked > 0) then
  redis.call('ZADD', KEYS[5], now, 'w')
end
return out
