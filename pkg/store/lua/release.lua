--[[ release: moves held messages of a sink back to their due times,
earliest first.
--! firing
--! include: due

ARGV[1]   the sink's band index
ARGV[2]   at most this many
returns   how many were moved
]]

local base = bandlow(ARGV[1])
local left = tonumber(ARGV[2])
for p = maxprio(), 0, -1 do
  if left == 0 then break end
  local key = zkey(p)
  local ids = redis.call('ZRANGEBYSCORE', key, base, '(' .. (base + HOLDBAND), 'WITHSCORES', 'LIMIT', 0, left)
  for i = 1, #ids, 2 do
    redis.call('ZADD', key, tonumber(ids[i + 1]) - base, ids[i])
    left = left - 1
  end
end
return tonumber(ARGV[2]) - left
