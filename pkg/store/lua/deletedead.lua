--[[ deletedead: deletes a message only if it is dead.
--! keys: pool
--! firing
--! include: life

ARGV[1]   message ID
returns   1 if it was dead and is deleted, 0 if it was not dead
]]

local id = ARGV[1]
local blob = redis.call('HGET', K.pool, id)
if not undead(id, blob) then return 0 end
forget(id, blob, false)
return 1
