--[[ time: Redis's clock, the one every instance shares. ]]

-- servertime is Redis's time in Unix ms.
local function servertime()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- servertimeus is servertime in microseconds.
local function servertimeus()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
