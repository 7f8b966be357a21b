--[[ life: forgetting a message, trimming the dead, promoting what waited.
--! keys: pool meta dead next
--! include: blob group identity due series tally
]]

-- forget deletes everything of a message but its dead entry, which the
-- callers handle; waslive says whether it was live (parked, in flight or
-- held) rather than dead, for its source's count (tally.lua).
local function forget(id, blob, waslive)
  redis.call('HDEL', K.pool, id)
  redis.call('HDEL', K.meta, id)
  redis.call('HDEL', K.next, id)
  local info = blobinfo(blob)
  groupdel(info.group, id)
  if info.recur then leaveseries(id, info.ingest) end
  if waslive and blob then live(info.ingest, -1) end
end
local function trimdead(max)
  local n = redis.call('ZCARD', K.dead)
  if n <= max then return end
  local old = redis.call('ZRANGE', K.dead, 0, n - max - 1)
  for _, id in ipairs(old) do forget(id, redis.call('HGET', K.pool, id), false) end
  redis.call('ZREMRANGEBYRANK', K.dead, 0, n - max - 1)
end
-- promote parks what waited in next for the version in flight, which the
-- caller forgot: a replacement, or a follower (FOLLOWS and the blob).
local function promote(id, blob)
  if follows(blob) then blob = string.sub(blob, #FOLLOWS + 1) end
  local info = blobinfo(blob)
  redis.call('HSET', K.pool, id, blob)
  redis.call('ZADD', zkey(info.prio), info.due, id)
  groupadd(info.group, id)
  series(id, info)
  live(info.ingest, 1)
end
