--[[ census: counts what each source holds in one shard (lib/tally.lua) from
the shard's messages themselves (and its dead ones from their index by
source), and starts the tally with those counts.
Store.Census runs it once on a shard whose tally was never made: messages
parked by a build before the tally existed, or by one beside it that does
not keep it, are counted only by a census. It reads every message of the
shard in one script (a few microseconds each: Redis waits meanwhile).
--! keys: pool dead deadby series tally
--! include: time blob

returns   {live messages, live series} of the shard
]]

local counts, nlive, nseries = {}, 0, 0
local function count(field)
  counts[field] = (counts[field] or 0) + 1
end
local dead = {}
for _, id in ipairs(redis.call('ZRANGE', K.dead, 0, -1)) do dead[id] = true end
local ids = redis.call('HKEYS', K.pool)
for i = 1, #ids, 1000 do
  local chunk = {unpack(ids, i, math.min(i + 999, #ids))}
  local blobs = redis.call('HMGET', K.pool, unpack(chunk))
  for j, id in ipairs(chunk) do
    if blobs[j] and not dead[id] then
      count('p:' .. blobingest(blobs[j]))
      nlive = nlive + 1
    end
  end
end
-- the dead by source: their index's members, "<source>/<time>/<ID>"
for _, m in ipairs(redis.call('ZRANGE', K.deadby, 0, -1)) do
  count('d:' .. string.match(m, '^([^/]*)/'))
end
for _, id in ipairs(redis.call('SMEMBERS', K.series)) do
  local blob = redis.call('HGET', K.pool, id)
  if blob then
    count('s:' .. blobinfo(blob).ingest)
    nseries = nseries + 1
  end
end
redis.call('DEL', K.tally)
local fields = {'census', servertime()}
for f, n in pairs(counts) do
  fields[#fields + 1] = f
  fields[#fields + 1] = n
end
redis.call('HSET', K.tally, unpack(fields))
return {nlive, nseries}
