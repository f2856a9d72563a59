-- fragment: priorities (`add --priority N`, -1000..1000). A task of priority 0 is
-- only in sched. One of another priority is in sched too while it is scheduled,
-- and in the prio ZSET (member -> when to look at it next: its due time); a claim
-- moves the due ones (at most PROMOTE per call) out of sched into the ready ZSET,
-- scored (1000 - priority) * PBAND + due: one band per priority, highest first,
-- due-time order inside a band (PBAND = 2^42 ms, as _lanes.lua; scores < 2^53).
-- A claim takes, in order: ready bands of priority > 0, the due tasks of sched
-- (priority 0), ready bands of priority < 0; each an O(log N) range read.
-- prio is healed lazily: a claimed task's entry moves to its lease expiry, and a
-- look at a task that is back in sched (a retry, a reaped lease) ready it again;
-- one that is gone, dead or of priority 0 is dropped.
local PBAND = 4398046511104
local PZERO = 1000 * PBAND
local PROMOTE = 1000

-- A ready score -> due (ms), priority.
local function ready_due(score)
  local band = math.floor(score / PBAND)
  return score - band * PBAND, 1000 - band
end

local function ready_score(p, due)
  return string.format('%d', (1000 - p) * PBAND + due)
end
