--[[ slots: allots publish slots of one sink, shared by every instance: a
generic cell rate algorithm whose state is the next free slot.
--! keys: rate
--! include: time

ARGV[1]   slots wanted
ARGV[2]   interval between slots in µs (1e6 / max_rate)
returns   {now µs, first slot µs}: slot i (from 0) is first + i*interval
]]

local now = servertimeus()
local n, interval = tonumber(ARGV[1]), tonumber(ARGV[2])
local first = tonumber(redis.call('GET', K.rate) or '0')
if first < now - interval then first = now - interval end
redis.call('SET', K.rate, first + n * interval, 'PX', math.max(1000, math.ceil((first + n * interval - now) / 1000) + 1000))
return {now, first}
