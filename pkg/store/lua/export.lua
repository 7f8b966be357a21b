--[[ export: reads a batch of a shard's pool (HSCAN) with everything else
Redis holds of each message, so that each message is read as one consistent
view.
--! keys: pool meta dead next
--! include: blob due

ARGV[1]   the HSCAN cursor
ARGV[2]   HSCAN COUNT
returns   {next cursor, id1, message1, due score1, dead score1, meta1,
          waiting1, id2, ...}; scores, meta and waiting are nil when absent
          (a message is in a due set or dead)
]]

local r = redis.call('HSCAN', K.pool, ARGV[1], 'COUNT', tonumber(ARGV[2]))
local top = maxprio()
local anynext = redis.call('EXISTS', K.next) == 1
local out = {r[1]}
local kv = r[2]
for i = 1, #kv, 2 do
  local id, blob = kv[i], kv[i + 1]
  -- the due set of the message's own priority first, then any
  local score = false
  local info = blobinfo(blob)
  if info.prio <= MAXPRIO then score = scoreat(info.prio, id) end
  if not score then score = duescore(id, top) end
  local dead = false
  if not score then dead = redis.call('ZSCORE', K.dead, id) end
  local nxt = false
  if anynext then nxt = redis.call('HGET', K.next, id) end
  out[#out + 1] = id
  out[#out + 1] = blob
  out[#out + 1] = score
  out[#out + 1] = dead
  out[#out + 1] = redis.call('HGET', K.meta, id)
  out[#out + 1] = nxt
end
return out
