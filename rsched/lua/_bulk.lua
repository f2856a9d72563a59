-- fragment: commands over many members, in slices that Lua's unpack can take.
-- bulk(cmd, key, list): run `cmd key <slice of list>` for each slice; array replies
-- are concatenated (HMGET), others dropped. Keep `list` pairs whole: 4000 is even.
local function bulk(cmd, key, list)
  local res = {}
  for i = 1, #list, 4000 do
    local part = redis.call(cmd, key, unpack(list, i, math.min(i + 3999, #list)))
    if type(part) == 'table' then
      for j = 1, #part do res[#res + 1] = part[j] end
    end
  end
  return res
end

-- The scores of `members` in ZSET `key` (false when absent): ZMSCORE where the
-- server has it (6.2+), else one ZSCORE each.
local function mscore(key, members)
  local res = {}
  for i = 1, #members, 4000 do
    local last = math.min(i + 3999, #members)
    local part = redis.pcall('ZMSCORE', key, unpack(members, i, last))
    if type(part) == 'table' and part.err then -- no ZMSCORE (or a wrong type: ZSCORE raises it)
      for j = i, last do res[j] = redis.call('ZSCORE', key, members[j]) end
    else
      for j = 1, #part do res[i + j - 1] = part[j] end
    end
  end
  return res
end
