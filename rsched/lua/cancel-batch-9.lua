-- cancel-batch-9: cancel a page of tasks (`rsched cancel --all`), each as cancel-9
-- does, those in state ARGV[5] only (checked here, by the server's clock).
--
-- KEYS[1] sched, KEYS[2] proc, KEYS[3] dead (ZSETs); KEYS[4] tasks (HASH)
-- KEYS[5] history  STREAM execution records
-- KEYS[6] ready    ZSET due tasks of a priority other than 0 (_prio.lua)
-- KEYS[7] waiting  ZSET tasks waiting for parents (_after.lua)
-- KEYS[8] children HASH parent member -> JSON array of its waiting children
-- KEYS[9] events   STREAM the queue's events: task.dead of the tasks that waited for it
-- ARGV[1] maxlen   integer, history cap
-- ARGV[2] queue    queue name (for the history records)
-- ARGV[3] channel  the queue's cancel channel (Pub/Sub: not a key)
-- ARGV[4] by       who cancelled ("HOST pid N"), for the records' error text
-- ARGV[5] state    'scheduled'|'due'|'processing'|'dead'|'waiting', or '' for any
-- ARGV[6] evmax    integer, events stream cap (0: no events)
-- ARGV[7..] members ("TYPE ID"), at most a few hundred
-- Returns {tasks cancelled, of which were processing}.
--@include _now.lua
--@include _record.lua
--@include _after.lua
--@include _cancel.lua

local now = now_ms()
local want = ARGV[5]
local n, running = 0, 0
for i = 7, #ARGV do
  local m = ARGV[i]
  local state = task_state(KEYS, m, now)
  if state and (want == '' or state == want) then
    cancel_task(KEYS, m, state, now, ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[6])
    n = n + 1
    if state == 'processing' then running = running + 1 end
  end
end
return {n, running}
