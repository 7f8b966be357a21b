--[[ bands: gives every named sink a hold band index (once: an index never
changes) and returns every sink's state.
--! keys: sinks

ARGV      sink names
returns   the sinks hash's fields and values, flat
]]

for _, name in ipairs(ARGV) do
  if redis.call('HEXISTS', K.sinks, 'index:' .. name) == 0 then
    local n = redis.call('HINCRBY', K.sinks, 'bands', 1) - 1
    redis.call('HSET', K.sinks, 'index:' .. name, n)
  end
end
return redis.call('HGETALL', K.sinks)
