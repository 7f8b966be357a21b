--[[ import: writes imported messages, each whole or not at all: its stored
bytes, due or dead entry, meta, group entry and what waits for it.
--! keys: pool meta next
--! include: blob due life series tally

ARGV[1]   1: replace a message known under the ID (whatever its state, in
          flight included); 0: leave it alone
ARGV[2..] per message 8 values: ID, state ("s" scheduled, "d" dead), score
          (due time or next attempt for scheduled, time of death for dead,
          Unix ms), priority (0-9), encoded message, meta value ('' none),
          the value of next waiting for the version in flight ('' none),
          group ('' none)
returns   one integer per message: 1 imported; 0 the ID is known (parked, in
          flight or dead) and nothing changed; 2 replaced the known one; 3
          replaced the known one in flight, perhaps committed ahead of its
          due instant (the caller answers CommitLead later)
]]

local replace = ARGV[1] == '1'
local out = {}
for i = 2, #ARGV, 8 do
  local id, score, blob, m, nxt = ARGV[i], ARGV[i + 2], ARGV[i + 4], ARGV[i + 5], ARGV[i + 6]
  local r = 1
  if not replace then
    if redis.call('HSETNX', K.pool, id, blob) == 0 then r = 0 end
  else
    local old = redis.call('HGET', K.pool, id)
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
  if r ~= 0 then
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
