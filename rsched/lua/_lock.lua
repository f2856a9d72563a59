-- fragment: an owned lock is a HASH with a TTL (PEXPIRE):
--   owner  owner id (random, known only to the holder)
--   host, pid  who holds it;  since  acquisition time (server ms)
--   token  the fencing token of this acquisition (INCR of the fence key)
--   cancel present when another runner asked the holder to stop (replace)
-- lock_try returns the new fencing token, or nil when the lock is held.
local function lock_try(lock, fence, owner, ttl, host, pid, now)
  if redis.call('EXISTS', lock) == 1 then
    return nil
  end
  local tok = redis.call('INCR', fence)
  redis.call('HSET', lock, 'owner', owner, 'host', host, 'pid', pid, 'since', now, 'token', tok)
  redis.call('PEXPIRE', lock, ttl)
  return tok
end

-- {host, pid, token, pttl} of the current holder (empty strings when free).
local function lock_holder(lock)
  local h = redis.call('HMGET', lock, 'host', 'pid', 'token')
  return {h[1] or '', h[2] or '', h[3] or '', redis.call('PTTL', lock)}
end

-- A release wakes one waiter: the lock's wake LIST holds at most one element,
-- which BLPOP hands to the longest-blocked waiter. It stays `keep` ms for a
-- waiter that is between its failed try and its BLPOP (no wake-up is lost),
-- then expires (a stale one only costs the next waiter one extra try).
local function lock_wake(wake, keep)
  redis.call('DEL', wake)
  redis.call('LPUSH', wake, '1')
  redis.call('PEXPIRE', wake, keep)
end
