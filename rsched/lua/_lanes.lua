-- fragment: parked tasks. A due task that a consumer cannot run (no handler for
-- its type) is parked, not claimed: it stays in the sched ZSET, due, but its
-- score moves to its type's lane, below every real due time:
--   lane i (1..MAX_LANE) holds scores [-i*LANE, -(i-1)*LANE): due - i*LANE
-- so one ZRANGEBYSCORE finds a type's parked tasks, oldest first (O(log N)),
-- and everything that asks "score <= now?" still sees them due. LANE is 2^42 ms
-- (139 years: due times up to 2109); scores stay below 2^53, exact doubles.
-- The lanes HASH maps type -> lane number; its field '#' counts lanes given out.
local LANE = 4398046511104
local MAX_LANE = 2047

-- A sched score -> the task's due time (ms).
local function lane_due(score)
  if score >= 0 then return score end
  return score + math.ceil(-score / LANE) * LANE
end

-- Lane i's score range, as ZRANGEBYSCORE bounds (min inclusive, max exclusive).
local function lane_bounds(i)
  return string.format('%d', -i * LANE), '(' .. string.format('%d', -(i - 1) * LANE)
end
