-- cron-forget-13: forget a retired cron: delete every key of it but its fencing
-- counter, in one step, unless a runner is live (then nothing is deleted). The
-- counter stays (a few bytes) so that fencing tokens only go up, also for a new
-- cron later started under the same name (guarantee 4). A runner that registers concurrently
-- either comes first (and is seen live here) or after (and registers afresh).
-- The crons registry (another hash slot on a cluster) is the caller's.
--
-- KEYS[1] ticks    ZSET fire_ms -> claim time
-- KEYS[2] state    HASH cron state
-- KEYS[3] runners  ZSET runner id -> registration expiry (ms)
-- KEYS[4] lock     HASH the run lock
-- KEYS[5] wake     ZSET the run lock holder's wake-up marker
-- KEYS[6] fence    STRING fencing counter (kept)
-- KEYS[7] paused   STRING present while paused
-- KEYS[8] history  STREAM execution records
-- KEYS[9] stats    HASH result -> count
-- KEYS[10] triggers ZSET run requests not yet claimed (rsched trigger, --after)
-- KEYS[11] twake   STREAM the requests' wake-up of idle runners
-- KEYS[12] events  STREAM the cron's events
-- KEYS[13] evdone  HASH their delivery outcomes
-- ARGV[1] force    '1': forget even while runners are live | '0'
-- Returns {status, live runners, keys deleted}: status 'live' (refused: nothing
-- deleted) or 'done' (keys deleted may be 0: there was nothing to forget).
--@include _now.lua

local now = now_ms()
local live = redis.call('ZCOUNT', KEYS[3], now, '+inf')
if live > 0 and ARGV[1] ~= '1' then
  return {'live', live, 0}
end
local n = 0
for i = 1, #KEYS do
  if i ~= 6 then n = n + redis.call('DEL', KEYS[i]) end
end
return {'done', live, n}
