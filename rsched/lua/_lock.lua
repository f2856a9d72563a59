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
