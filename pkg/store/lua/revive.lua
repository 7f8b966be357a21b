--[[ revive: schedules a dead message again, due now, with its attempt
count reset.
--! firing
--! keys: pool meta dead
--! include: time blob meta due series dead

ARGV[1]   message ID
returns   1 if it was dead and is scheduled now, 0 if it was not dead
]]

local id = ARGV[1]
local blob = redis.call('HGET', K.pool, id)
if not undead(id, blob) then return 0 end
local _, _, p = meta(redis.call('HGET', K.meta, id))
redis.call('HDEL', K.meta, id)
if not blob then return 0 end
put(p, id, servertime())
local info = blobinfo(blob)
series(id, info)
live(info.ingest, 1)
return 1
