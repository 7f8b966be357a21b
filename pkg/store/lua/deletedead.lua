--[[ deletedead: deletes a message only if it is dead.
--! keys: pool dead
--! firing
--! include: life

ARGV[1]   message ID
returns   1 if it was dead and is deleted, 0 if it was not dead
]]

local id = ARGV[1]
if redis.call('ZREM', K.dead, id) == 0 then return 0 end
forget(id, redis.call('HGET', K.pool, id), false)
return 1
