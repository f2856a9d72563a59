-- claim-9: claim up to N due tasks for one consumer, by the server's clock.
-- Also registers the consumer and reaps expired leases (bounded), so a
-- running consumer is its own sweeper; the script is atomic, so two
-- consumers can never reap or claim the same entry.
--
-- KEYS[1] sched      ZSET member -> due (ms)
-- KEYS[2] proc       ZSET member -> lease expiry (ms)
-- KEYS[3] dead       ZSET member -> died at (ms)
-- KEYS[4] tasks      HASH member -> record
-- KEYS[5] wake       ZSET wake-up marker
-- KEYS[6] seq        STRING claim-token counter
-- KEYS[7] paused     STRING present while the queue is paused
-- KEYS[8] consumers  ZSET consumer id -> registration expiry (ms)
-- KEYS[9] history    STREAM execution records
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
-- Returns {now, next_due|-1, next_lease_expiry|-1, paused 0|1, reaped_requeued, reaped_dead,
--          then 7 entries per claimed task: member, payload, attempt, max_attempts, token, due, last_error}
--
-- Cost of an idle call (nothing due, no lease expired, check "0"): TIME, EXISTS, two
-- ZRANGE, one ZADD. The type checks run before the first write of any call that may
-- write more than the registration (a reap, a claim, a wake-up), so a key of another
-- type still stops it with a clear error and nothing written: the idle path reads
-- first, and its only write (the registration) is a single command. (Lua scripts are
-- not rolled back: a WRONGTYPE after a first write would leave that write behind.)
--@include _now.lua
--@include _record.lua
--@include _reap.lua
--@include _types.lua
--@include _bulk.lua

local TYPES = {KEYS[1], 'zset', KEYS[2], 'zset', KEYS[3], 'zset', KEYS[4], 'hash', KEYS[5], 'zset',
  KEYS[6], 'string', KEYS[8], 'zset', KEYS[9], 'stream'}
local maxc = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local now = now_ms()

-- An error reply of a command on a key we did not type-check: name the key, like check_types.
local function failed(res)
  if type(res) == 'table' and res.err then return check_types(TYPES) or res end
  return nil
end

-- Reads first: nothing is written before we know whether there is work.
local paused = redis.call('EXISTS', KEYS[7])
local l = redis.pcall('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local bad = failed(l)
if bad then return bad end
local f = redis.pcall('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
bad = failed(f)
if bad then return bad end
local reap_now = l[2] ~= nil and tonumber(l[2]) <= now
local due_now = f[2] ~= nil and tonumber(f[2]) <= now

-- (a paused queue with due tasks writes nothing for them: no claim, no wake-up)
local checked = ARGV[9] ~= '0' or reap_now or (due_now and paused == 0)
if checked then
  bad = check_types(TYPES)
  if bad then return bad end
end

bad = failed(redis.pcall('ZADD', KEYS[8], now + tonumber(ARGV[4]), ARGV[3]))
if bad then return bad end
if checked then redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', now) end

local rq, rd = 0, 0
if reap_now then
  rq, rd = reap(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[9], now, tonumber(ARGV[5]), ARGV[6], ARGV[7], false, tonumber(ARGV[8]))
end
local out = {now, -1, -1, paused, rq, rd}

local claimed = false
if paused == 0 and maxc > 0 and (due_now or rq > 0) then
  local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, maxc)
  local count = #due / 2
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
    local hset, zadd = {}, {}
    for i = 1, count do
      local m, raw = members[i], raws[i]
      if raw then
        local r = rec_decode(raw)
        r[P_ATTEMPTS] = r[P_ATTEMPTS] + 1
        local tok = string.format('%d', first + i)
        r[P_TOKEN] = tok
        -- due: kept from an earlier claim (a reaped task keeps its first due), else the score
        if not r[P_DUE] then r[P_DUE] = tonumber(due[2 * i]) end
        hset[#hset + 1] = m
        hset[#hset + 1] = rec_encode(r)
        zadd[#zadd + 1] = expiry
        zadd[#zadd + 1] = m
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
    if #hset > 0 then
      bulk('HSET', KEYS[4], hset)
      bulk('ZADD', KEYS[2], zadd)
    end
  end
end

-- The earliest due and lease: read again only when this call changed them.
if claimed or rq > 0 then f = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES') end
if f[2] then out[2] = tonumber(f[2]) end
if claimed or reap_now then l = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES') end
if l[2] then out[3] = tonumber(l[2]) end
-- More is due than this consumer took: wake another idle consumer.
if paused == 0 and out[2] ~= -1 and out[2] <= now then
  redis.call('ZADD', KEYS[5], now, 'w')
end
return out
