-- fragment: the server's clock in integer milliseconds (the one clock).
if redis.replicate_commands then pcall(redis.replicate_commands) end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
