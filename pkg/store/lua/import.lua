--[[ import: writes imported messages, each whole or not at all: its stored
bytes, due or dead entry, meta, group entry and what waits for it.
--! keys: pool meta next
--! include: blob due life series tally

ARGV[1]   1: replace a message known under the ID (whatever its state, in
          flight included); 0: leave it alone
ARGV[2]   the most live series the shard may hold under limits.max_series
          (-1: no bound; seriesbound.go)
ARGV[3..] per message 9 values: ID, state ("s" scheduled, "d" dead), score
          (due time or next attempt for scheduled, time of death for dead,
          Unix ms), priority (0-9), encoded message, meta value ('' none),
          the value of next waiting for the version in flight ('' none),
          group ('' none), and the same as ARGV[2] under its ingest's
          max_series (-1: no bound)
returns   one integer per message: 1 imported; 0 the ID is known (parked, in
          flight or dead) and nothing changed; 2 replaced the known one; 3
          replaced the known one in flight, perhaps committed ahead of its
          due instant (the caller answers CommitLead later); 4 (5) a new
          recurring series past limits.max_series (its ingest's
          max_series): nothing written; 6 the ID is known as a message of
          another source (another ingest, or the admin API): nothing
          changed, replace or not (id_taken, as park.lua's IDTAKEN)
]]

local replace = ARGV[1] == '1'
local quota = tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV, 9 do
  local id, score, blob, m, nxt = ARGV[i], ARGV[i + 2], ARGV[i + 4], ARGV[i + 5], ARGV[i + 6]
  local r = 1
  local srcquota = tonumber(ARGV[i + 8])
  local over = ARGV[i + 1] ~= 'd' and (quota >= 0 or srcquota >= 0) and recurs(blob)
    and (replace or redis.call('HEXISTS', K.pool, id) == 0) -- a known one is skipped, not refused
    and overseries(quota, id, true, blobinfo(blob).ingest, srcquota)
  if over then
    r = over == 'max_series' and 4 or 5
  else
    local old = redis.call('HGET', K.pool, id)
    local read, oldinfo = false, nil
    if old then read, oldinfo = pcall(parseblob, old) end -- one that cannot be read belongs to no source: replace repairs it
    if read and oldinfo.ingest ~= blobinfo(blob).ingest then
      r = 6
    elseif old and not replace then
      r = 0
    else
      if old then
        local was = duescore(id)
        unschedule(id)
        undead(id, old)
        forget(id, old, was ~= false)
        r = 2
        if was and leased(was) then r = 3 end
      end
      redis.call('HSET', K.pool, id, blob)
    end
  end
  if r == 1 or r == 2 or r == 3 then
    if ARGV[i + 1] == 'd' then
      deadadd(id, score, blobinfo(blob).ingest)
    else
      put(tonumber(ARGV[i + 3]), id, score)
    end
    if m ~= '' then redis.call('HSET', K.meta, id, m) end
    if nxt ~= '' then redis.call('HSET', K.next, id, nxt) end
    groupadd(ARGV[i + 7], id)
    if ARGV[i + 1] ~= 'd' then
      local info = blobinfo(blob)
      series(id, info)
      live(info.ingest, 1)
    end
  end
  out[#out + 1] = r
end
return out
