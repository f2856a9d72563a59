-- cron-shard-8: sharded and broadcast crons: claim this runner's items of a tick.
--
-- KEYS[1] ticks    ZSET member fire_ms -> first claim time (ms)
-- KEYS[2] state    HASH cron state
-- KEYS[3] shards   HASH (one per tick) item -> runner id that claimed it; expires
-- KEYS[4] runners  ZSET runner id -> registration expiry (ms)
-- KEYS[5] paused   STRING present while paused
-- KEYS[6] history  STREAM execution records
-- KEYS[7] fence    STRING fencing counter (one token per item run)
-- KEYS[8] events   STREAM the cron's events (capped): `tick.missed`
-- ARGV[1]  fire        integer ms, the tick
-- ARGV[2]  mode        'own' (my share: items i with i % live == my rank) | 'steal'
--                      (every item nobody claimed) | 'broadcast' (one item per runner)
-- ARGV[3]  runner      string, runner id
-- ARGV[4]  n           integer, shard items per tick
-- ARGV[5]  deadline    integer ms, later than fire + deadline the tick is missed; -1 = none
-- ARGV[6]  keep        integer ms, retention of ticks and shard claims
-- ARGV[7]  maxlen      integer, history cap
-- ARGV[8]  name        string
-- ARGV[9]  host        string
-- ARGV[10] pid         integer
-- ARGV[11] runner_ttl  integer ms
-- ARGV[12] events_max  integer, events stream cap (0: no events)
-- Returns {status, now, item1, token1, item2, token2, ...}; status 'early' | 'missed' |
-- 'paused' | 'ok' (possibly with no items). A tick that fell while the cron was paused
-- (see cron_paused) is 'paused' (recorded `skipped`) even when it is also late.
--@include _now.lua
--@include _record.lua
--@include _cron.lua

local now = now_ms()
local fire, mode, me = ARGV[1], ARGV[2], ARGV[3]
local n = tonumber(ARGV[4])
cron_register(KEYS[4], me, tonumber(ARGV[11]), now)
if tonumber(fire) > now then
  return {'early', now}
end
local first = cron_claim_tick(KEYS[1], KEYS[2], fire, now, tonumber(ARGV[6]))
if cron_paused(KEYS[5], KEYS[2], fire) then
  if first then
    cron_note(KEYS[6], ARGV[7], ARGV[8], fire, now, 'skipped', 'paused', ARGV[9], ARGV[10])
  end
  return {'paused', now}
end
local deadline = tonumber(ARGV[5])
if deadline >= 0 and now - tonumber(fire) > deadline and mode ~= 'steal' then
  if first then
    local late = 'late by ' .. (now - tonumber(fire)) .. ' ms'
    cron_note(KEYS[6], ARGV[7], ARGV[8], fire, now, 'missed', late, ARGV[9], ARGV[10])
    event(KEYS[8], ARGV[12], 'tick.missed', now, {kind = 'cron', name = ARGV[8],
      fire_ms = tonumber(fire), result = 'missed', error = late, host = ARGV[9]})
  end
  return {'missed', now}
end
local items = {}
if mode == 'broadcast' then
  items[1] = me
elseif mode == 'own' then
  local live = redis.call('ZRANGEBYSCORE', KEYS[4], now, '+inf')
  table.sort(live)
  local rank, k = 0, #live
  for i, id in ipairs(live) do
    if id == me then rank = i - 1 end
  end
  for s = 0, n - 1 do
    if s % k == rank then items[#items + 1] = tostring(s) end
  end
else
  for s = 0, n - 1 do items[#items + 1] = tostring(s) end
end
local out = {'ok', now}
for _, item in ipairs(items) do
  if redis.call('HSETNX', KEYS[3], item, me) == 1 then
    out[#out + 1] = item
    out[#out + 1] = redis.call('INCR', KEYS[7])
  end
end
redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[6]))
if #out > 2 then
  redis.call('HSET', KEYS[2], 'last_run_fire', fire, 'last_result', 'running', 'last_host', ARGV[9])
end
return out
