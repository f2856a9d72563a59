-- lock-unlock-2: an operator's release (`rsched unlock`): by fencing token, or forced.
--
-- KEYS[1] lock   HASH owner record
-- KEYS[2] wake   LIST the lock's waiters BLPOP on (a plain lock's); for a cron's
--                run lock, which has none, the lock key again (ARGV[3] = 0)
-- ARGV[1] token  string, the fencing token shown by `rsched locks` ("" with --force)
-- ARGV[2] keep   integer ms, how long an unclaimed wake-up stays
-- ARGV[3] wake   '1': wake one waiter of KEYS[2]
-- Returns the released lock's fencing token.
-- Errors: RSCHED_NOTFOUND when no lock is held, RSCHED_CONFLICT when the token differs.
--@include _lock.lua

local tok = redis.call('HGET', KEYS[1], 'token')
if not tok then
  return redis.error_reply('RSCHED_NOTFOUND no lock is held under this name')
end
if ARGV[1] ~= '' and ARGV[1] ~= tok then
  return redis.error_reply('RSCHED_CONFLICT the lock is held with fencing token ' .. tok .. ', not ' .. ARGV[1])
end
redis.call('DEL', KEYS[1])
if ARGV[3] == '1' then
  lock_wake(KEYS[2], tonumber(ARGV[2]))
end
return tok
