-- ack-9: acknowledge finished tasks (batch). Owner-checked by claim token. A task
-- that others wait for (`add --after`) releases them (_after.lua).
--
-- KEYS[1] proc     ZSET member -> lease expiry
-- KEYS[2] tasks    HASH member -> record
-- KEYS[3] history  STREAM execution records
-- KEYS[4] stats    HASH counters "RESULT|TYPE" -> count; the run-duration histogram
--                  (_duration.lua, from the record's duration_ms)
-- KEYS[5] sched    ZSET member -> due (where a released child goes)
-- KEYS[6] wake     ZSET wake-up marker
-- KEYS[7] prio     ZSET tasks of a priority other than 0 (_prio.lua)
-- KEYS[8] waiting  ZSET tasks waiting for parents -> due
-- KEYS[9] children HASH parent member -> JSON array of its waiting children
-- ARGV[1] maxlen   integer, history cap (0 = keep no history)
-- ARGV[2..] groups of 3: member, token, history record (JSON object text, "" for none)
-- Returns one integer per task: 1 acknowledged, 0 refused (token no longer matches).
--@include _now.lua
--@include _record.lua
--@include _bulk.lua
--@include _duration.lua
--@include _after.lua

local n = (#ARGV - 1) / 3
local members = {}
for i = 1, n do members[i] = ARGV[2 + (i - 1) * 3] end
local raws = bulk('HMGET', KEYS[2], members)
local leases = mscore(KEYS[1], members)
local out, counts, done, del, recs, durs = {}, {}, {}, {}, {}, {}
local keep = tonumber(ARGV[1]) > 0
for i = 1, n do
  local b = 2 + (i - 1) * 3
  local m, tok, h = ARGV[b], ARGV[b + 1], ARGV[b + 2]
  local ok = 0
  if raws[i] and leases[i] and not done[m] and rec_decode(raws[i])[P_TOKEN] == tok then
    ok = 1
    done[m] = true
    del[#del + 1] = m
    if h ~= '' and keep then recs[#recs + 1] = h end
    if h ~= '' then durs[#durs + 1] = {string.match(h, '"duration_ms":(%d+)'), '|' .. task_type(m)} end
    local f = 'ok|' .. task_type(m)
    counts[f] = (counts[f] or 0) + 1
  end
  out[i] = ok
end
-- The deletes first: a full Redis (maxmemory, noeviction) refuses a script only at
-- its first write that may grow memory, so an ack still goes through, and frees room.
if #del > 0 then
  bulk('ZREM', KEYS[1], del)
  bulk('HDEL', KEYS[2], del)
  -- one read for tasks nobody waits for
  local kids = bulk('HMGET', KEYS[9], del)
  local k = {tasks = KEYS[2], sched = KEYS[5], wake = KEYS[6], prio = KEYS[7], waiting = KEYS[8],
    children = KEYS[9]}
  for i, raw in ipairs(kids) do
    if raw then
      redis.call('HDEL', KEYS[9], del[i])
      after_release(k, del[i], cjson.decode(raw))
    end
  end
end
for _, h in ipairs(recs) do
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[1], '*', 'j', h)
end
-- (the histogram after the deletes too: HINCRBY may grow memory)
for _, d in ipairs(durs) do duration_observe(KEYS[4], d[1], d[2]) end
for f, c in pairs(counts) do
  redis.call('HINCRBY', KEYS[4], f, c)
end
return out
