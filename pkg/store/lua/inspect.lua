--[[ inspect: reads everything known about one message.
--! keys: pool meta dead next
--! include: time due

ARGV[1]   message ID
returns   {now, due score or false, dead score or false, meta or false, message or false,
          ends: 1 when a cancel ended its series with this occurrence (ENDS), else 0}
]]

local id = ARGV[1]
local score = duescore(id)
local waiting = redis.call('HGET', K.next, id)
local ends = waiting and string.sub(waiting, 1, #ENDS) == ENDS
return {servertime(), score, redis.call('ZSCORE', K.dead, id),
        redis.call('HGET', K.meta, id), redis.call('HGET', K.pool, id), ends and 1 or 0}
