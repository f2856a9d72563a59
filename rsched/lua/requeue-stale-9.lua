-- requeue-stale-9: move tasks whose lease expired back to due (or to dead
-- after their last attempt). The same reaping every consumer does in claim-18
-- (with its run.lost / task.dead events).
--
-- KEYS[1] sched    ZSET
-- KEYS[2] proc     ZSET
-- KEYS[3] dead     ZSET
-- KEYS[4] tasks    HASH
-- KEYS[5] history  STREAM
-- KEYS[6] wake     ZSET
-- KEYS[7] events   STREAM the queue's events (capped)
-- KEYS[8] waiting  ZSET tasks waiting for parents (_after.lua)
-- KEYS[9] children HASH parent member -> JSON array of its waiting children
-- ARGV[1] limit    integer, entries to handle in this call
-- ARGV[2] dry_run  "1" to count without changing anything
-- ARGV[3] maxlen   integer, history cap
-- ARGV[4] queue    queue name (for history records)
-- ARGV[5] defmax   integer, max attempts for tasks added without one
-- ARGV[6] events_max integer, events stream cap (0: no events)
-- Returns {requeued, dead, more 0|1}
--@include _now.lua
--@include _record.lua
--@include _after.lua
--@include _reap.lua

local now = now_ms()
local dry = ARGV[2] == '1'
local rq, rd, more = reap(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], now, tonumber(ARGV[1]), ARGV[3], ARGV[4], dry, tonumber(ARGV[5]), KEYS[7], ARGV[6], KEYS[8], KEYS[9])
if rq > 0 and not dry then redis.call('ZADD', KEYS[6], now, 'w') end
if dry then more = 0 end
return {rq, rd, more}
