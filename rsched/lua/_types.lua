-- fragment: refuse to run when a key holds another type of data (the
-- namespace collides with someone else's keys), before anything is written.
local function check_types(pairs_)
  for i = 1, #pairs_, 2 do
    local t = redis.call('TYPE', pairs_[i])['ok']
    if t ~= 'none' and t ~= pairs_[i + 1] then
      return redis.error_reply('WRONGTYPE key ' .. pairs_[i] .. ' holds a ' .. t .. ', not a ' .. pairs_[i + 1])
    end
  end
  return nil
end
