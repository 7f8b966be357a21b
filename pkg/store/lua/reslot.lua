--[[ reslot: moves the messages of one sink that wait for a max_rate slot
back to their due times, so that each takes a new slot when it is claimed
again: what a changed max_rate needs, since the slots given at the old one
would otherwise stand. Layout 2 only (Store.Reslot leaves a store with a
shard in layout 1 alone). Walks the slot sets from the highest priority
down, in (slot, ID) order from a cursor, so that what claims take out of
a set or put in before the cursor between two calls moves nothing; at
most a given number of entries a call.
--! keys: pool slot
--! include: due blob order

ARGV[1]   the sink
ARGV[2]   the priority to walk (MAXPRIO on the first call)
ARGV[3], ARGV[4]   the cursor: the slot (Unix ms) and ID of the last entry
          looked at in that priority's set; "" and "" from its start
ARGV[5]   at most this many entries looked at
returns   {moved, priority, slot, ID}: the cursor of the next call, a
          priority of -1 when the shard is done
]]

local sink = ARGV[1]
local p, cs, cid, budget = tonumber(ARGV[2]), ARGV[3], ARGV[4], tonumber(ARGV[5])
local moved = 0
while p >= 0 and budget > 0 do
  local key = K.slot[p]
  local rank = 0
  if cs ~= '' then rank = after(key, tonumber(cs), cid) end
  local r = redis.call('ZRANGE', key, rank, rank + budget - 1, 'WITHSCORES')
  for i = 1, #r, 2 do
    local id = r[i]
    local info = blobinfo(redis.call('HGET', K.pool, id))
    if info.sink == sink then
      move(p, id, fmtscore(tonumber(r[i + 1]), SLOT_MARK), string.format('%.0f', info.due))
      moved = moved + 1
    end
    cs, cid = r[i + 1], id
  end
  local looked = #r / 2
  if looked < budget then
    p, cs, cid = p - 1, '', '' -- this priority's set is done
  end
  budget = budget - looked
end
return {moved, p, cs, cid}
