-- lock-unlock-1: an operator's release (`rsched unlock`): by fencing token, or forced.
--
-- KEYS[1] lock   HASH owner record
-- ARGV[1] token  string, the fencing token shown by `rsched locks` ("" with --force)
-- Returns the released lock's fencing token.
-- Errors: RSCHED_NOTFOUND when no lock is held, RSCHED_CONFLICT when the token differs.

local tok = redis.call('HGET', KEYS[1], 'token')
if not tok then
  return redis.error_reply('RSCHED_NOTFOUND no lock is held under this name')
end
if ARGV[1] ~= '' and ARGV[1] ~= tok then
  return redis.error_reply('RSCHED_CONFLICT the lock is held with fencing token ' .. tok .. ', not ' .. ARGV[1])
end
redis.call('DEL', KEYS[1])
return tok
