-- cancel-9: remove a task in any state. A processing task's run is recorded
-- `cancelled` in the history, and the consumers of the queue are told (PUBLISH of
-- its claim token) so that the one running it stops its handler.
--
-- KEYS[1] sched, KEYS[2] proc, KEYS[3] dead (ZSETs); KEYS[4] tasks (HASH)
-- KEYS[5] history  STREAM execution records
-- KEYS[6] ready    ZSET due tasks of a priority other than 0 (_prio.lua)
-- KEYS[7] waiting  ZSET tasks waiting for parents (_after.lua)
-- KEYS[8] children HASH parent member -> JSON array of its waiting children
-- KEYS[9] events   STREAM the queue's events: task.dead of the tasks that waited for it
-- ARGV[1] member
-- ARGV[2] maxlen   integer, history cap
-- ARGV[3] queue    queue name (for the history record)
-- ARGV[4] channel  the queue's cancel channel (Pub/Sub: not a key)
-- ARGV[5] by       who cancelled ("HOST pid N"), for the record's error text
-- ARGV[6] evmax    integer, events stream cap (0: no events)
-- Returns the state it was in ("scheduled"|"due"|"processing"|"dead"|"waiting"|"orphan"),
-- or false if absent.
--@include _now.lua
--@include _record.lua
--@include _after.lua
--@include _cancel.lua

local now = now_ms()
return cancel_task(KEYS, ARGV[1], task_state(KEYS, ARGV[1], now), now, ARGV[2], ARGV[3],
  ARGV[4], ARGV[5], ARGV[6])
