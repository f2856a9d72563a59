-- cron-trigger-5: ask for one run of a cron now (`rsched trigger`), or, for a
-- cron B that runs `--after` A, for B's run after one ok record of A (once per
-- record of A: the cursor below). The request waits in `triggers` until one
-- live runner claims it (cron-trigger-claim-8); the entry on `twake` wakes the
-- idle runners, which block on it with XREAD.
--
-- KEYS[1] state     HASH cron state (registered_by: the cron is known; shards, broadcast)
-- KEYS[2] paused    STRING present while the cron is paused
-- KEYS[3] runners   ZSET runner id -> registration expiry (ms)
-- KEYS[4] triggers  ZSET request JSON -> when asked (ms)
-- KEYS[5] twake     STREAM wake-up of idle runners (capped at ~100 entries)
-- ARGV[1] request   JSON object text: id, by, cause[, after_token]; set here: `exp` (ms),
--                   and for a sharded or broadcast cron `fire` (now: the records' fire_ms)
--                   and `items` (its shard count) or `runners` (the live runner ids: each
--                   runs it once; cron-trigger-items-8)
-- ARGV[2] ttl       integer ms: a request not claimed by then is dropped by the claim
-- ARGV[3] field     '' (manual) | 'after:A': the state field that keeps B's cursor on A
-- ARGV[4] entry     with a field: the id ('ms-seq') of A's history record
-- Returns {status, now, live runners[, runs]} (runs: with 'ok', the runs asked for of a
-- sharded (its shards) or broadcast (its live runners) cron, else 0); status:
--   'unknown'   no runner ever registered the cron (manual only; nothing written)
--   'paused'    the cron is paused (manual only; nothing written)
--   'no-runner' no live runner (manual only; nothing written)
--   'seen'      (after) that record of A was already turned into a request
--   'ok'        queued
--@include _now.lua
--@include _cron.lua

local now = now_ms()
cron_register(KEYS[3], '', 0, now)
local live = redis.call('ZCARD', KEYS[3])
local field = ARGV[3]
local st = redis.call('HMGET', KEYS[1], 'registered_by', 'shards', 'broadcast')
if field == '' then
  if not st[1] then return {'unknown', now, live} end
  if redis.call('EXISTS', KEYS[2]) == 1 then return {'paused', now, live} end
  if live == 0 then return {'no-runner', now, live} end
else
  -- Stream ids compare as (ms, seq); B's runners all follow A: the first one per record wins.
  local function split(id)
    local ms, seq = string.match(id, '^(%d+)-(%d+)$')
    return tonumber(ms), tonumber(seq)
  end
  local cur = redis.call('HGET', KEYS[1], field)
  if cur then
    local a, b = split(cur)
    local c, d = split(ARGV[4])
    if c < a or (c == a and d <= b) then return {'seen', now, live} end
  end
  redis.call('HSET', KEYS[1], field, ARGV[4])
end
local req = cjson.decode(ARGV[1])
req['exp'] = now + tonumber(ARGV[2])
local shards = tonumber(st[2] or '0') or 0
local total = 0
if shards > 0 then
  req['fire'], req['items'] = now, shards
  total = shards
elseif st[3] == '1' then
  req['fire'] = now
  req['runners'] = redis.call('ZRANGEBYSCORE', KEYS[3], now, '+inf')
  total = #req['runners']
end
redis.call('ZADD', KEYS[4], now, cjson.encode(req))
redis.call('XADD', KEYS[5], 'MAXLEN', '~', 100, '*', 'r', req['id'])
return {'ok', now, live, total}
