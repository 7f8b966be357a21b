--[[ purgedead: deletes up to ARGV[1] dead messages of a shard, oldest first.
--! keys: pool dead
--! firing
--! include: life

ARGV[1]   at most this many
returns   how many were deleted
]]

local ids = redis.call('ZRANGE', K.dead, 0, tonumber(ARGV[1]) - 1)
for _, id in ipairs(ids) do forget(id, redis.call('HGET', K.pool, id), false) end
if #ids > 0 then redis.call('ZREM', K.dead, unpack(ids)) end
return #ids
