-- expired-fire-4: claim one firing of a keyspace trigger, so that it runs once
-- across every `run expired` subscriber and sweeper of the namespace.
--
-- An armed key (rsched.expired.arm: it has an entry in KEYS[2]) is claimed by
-- removing that entry: atomic, so exactly one caller wins, by the event or by
-- the sweep, whichever comes first. A key that was never armed (set with PX
-- by other code) is claimed with SET NX PX on KEYS[4]: the first subscriber
-- within the claim window wins; the window also makes a second expiry of the
-- same key within it look like a duplicate (see rsched/expired/runner.py).
-- Every firing (re)sets KEYS[4], so a late event after a sweep firing, or
-- after another subscriber's, is recognised as a duplicate.
--
-- KEYS[1] trigger  the expired key (its name is also the member of KEYS[2]/KEYS[3])
-- KEYS[2] armed    ZSET trigger key name -> expiry (ms)
-- KEYS[3] values   HASH trigger key name -> value
-- KEYS[4] claim    STRING claim of this key's latest firing (value: owner id), PX window
-- ARGV[1] mode     "event" (an expired event arrived) | "sweep" (the entry looks overdue)
-- ARGV[2] window   integer ms, lifetime of the claim key
-- ARGV[3] grace    integer ms (sweep): only entries expired at or before now - grace
-- ARGV[4] owner    string, the claimer's id (stored in the claim, for debugging)
-- Returns {status, now, expiry_ms|-1, value|false} where status is
--   "fire"       this caller runs the handler (value: what arm() stored, armed keys only)
--   "dup"        (event) already fired by someone else within the window
--   "stale"      (event) the key is armed again for a later expiry: this event is
--                of an earlier arming, which was fired already (or replaced)
--   "gone"       (sweep) no entry any more: fired already, or disarmed
--   "notdue"     (sweep) the entry was re-armed for later
--   "extended"   (sweep) the key still exists with a TTL: the entry now follows it
--   "persistent" (sweep) the key exists without a TTL: it will never expire; entry dropped
--@include _now.lua
--@include _types.lua

local bad = check_types({KEYS[2], 'zset', KEYS[3], 'hash', KEYS[4], 'string'})
if bad then return bad end
local now = now_ms()
local window = tonumber(ARGV[2])

local function fire(s)
  redis.call('ZREM', KEYS[2], KEYS[1])
  local v = redis.call('HGET', KEYS[3], KEYS[1])
  redis.call('HDEL', KEYS[3], KEYS[1])
  redis.call('SET', KEYS[4], ARGV[4], 'PX', window)
  return {'fire', now, s, v}
end

local s = redis.call('ZSCORE', KEYS[2], KEYS[1])
if ARGV[1] == 'event' then
  if s then
    s = tonumber(s)
    if s > now then return {'stale', now, s, false} end
    return fire(s)
  end
  if redis.call('SET', KEYS[4], ARGV[4], 'NX', 'PX', window) then
    return {'fire', now, -1, false}
  end
  return {'dup', now, -1, false}
end

-- sweep
if not s then return {'gone', now, -1, false} end
s = tonumber(s)
if s > now - tonumber(ARGV[3]) then return {'notdue', now, s, false} end
-- PTTL also makes Redis expire a key that is past its time but not yet
-- deleted (lazy expiry): its event is published now, and finds the claim.
local pttl = redis.call('PTTL', KEYS[1])
if pttl == -2 then
  return fire(s)
elseif pttl == -1 then
  redis.call('ZREM', KEYS[2], KEYS[1])
  redis.call('HDEL', KEYS[3], KEYS[1])
  return {'persistent', now, s, false}
end
local ok, e = pcall(redis.call, 'PEXPIRETIME', KEYS[1])
if not ok or type(e) ~= 'number' or e < 0 then e = now + pttl end
redis.call('ZADD', KEYS[2], e, KEYS[1])
return {'extended', now, e, false}
