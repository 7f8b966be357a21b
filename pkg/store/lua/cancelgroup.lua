--[[ cancelgroup: cancels up to ARGV[2] messages of a group in one shard.
--! keys: pool dead groups
--! firing
--! include: due life

ARGV[1]   the group
ARGV[2]   at most this many
returns   how many were cancelled
]]

local lo, hi = '[' .. ARGV[1] .. '\0', '(' .. ARGV[1] .. '\1'
local members = redis.call('ZRANGEBYLEX', K.groups, lo, hi, 'LIMIT', 0, tonumber(ARGV[2]))
local prefix = #ARGV[1] + 2
for _, m in ipairs(members) do
  local id = string.sub(m, prefix)
  unschedule(id)
  redis.call('ZREM', K.dead, id)
  forget(id, redis.call('HGET', K.pool, id))
  redis.call('ZREM', K.groups, m) -- an index entry without its message goes too
end
return #members
