--[[ listdead: reads the newest dead messages of a shard.
--! keys: pool meta dead

ARGV[1]   at most this many
returns   {id1, meta1, message1, id2, ...}, newest first
]]

local ids = redis.call('ZREVRANGE', K.dead, 0, tonumber(ARGV[1]) - 1)
local out = {}
for _, id in ipairs(ids) do
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGET', K.meta, id)
  out[#out + 1] = redis.call('HGET', K.pool, id)
end
return out
