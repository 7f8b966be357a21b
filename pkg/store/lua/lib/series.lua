--[[ series: the live recurring series of a shard (limits.max_series,
ingest[].max_series).
--! keys: series
--! include: tally

A member is the ID of a message that recurs and is parked or in flight (not
dead). A series joins when it is parked, leaves when it ends, dies or is
cancelled; its occurrences follow one another under one ID, so a series is
one member however long it runs. Each join and leave is counted for the
message's source (tally.lua).
]]

-- joinseries makes id a live series of source src.
local function joinseries(id, src)
  seriesof(src, redis.call('SADD', K.series, id))
end
-- leaveseries ends the live series id of source src, if it is one.
local function leaveseries(id, src)
  seriesof(src, -redis.call('SREM', K.series, id))
end
-- series says whether a message (its blobinfo) is a live series of the
-- shard from now on: it joins when info.recur, else leaves.
local function series(id, info)
  if info.recur then
    joinseries(id, info.ingest)
  else
    leaveseries(id, info.ingest)
  end
end
-- seriesgone takes ids out of the shard's series, when it has any: srcs[i]
-- is the source of ids[i].
local function seriesgone(ids, srcs)
  if #ids > 0 and redis.call('EXISTS', K.series) == 1 then
    for i = 1, #ids do leaveseries(ids[i], srcs[i]) end
  end
end
-- overseries states limits.max_series and ingest[].max_series, for every
-- script that can make a live series (park, the retry of a dead message):
-- a message of source src that recurs (recur) and would make id a series of
-- the shard, which it is not yet, is refused when the shard holds quota
-- series already, or srcquota of its source (negative: no bound; Go works
-- out each shard's quota from the whole store's count, seriesbound.go). It
-- returns false, or which bound refused it: 'max_series' or 'source'.
local function overseries(quota, id, recur, src, srcquota)
  if not recur or (quota < 0 and srcquota < 0) or redis.call('SISMEMBER', K.series, id) == 1 then return false end
  if quota >= 0 and redis.call('SCARD', K.series) >= quota then return 'max_series' end
  if srcquota >= 0 and select(2, sourcelive(src)) >= srcquota then return 'source' end
  return false
end
