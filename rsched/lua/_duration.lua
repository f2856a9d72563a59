-- fragment: the run-duration histogram (metrics: rsched_run_duration_seconds).
-- One counter per bucket, by its upper bound in ms ('inf' past the last), plus
-- the sum of the durations in ms, in the stats hash the run is counted in:
-- fields PREFIX .. 'dur<' .. LE and PREFIX .. 'dur_ms' (SUFFIX after each, for a
-- task its '|TYPE'). The bounds are rsched.tools.metrics.DURATION_BUCKETS_MS.
local DURATION_BUCKETS_MS = {100, 500, 1000, 5000, 10000, 30000, 60000, 300000, 900000,
  1800000, 3600000, 10800000}
local function duration_observe(stats, ms, suffix)
  ms = tonumber(ms)
  if not ms or ms < 0 then return end
  local le = 'inf'
  for _, b in ipairs(DURATION_BUCKETS_MS) do
    if ms <= b then le = tostring(b) break end
  end
  redis.call('HINCRBY', stats, 'dur<' .. le .. suffix, 1)
  redis.call('HINCRBY', stats, 'dur_ms' .. suffix, math.floor(ms))
end
