--[[ purgedead: deletes up to ARGV[1] dead messages of a shard, oldest first.
--! keys: pool dead
--! firing
--! include: life

ARGV[1]   at most this many
returns   how many were deleted
]]

local ids = redis.call('ZRANGE', K.dead, 0, tonumber(ARGV[1]) - 1)
for _, id in ipairs(ids) do
  local blob = redis.call('HGET', K.pool, id)
  undead(id, blob)
  forget(id, blob, false)
end
return #ids
