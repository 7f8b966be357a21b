--[[ series: the live recurring series of a shard (limits.max_series).
--! keys: series

A member is the ID of a message that recurs and is parked or in flight (not
dead). A series joins when it is parked, leaves when it ends, dies or is
cancelled; its occurrences follow one another under one ID, so a series is
one member however long it runs.
]]

-- series says whether a message (its blobinfo) is a live series of the
-- shard from now on: it joins when info.recur, else leaves.
local function series(id, info)
  if info.recur then
    redis.call('SADD', K.series, id)
  else
    redis.call('SREM', K.series, id)
  end
end
-- seriesgone takes ids out of the shard's series, when it has any.
local function seriesgone(ids)
  if #ids > 0 and redis.call('EXISTS', K.series) == 1 then
    for i = 1, #ids, 1000 do
      redis.call('SREM', K.series, unpack(ids, i, math.min(i + 999, #ids)))
    end
  end
end
-- overseries states limits.max_series, for every script that can make a
-- live series (park, the retry of a dead message): a message that recurs
-- (recur) and would make id a series of the shard, which it is not yet, is
-- refused when the shard holds quota series already (0: no bound).
local function overseries(quota, id, recur)
  return quota > 0 and recur and redis.call('SISMEMBER', K.series, id) == 0
    and redis.call('SCARD', K.series) >= quota
end
