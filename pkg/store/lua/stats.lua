--[[ stats: counts one shard at Redis's time, read here: the whole count
is one round trip, which matters when it waits behind a drain's scripts.
--! keys: dead series tally pool
--! include: time due blob

ARGV[1..4] upper bounds of the buckets after overdue (1m, 5m, 1h, 24h), in ms
           after now
ARGV[5]    how many hold bands are in use
returns    {parked, due, dead, oldest due or -1, held, then the six buckets:
           overdue, 1m, 5m, 1h, 24h, later, then the live recurring series,
           then now (Unix ms), then the shard's tally (lib/tally.lua) as
           field, value pairs: none when its census was never made}
]]

local SLOTLOOK = 32 -- the slots read for the oldest due of a slot set
local now = servertime()
local out = {0, 0, redis.call('ZCARD', K.dead), -1, 0, 0, 0, 0, 0, 0, 0, redis.call('SCARD', K.series), now}
for _, sp in ipairs(spans(tonumber(ARGV[5]))) do
  local key, base, top = sp.key, sp.off, sp.off + sp.top
  local low = '-inf'
  if sp.held then low = base end
  local n = redis.call('ZCOUNT', key, low, '(' .. top)
  out[1] = out[1] + n
  if sp.held then out[5] = out[5] + n end
  if sp.slot then
    -- Waiting for a max_rate slot: due already, and overdue. Slots are
    -- given about in due order (a priority's first, sinks of several
    -- rates in one set, retries keep their due times): the oldest due of
    -- the first SLOTLOOK slots stands for the set's.
    out[2] = out[2] + n
    out[6] = out[6] + n
    local first = redis.call('ZRANGE', key, 0, SLOTLOOK - 1)
    if #first > 0 then
      for _, blob in ipairs(redis.call('HMGET', K.pool, unpack(first))) do
        local due = blob and blobinfo(blob).due
        if due and due > 0 and (out[4] == -1 or due < out[4]) then out[4] = due end
      end
    end
  else
    local due = redis.call('ZCOUNT', key, low, base + now)
    out[2] = out[2] + due
    out[6] = out[6] + due
    if due > 0 then
      local first = redis.call('ZRANGEBYSCORE', key, low, base + now, 'WITHSCORES', 'LIMIT', 0, 1)
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
for _, v in ipairs(redis.call('HGETALL', K.tally)) do out[#out + 1] = v end
return out
