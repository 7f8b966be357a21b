--[[ inspect: reads everything known about one message.
--! keys: pool meta dead
--! include: time due

ARGV[1]   message ID
returns   {now, due score or false, dead score or false, meta or false, message or false}
]]

local id = ARGV[1]
local score = duescore(id)
return {servertime(), score, redis.call('ZSCORE', K.dead, id),
        redis.call('HGET', K.meta, id), redis.call('HGET', K.pool, id)}
