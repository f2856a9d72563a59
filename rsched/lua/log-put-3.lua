-- log-put-3: keep a finished run's log (its stdout and stderr tails) beside its
-- history record, trimmed to the history's cap, and end its live stream.
--
-- KEYS[1] logs     HASH run token -> log JSON text (stdout, stderr, truncated)
-- KEYS[2] index    ZSET run token -> server ms the log was written (oldest trimmed first)
-- KEYS[3] live     STREAM the run's live output (rsched logs --follow); gets an
--                  end entry and expires 60 s later, if it exists
-- ARGV[1] token    string, the run's token (fencing token; a task's claim token)
-- ARGV[2] log      JSON object text, stored as is
-- ARGV[3] maxlen   integer, the history cap: logs kept at most (0 = keep none)
-- Returns the number of older logs trimmed, or -1 when nothing was kept (maxlen 0).
--@include _now.lua

local maxlen = tonumber(ARGV[3])
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('XADD', KEYS[3], '*', 'end', '1')
  redis.call('PEXPIRE', KEYS[3], 60000)
end
if maxlen <= 0 then return -1 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], now_ms(), ARGV[1])
local over = redis.call('ZCARD', KEYS[2]) - maxlen
local trimmed = 0
if over > 0 then
  local old = redis.call('ZPOPMIN', KEYS[2], over)
  for i = 1, #old, 2 do
    redis.call('HDEL', KEYS[1], old[i])
    trimmed = trimmed + 1
  end
end
return trimmed
