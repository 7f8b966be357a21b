--[[ cancel: forgets a message, whatever its state.
--! keys: pool dead
--! firing
--! include: due life

ARGV[1]   message ID
returns   1 if it was known, 0 if not
]]

local id = ARGV[1]
local blob = redis.call('HGET', K.pool, id)
if not blob then return 0 end
unschedule(id)
redis.call('ZREM', K.dead, id)
forget(id, blob)
return 1
