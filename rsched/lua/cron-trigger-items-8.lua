-- cron-trigger-items-8: a runner of a sharded or broadcast cron claims its items of
-- one run asked for (cron-trigger-5 wrote `fire`, the server's now when asked, and
-- `items` (shards) or `runners` (broadcast: the runner ids live when asked) into the
-- request). Like a tick (cron-shard-8): each item is claimed once, across all runners
-- (HSETNX), with a fencing token each; a sharded cron's items go by rank among the live
-- runners ('own'), and shortly after, every runner takes the items nobody claimed
-- ('steal': a runner died). The request stays queued until every item is claimed.
--
-- KEYS[1] triggers  ZSET request JSON -> when asked (ms)
-- KEYS[2] reply     LIST answers to the asker (one JSON object per claiming runner)
-- KEYS[3] items     HASH item -> runner id, the claims of this request (expires)
-- KEYS[4] runners   ZSET runner id -> registration expiry (ms)
-- KEYS[5] paused    STRING present while paused
-- KEYS[6] history   STREAM execution records (capped)
-- KEYS[7] fence     STRING fencing counter
-- KEYS[8] state     HASH cron state (last_run_fire, last_result, last_host)
-- ARGV[1] request   the request's member text, as read from `triggers`
-- ARGV[2] mode      'own' | 'steal'
-- ARGV[3] runner    string, runner id
-- ARGV[4] maxlen    integer, history cap
-- ARGV[5] name      string, the cron's name
-- ARGV[6] host      string
-- ARGV[7] pid       integer
-- ARGV[8] keep      integer ms, lifetime of the claims hash and the answers
-- Returns {status, now, fire, item1, token1, ...}; status:
--   'gone'     not queued (any more): every item was claimed, or it was withdrawn
--   'expired'  not all claimed in time: dropped (the asker reports the others)
--   'paused'   the cron is paused: dropped and recorded `skipped` once
--   'ok'       the items this runner claimed now (possibly none)
--@include _now.lua
--@include _record.lua
--@include _cron.lua

local now = now_ms()
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return {'gone', now, 0}
end
local req = cjson.decode(ARGV[1])
local fire = tonumber(req['fire'] or now)
local me, host, pid = ARGV[3], ARGV[6], ARGV[7]
local keep = tonumber(ARGV[8])
local extra = {cause = req['cause'], triggered_by = req['by'], trigger = req['id'],
  after_token = req['after_token']}
local function answer(t)
  redis.call('LPUSH', KEYS[2], cjson.encode(t))
  redis.call('PEXPIRE', KEYS[2], keep)
end
if tonumber(req['exp'] or now) < now then
  redis.call('ZREM', KEYS[1], ARGV[1])
  if req['after_token'] then
    cron_note(KEYS[6], ARGV[4], ARGV[5], fire, now, 'missed',
      'not every item was claimed within its bound', host, pid, extra)
  end
  return {'expired', now, fire}
end
if redis.call('EXISTS', KEYS[5]) == 1 then
  redis.call('ZREM', KEYS[1], ARGV[1])
  cron_note(KEYS[6], ARGV[4], ARGV[5], fire, now, 'skipped', 'paused', host, pid, extra)
  answer({status = 'paused', host = host})
  return {'paused', now, fire}
end
local want, total = {}, 0
if req['runners'] then
  total = #req['runners']
  for _, id in ipairs(req['runners']) do
    if id == me then want[1] = me end
  end
else
  total = tonumber(req['items'])
  if ARGV[2] == 'own' then
    local live = redis.call('ZRANGEBYSCORE', KEYS[4], now, '+inf')
    table.sort(live)
    local rank, k = 0, #live
    for i, id in ipairs(live) do
      if id == me then rank = i - 1 end
    end
    for s = 0, total - 1 do
      if k > 0 and s % k == rank then want[#want + 1] = tostring(s) end
    end
  else
    for s = 0, total - 1 do want[#want + 1] = tostring(s) end
  end
end
local out, got = {'ok', now, fire}, {}
for _, item in ipairs(want) do
  if redis.call('HSETNX', KEYS[3], item, me) == 1 then
    local tok = redis.call('INCR', KEYS[7])
    out[#out + 1] = item
    out[#out + 1] = tok
    got[#got + 1] = {item = item, token = tok}
  end
end
redis.call('PEXPIRE', KEYS[3], keep)
if redis.call('HLEN', KEYS[3]) >= total then
  redis.call('ZREM', KEYS[1], ARGV[1])
end
if #got > 0 then
  redis.call('HSET', KEYS[8], 'last_run_fire', fire, 'last_result', 'running', 'last_host', host)
  answer({status = 'run', host = host, runner = me, runs = got, total = total, fire_ms = fire})
end
return out
