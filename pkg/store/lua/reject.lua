--[[ reject: keeps rejected messages as dead messages.
--! keys: pool meta dead
--! include: time blob meta group life

ARGV[1]   dead messages kept per shard
ARGV[2..] quadruples: message ID, encoded message, reason, priority
returns   one integer per message: 1 kept; 2 kept already (this very
          rejection, redelivered by its broker or sent again after a failed
          call): nothing changed; 0 the ID is taken by another message
]]

local now = servertime()
local out = {}
for i = 2, #ARGV, 4 do
  local id = ARGV[i]
  if redis.call('HSETNX', K.pool, id, ARGV[i + 1]) == 1 then
    deadadd(id, now, blobinfo(ARGV[i + 1]).ingest)
    setmeta(id, 0, now, ARGV[i + 3], ARGV[i + 2])
    groupadd(blobinfo(ARGV[i + 1]).group, id)
    out[#out + 1] = 1
  elseif redis.call('ZSCORE', K.dead, id) and select(4, meta(redis.call('HGET', K.meta, id))) == ARGV[i + 2] then
    out[#out + 1] = 2
  else
    out[#out + 1] = 0
  end
end
trimdead(tonumber(ARGV[1]))
return out
