-- ack-4: acknowledge finished tasks (batch). Owner-checked by claim token.
--
-- KEYS[1] proc     ZSET member -> lease expiry
-- KEYS[2] tasks    HASH member -> record
-- KEYS[3] history  STREAM execution records
-- KEYS[4] stats    HASH counters "RESULT|TYPE" -> count
-- ARGV[1] maxlen   integer, history cap (0 = keep no history)
-- ARGV[2..] groups of 3: member, token, history record (JSON object text, "" for none)
-- Returns one integer per task: 1 acknowledged, 0 refused (token no longer matches).
--@include _now.lua
--@include _record.lua

local out = {}
local counts = {}
for i = 2, #ARGV, 3 do
  local m, tok, h = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local raw = redis.call('HGET', KEYS[2], m)
  local ok = 0
  if raw and redis.call('ZSCORE', KEYS[1], m) then
    local r = rec_decode(raw)
    if r[P_TOKEN] == tok then
      ok = 1
      redis.call('ZREM', KEYS[1], m)
      redis.call('HDEL', KEYS[2], m)
      if h ~= '' and tonumber(ARGV[1]) > 0 then
        redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[1], '*', 'j', h)
      end
      local f = 'ok|' .. task_type(m)
      counts[f] = (counts[f] or 0) + 1
    end
  end
  out[#out + 1] = ok
end
for f, c in pairs(counts) do
  redis.call('HINCRBY', KEYS[4], f, c)
end
return out
