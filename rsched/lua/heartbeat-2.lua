-- heartbeat-2: extend the leases of running tasks (batch). Owner-checked.
--
-- KEYS[1] proc   ZSET member -> lease expiry (ms)
-- KEYS[2] tasks  HASH member -> record
-- ARGV[1] lease  integer ms from the server's now
-- ARGV[2..] pairs: member, token
-- Returns one integer per task: 1 extended, 0 lost (token changed, task reaped or cancelled).
--@include _now.lua
--@include _record.lua

local expiry = now_ms() + tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV, 2 do
  local m, tok = ARGV[i], ARGV[i + 1]
  local ok = 0
  local raw = redis.call('HGET', KEYS[2], m)
  if raw and redis.call('ZSCORE', KEYS[1], m) and rec_decode(raw)[P_TOKEN] == tok then
    redis.call('ZADD', KEYS[1], 'XX', expiry, m)
    ok = 1
  end
  out[#out + 1] = ok
end
return out
