--[[ replace: stores new blobs only where the stored blob is still the one
read (compare and set), so that a message cancelled, fired, or cancelled and
parked again meanwhile is never overwritten or brought back (Reencrypt).
--! keys: pool

ARGV      triples: message ID, the blob read, the blob to store
returns   one integer per message: 1 replaced, 0 changed or gone meanwhile
          (left alone)
]]

local out = {}
for i = 1, #ARGV, 3 do
  if redis.call('HGET', K.pool, ARGV[i]) == ARGV[i + 1] then
    redis.call('HSET', K.pool, ARGV[i], ARGV[i + 2])
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
