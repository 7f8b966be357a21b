--[[ replace: stores new blobs only where the stored blob is still the one
read (compare and set), so that a message cancelled, fired, or cancelled and
parked again meanwhile is never overwritten or brought back (Reencrypt).
The group index follows the new blob's group field (sealed with another
key, or sealed for the first time, a group is indexed by another token),
and so does the mark of a publish sent unconfirmed (lib/unconfirmed.lua):
it is the same message.
--! keys: pool
--! include: blob group unconfirmed

ARGV      triples: message ID, the blob read, the blob to store
returns   one integer per message: 1 replaced, 0 changed or gone meanwhile
          (left alone)
]]

local out = {}
for i = 1, #ARGV, 3 do
  local id, old, new = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if redis.call('HGET', K.pool, id) == old then
    local from, to = blobinfo(old).group, blobinfo(new).group
    if from ~= to then
      groupdel(from, id)
      groupadd(to, id)
    end
    carrymark(id, old, new)
    redis.call('HSET', K.pool, id, new)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
