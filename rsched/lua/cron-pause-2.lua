-- cron-pause-2: pause or resume a cron (the emergency switch), by the server's clock.
--
-- KEYS[1] paused  STRING present while the cron is paused
-- KEYS[2] state   HASH cron state: paused_ms (when the current pause began), and
--                 pause_from_ms / pause_to_ms (the last pause, kept after resume so that
--                 a runner catching up on ticks that fell inside it records them
--                 `skipped` (paused), not `missed`)
-- ARGV[1] mode    'pause' | 'resume'
-- Returns {changed 1|0, now}: pause: 1 when it was not paused already;
-- resume: 1 when it was paused.
--@include _now.lua

local now = now_ms()
if ARGV[1] == 'pause' then
  if redis.call('EXISTS', KEYS[1]) == 1 then
    return {0, now}
  end
  redis.call('SET', KEYS[1], '1')
  redis.call('HSET', KEYS[2], 'paused_ms', now)
  return {1, now}
end
if redis.call('DEL', KEYS[1]) == 0 then
  redis.call('HDEL', KEYS[2], 'paused_ms')
  return {0, now}
end
local since = redis.call('HGET', KEYS[2], 'paused_ms')
if since then
  redis.call('HSET', KEYS[2], 'pause_from_ms', since, 'pause_to_ms', now)
  redis.call('HDEL', KEYS[2], 'paused_ms')
end
return {1, now}
