--[[ bulk: one call for many members or fields. ]]

-- callmany calls a command of one key with the values of list as its
-- further arguments, at most 1000 at a time (unpack's stack bound is 8000).
-- list holds whole groups of an even count (ZADD's score, member pairs).
local function callmany(cmd, key, list)
  for i = 1, #list, 1000 do
    redis.call(cmd, key, unpack(list, i, math.min(i + 999, #list)))
  end
end
-- hmget is HMGET of a hash for many fields, in order; false for a field the
-- hash does not have.
local function hmget(key, fields)
  local out = {}
  for i = 1, #fields, 1000 do
    local part = redis.call('HMGET', key, unpack(fields, i, math.min(i + 999, #fields)))
    for k = 1, #part do out[#out + 1] = part[k] end
  end
  return out
end
