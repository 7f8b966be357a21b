--[[ stats: counts one shard.
--! keys: dead series
--! include: due

ARGV[1]    now (Unix ms, Redis time, the same for every shard)
ARGV[2..5] upper bounds of the buckets after overdue (1m, 5m, 1h, 24h)
ARGV[6]    how many hold bands are in use
returns    {parked, due, dead, oldest due or -1, held, then the six buckets:
           overdue, 1m, 5m, 1h, 24h, later, then the live recurring series}
]]

local now = tonumber(ARGV[1])
local out = {0, 0, redis.call('ZCARD', K.dead), -1, 0, 0, 0, 0, 0, 0, 0, redis.call('SCARD', K.series)}
local bands = tonumber(ARGV[6])
for p = 0, maxprio() do
  local key = zkey(p)
  local n = redis.call('ZCARD', key)
  if n > 0 then
    out[1] = out[1] + n
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
      for i = 2, 5 do
        local hi = base + tonumber(ARGV[i])
        out[5 + i] = out[5 + i] + redis.call('ZCOUNT', key, '(' .. lo, hi)
        lo = hi
      end
      out[11] = out[11] + redis.call('ZCOUNT', key, '(' .. lo, '(' .. top)
    end
  end
end
return out
