-- heartbeat-2: extend the leases of running tasks (batch). Owner-checked.
--
-- KEYS[1] proc   ZSET member -> lease expiry (ms)
-- KEYS[2] tasks  HASH member -> record
-- ARGV[1] lease  integer ms from the server's now
-- ARGV[2..] pairs: member, token
-- Returns one integer per task: 1 extended, 0 lost (token changed, task reaped or cancelled).
--@include _now.lua
--@include _record.lua
--@include _bulk.lua

local expiry = now_ms() + tonumber(ARGV[1])
local n = (#ARGV - 1) / 2
local members = {}
for i = 1, n do members[i] = ARGV[2 * i] end
local raws = bulk('HMGET', KEYS[2], members)
local leases = mscore(KEYS[1], members)
local out, zadd = {}, {}
for i = 1, n do
  local ok = 0
  if raws[i] and leases[i] and rec_decode(raws[i])[P_TOKEN] == ARGV[2 * i + 1] then
    zadd[#zadd + 1] = expiry
    zadd[#zadd + 1] = members[i]
    ok = 1
  end
  out[i] = ok
end
if #zadd > 0 then
  -- XX: never re-adds a task that left the processing set
  for i = 1, #zadd, 4000 do
    redis.call('ZADD', KEYS[1], 'XX', unpack(zadd, i, math.min(i + 3999, #zadd)))
  end
end
return out
