--[[ migratedown: converts a shard from layout 2 back to layout 1
(Store.MigrateDown): each message in a key of its state (lib/due2.lua)
goes back into the due set of its priority at its score on the wire
(lib/wire.lua), and the shard's marker becomes "1": a daemon of this
build that still takes the shard for layout 2 is refused there, even when
the shard is empty, instead of marking it "2" again. A shard with no
marker (no script of either layout has written it since the store began,
or only the previous release has) gets "1" too, for the same reason; one
marked "1" is left alone. One call per shard, as migrateup.lua.
--! keys: due inflight ahead slot holding layout next unconfirmed
--! include: bulk wire heldkey

returns   how many messages moved into the due sets
]]

-- A cancel's mark on a series in flight (ENDS, lib/life.lua endseries) is
-- this build's alone: the previous release would take it for a message
-- waiting. It goes, and a message that waited behind it stays; the series
-- then goes on (the cancel is lost) unless its occurrence settled first.
local waiting = redis.call('HGETALL', K.next)
for i = 1, #waiting, 2 do
  local v = waiting[i + 1]
  if string.sub(v, 1, #ENDS) == ENDS then
    if #v == #ENDS then
      redis.call('HDEL', K.next, waiting[i])
    else
      redis.call('HSET', K.next, waiting[i], string.sub(v, #ENDS + 1))
    end
  end
end

-- The marks of messages sent without a confirmation (lib/unconfirmed.lua)
-- are this build's alone too: the previous release neither reads them nor
-- removes them with their messages.
redis.call('DEL', K.unconfirmed)

local mark = redis.call('GET', K.layout)
if mark == '1' then return 0 end
if mark and mark ~= '2' then return redis.error_reply('LAYOUT the shard is in layout ' .. mark .. ', which this build does not know') end
if not mark then
  redis.call('SET', K.layout, '1')
  return 0
end
local moved = 0
local marks = {inflight = LEASE_MARK, ahead = AHEAD_MARK, slot = SLOT_MARK}
for p = 0, MAXPRIO do
  for st, mark in pairs(marks) do
    local key = K[st][p]
    local r = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
    local adds = {}
    for i = 1, #r, 2 do
      adds[#adds + 1] = fmtscore(tonumber(r[i + 1]), mark)
      adds[#adds + 1] = r[i]
    end
    callmany('ZADD', K.due[p], adds)
    redis.call('DEL', key)
    moved = moved + #r / 2
  end
end
local holding = redis.call('HGETALL', K.holding)
local sets = {}
for i = 1, #holding, 2 do
  local id = holding[i]
  local k, p = string.match(holding[i + 1], '^(%d+):(%d+)$')
  local key = heldkey(k, p)
  local due = redis.call('ZSCORE', key, id)
  if due then
    redis.call('ZADD', K.due[tonumber(p)], fmtscore(bandlow(k) + tonumber(due), 0), id)
    moved = moved + 1
  end
  sets[key] = true
end
for key in pairs(sets) do redis.call('DEL', key) end
redis.call('DEL', K.holding)
redis.call('SET', K.layout, '1')
return moved
