-- fragment: a task record is a JSON array with its trailing defaults left out:
--   [payload(string), attempts=0, max_attempts=0, token="", last_error="", due_ms,
--    0 (created_ms of earlier versions: ignored), priority=0, progress=false, after=false]
-- progress: [fraction, message, at_ms], the running attempt's last report (progress-2;
-- a claim clears it, a failed attempt's stays until the next claim).
-- after: ["TYPE ID", ...], the parents a waiting task still waits for (_after.lua);
-- a waiting task keeps its own due time in due_ms.
-- payload is the task's JSON text kept verbatim as a string. A task that was
-- never claimed is just [payload] (or [payload,0,max]): its due time is its
-- score in the sched set; a claim writes due_ms into the record.
local P_PAYLOAD, P_ATTEMPTS, P_MAX, P_TOKEN, P_ERROR, P_DUE, P_PRIO, P_PROG, P_AFTER = 1, 2, 3, 4, 5, 6, 8, 9, 10
local REC_DEFAULTS = {'null', 0, 0, '', '', false, 0, 0, false, false}

-- record text -> a table with every position filled (due_ms false when absent).
local function rec_decode(raw)
  local r = cjson.decode(raw)
  for i = 1, 10 do
    if r[i] == nil or r[i] == cjson.null then r[i] = REC_DEFAULTS[i] end
  end
  r[7] = 0
  r[P_PRIO] = tonumber(r[P_PRIO])
  r[P_ATTEMPTS] = tonumber(r[P_ATTEMPTS])
  r[P_MAX] = tonumber(r[P_MAX])
  if r[P_DUE] then r[P_DUE] = tonumber(r[P_DUE]) end
  return r
end

-- table -> record text, trailing defaults dropped.
local function rec_encode(r)
  local n = 10
  while n > 1 and (r[n] == REC_DEFAULTS[n] or r[n] == nil) do n = n - 1 end
  local out = {}
  for i = 1, n do
    local v = r[i]
    if v == nil or v == false then v = REC_DEFAULTS[i] end
    out[i] = v
  end
  return cjson.encode(out)
end

-- max_attempts 0 in a record means "not set when added": the consumer's default applies.
local function eff_max(r, defmax)
  local m = r[P_MAX]
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

-- Append one event (SPEC §4 "Events and alerts") to a source's capped events
-- stream, in the same script (so the same atomic step) as its cause. The entry
-- is compact JSON in field "j": the event's name, the server's now (at_ms) and
-- the fields of `rec` an event carries; rsched/tools/events.py renders the full
-- object (event_id, at, fire_at, nulls). maxlen 0: events are off.
local EVENT_FIELDS = {'kind', 'name', 'queue', 'type', 'id', 'fire_ms', 'result', 'exit_code',
  'error', 'host', 'attempt', 'token'}
local function event(key, maxlen, name, now, rec)
  if tonumber(maxlen) <= 0 then return end
  local ev = {event = name, at_ms = now}
  for _, f in ipairs(EVENT_FIELDS) do
    if rec[f] ~= nil and rec[f] ~= cjson.null then ev[f] = rec[f] end
  end
  redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*', 'j', cjson.encode(ev))
end

-- The event a run's result makes ('failed'/'timeout' -> run.failed, 'lost' ->
-- run.lost), or nil.
local function run_event(result)
  if result == 'failed' or result == 'timeout' then return 'run.failed' end
  if result == 'lost' then return 'run.lost' end
  return nil
end
