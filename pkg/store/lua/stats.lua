--[[ stats: counts one shard at Redis's time, read here: the whole count
is one round trip, which matters when it waits behind a drain's scripts.
--! keys: dead series tally
--! include: time due

ARGV[1..4] upper bounds of the buckets after overdue (1m, 5m, 1h, 24h), in ms
           after now
returns    {parked, due, dead, oldest due or -1, held, then the six buckets:
           overdue, 1m, 5m, 1h, 24h, later, then the live recurring series,
           then now (Unix ms), then the shard's tally (lib/tally.lua) as
           field, value pairs: none when its census was never made}
]]

local now = servertime()
local out = {0, 0, redis.call('ZCARD', K.dead), -1, 0, 0, 0, 0, 0, 0, 0, redis.call('SCARD', K.series), now}
for p = 0, maxprio() do
  local key = zkey(p)
  local n = redis.call('ZCARD', key)
  if n > 0 then
    out[1] = out[1] + n
    -- The hold bands this set has messages in: its highest score's.
    local bands = math.max(0, math.floor(tonumber(redis.call('ZRANGE', key, 0, 0, 'REV', 'WITHSCORES')[2]) / HOLDBAND))
    for b = 0, bands do
      local base = 0
      if b > 0 then base = HOLDBAND * b end
      local top = base + HOLDBAND
      if b > 0 then out[5] = out[5] + redis.call('ZCOUNT', key, base, '(' .. top) end
      local due = redis.call('ZCOUNT', key, base, base + now)
      if b == 0 then due = due + redis.call('ZCOUNT', key, '-inf', '(0') end
      out[2] = out[2] + due
      out[6] = out[6] + due
      if due > 0 then
        local first = redis.call('ZRANGEBYSCORE', key, base, base + now, 'WITHSCORES', 'LIMIT', 0, 1)
        local score = tonumber(first[2]) - base
        if out[4] == -1 or score < out[4] then out[4] = score end
      end
      local lo = base + now
      for i = 1, 4 do
        local hi = base + now + tonumber(ARGV[i])
        out[6 + i] = out[6 + i] + redis.call('ZCOUNT', key, '(' .. lo, hi)
        lo = hi
      end
      out[11] = out[11] + redis.call('ZCOUNT', key, '(' .. lo, '(' .. top)
    end
  end
end
for _, v in ipairs(redis.call('HGETALL', K.tally)) do out[#out + 1] = v end
return out
