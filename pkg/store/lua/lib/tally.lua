--[[ tally: what each source (an ingest by name; '' the admin API) holds in a
shard, for the per-ingest bounds (ingest[].max_parked, ingest[].max_series):
the hash Keys.Tally, field "p:<source>" its live messages (parked, in flight
or held: not dead), "s:<source>" its live recurring series, and "census" the
time (Unix ms) the counts were first made from what the shard held
(census.lua); every script that makes or ends a live message or series
counts it here from then on.
--! keys: tally
]]

local function tally(kind, src, n)
  if n ~= 0 then redis.call('HINCRBY', K.tally, kind .. ':' .. src, n) end
end
-- live counts n live messages of source src more (n < 0: fewer).
local function live(src, n) tally('p', src, n) end
-- seriesof counts n live series of source src more.
local function seriesof(src, n) tally('s', src, n) end
-- sourcelive is how many live messages and series source src holds in the
-- shard, as counted.
local function sourcelive(src)
  local v = redis.call('HMGET', K.tally, 'p:' .. src, 's:' .. src)
  return tonumber(v[1] or 0), tonumber(v[2] or 0)
end
