-- fragment: a task record is the JSON array
--   [payload(string), attempts, max_attempts, token(string), last_error(string), due_ms, created_ms]
-- payload is the task's JSON text kept verbatim as a string.
local P_PAYLOAD, P_ATTEMPTS, P_MAX, P_TOKEN, P_ERROR, P_DUE, P_CREATED = 1, 2, 3, 4, 5, 6, 7

-- max_attempts 0 in a record means "not set when added": the consumer's default applies.
local function eff_max(r, defmax)
  local m = tonumber(r[P_MAX])
  if m == 0 then return defmax end
  return m
end

local function task_type(m)
  return string.match(m, '^(%S+)')
end

-- Append one execution record (a JSON object in field "j") to a capped stream.
local function history(key, maxlen, rec)
  if tonumber(maxlen) > 0 then
    redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*', 'j', cjson.encode(rec))
  end
end
