--[[ reslot: moves the messages of one sink that wait for a max_rate slot
back to their due times, so that each takes a new slot when it is claimed
again: what a changed max_rate needs, since the slots given at the old one
would otherwise stand. Layout 2 only (Store.Reslot skips a shard in
layout 1). Walks the slot sets from the highest priority down, ranks from a
cursor, at most a given number of entries a call.
--! keys: pool slot
--! include: due blob

ARGV[1]   the sink
ARGV[2]   the priority to walk from (MAXPRIO on the first call)
ARGV[3]   the rank to walk from in that priority's slot set (0 first)
ARGV[4]   at most this many entries looked at
returns   {moved, priority, rank}: the cursor of the next call, a priority
          of -1 when the shard is done
]]

local sink = ARGV[1]
local p, rank, budget = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local moved = 0
while p >= 0 and budget > 0 do
  local r = redis.call('ZRANGE', K.slot[p], rank, rank + budget - 1, 'WITHSCORES')
  local looked, here = #r / 2, 0
  for i = 1, #r, 2 do
    local id = r[i]
    local info = blobinfo(redis.call('HGET', K.pool, id))
    if info.sink == sink then
      move(p, id, fmtscore(tonumber(r[i + 1]), SLOT_MARK), string.format('%.0f', info.due))
      here = here + 1
    end
  end
  moved = moved + here
  if looked < budget then
    p, rank = p - 1, 0 -- this priority's set is done
  else
    rank = rank + looked - here -- what was moved left the set
  end
  budget = budget - looked
end
return {moved, p, rank}
