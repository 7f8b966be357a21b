--[[ replacemeta: stores new meta values only where the stored value is
still the one read (compare and set), so that an attempt recorded or a
message gone meanwhile is never overwritten or brought back (Reencrypt seals
the reasons again with the active key).
--! keys: meta

ARGV      triples: message ID, the meta value read, the value to store
returns   how many were replaced
]]

local n = 0
for i = 1, #ARGV, 3 do
  if redis.call('HGET', K.meta, ARGV[i]) == ARGV[i + 1] then
    redis.call('HSET', K.meta, ARGV[i], ARGV[i + 2])
    n = n + 1
  end
end
return n
