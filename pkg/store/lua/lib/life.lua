--[[ life: forgetting a message, trimming the dead, promoting what waited.
--! keys: pool meta dead next tally deadby unconfirmed
--! include: blob group identity due series tally dead
]]

-- forget deletes everything of a message but its dead entry, which the
-- callers handle; waslive says whether it was live (parked, in flight or
-- held) rather than dead, for its source's count (tally.lua).
local function forget(id, blob, waslive)
  redis.call('HDEL', K.pool, id)
  redis.call('HDEL', K.meta, id)
  redis.call('HDEL', K.next, id)
  redis.call('HDEL', K.unconfirmed, id)
  local info = blobinfo(blob)
  groupdel(info.group, id)
  if info.recur then leaveseries(id, info.ingest) end
  if waslive and blob then live(info.ingest, -1) end
end
-- remember keeps what a re-read of a message read from a log is told by
-- (reread, lib/identity.lua): its position, under its field (SeenField in
-- keys.go builds the same text), in the dedupe window's bucket seen, which
-- expires whole at seenat (Unix ms; 0: the window is off; acklease writes
-- a delivered message's so). A cancelled message leaves it, so that its
-- ingest reading it again (a delivery a paused instance held, redelivered
-- once its ack wait ran out) does not park it again. A message without a
-- log has its mark from its park (park.lua) until its ack is confirmed.
local function remember(seen, seenat, id, blob)
  if seenat <= 0 or not blob then return end
  local info = blobinfo(blob)
  if info.log == '' then return end
  redis.call('HSET', seen, #info.log .. ':' .. info.log .. ':' .. id, string.format('%d', info.pos))
  redis.call('PEXPIREAT', seen, seenat)
end
-- trimdead deletes the dead messages of the shard beyond max: first those
-- a build before the index by source left (oldest first, while the oldest
-- is one), then the oldest of the source that holds the most (lib/dead.lua),
-- so that one source's dead messages push out another's only while that
-- one holds more.
local function trimdead(max)
  local excess = redis.call('ZCARD', K.dead) - max
  if excess <= 0 then return end
  local counts = {}
  local t = redis.call('HGETALL', K.tally)
  for i = 1, #t, 2 do
    local src = string.match(t[i], '^d:(.*)$')
    if src then counts[src] = tonumber(t[i + 1]) end
  end
  while excess > 0 do
    local oldest = redis.call('ZRANGE', K.dead, 0, 0, 'WITHSCORES')
    if #oldest == 0 then return end
    local id, blob = oldest[1], redis.call('HGET', K.pool, oldest[1])
    if not blob or not redis.call('ZSCORE', K.deadby, deadmember(blobingest(blob), oldest[2], id)) then
      redis.call('ZREM', K.dead, id) -- not indexed: a build before the index's
      forget(id, blob, false)
      excess = excess - 1
    else
      local victim, most = nil, 0
      for src, n in pairs(counts) do
        if n > most then victim, most = src, n end
      end
      local first = victim and redis.call('ZRANGEBYLEX', K.deadby, '[' .. victim .. '/', '(' .. victim .. '0', 'LIMIT', 0, 1)[1]
      if not first then
        -- the counts are off (a build before the index deleted some): the
        -- oldest of the shard, which is indexed, goes instead
        undead(id, blob)
        forget(id, blob, false)
        excess = excess - 1
        if victim then counts[victim] = 0; redis.call('HSET', K.tally, 'd:' .. victim, 0) end
      else
        counts[victim] = most - 1
        redis.call('ZREM', K.deadby, first)
        tally('d', victim, -1)
        local vt, vid = string.match(string.sub(first, #victim + 2), '^(%d+)/(.*)$')
        if tonumber(redis.call('ZSCORE', K.dead, vid)) == tonumber(vt) then
          redis.call('ZREM', K.dead, vid)
          forget(vid, redis.call('HGET', K.pool, vid), false)
          excess = excess - 1
        end -- else a stale entry (deleted by a build before the index): gone now
      end
    end
  end
end
-- promote parks what waited in next for the version in flight, which the
-- caller forgot: a replacement, or a follower (FOLLOWS and the blob).
-- endseries marks a recurring message whose occurrence is in flight as
-- cancelled: its series ends with that occurrence (no next one is parked
-- at its ack, and a failed publish is not tried again), and whatever
-- waited for it is dropped. Cancel by ID ends the series. A new message of
-- its ID that comes after waits behind the mark (ENDS, then FOLLOWS and
-- its blob: park.lua) and is parked when the series has ended. It
-- reports whether it marked one.
local function endseries(id, blob)
  if blob and recurs(blob) then
    redis.call('HSET', K.next, id, ENDS)
    return true
  end
  return false
end
-- ending reports whether what waits for a message (its Keys.Next value)
-- ends its series (endseries), and what waits after that ('' none).
local function ending(waiting)
  if waiting and string.sub(waiting, 1, #ENDS) == ENDS then return true, string.sub(waiting, #ENDS + 1) end
  return false, ''
end

local function promote(id, blob)
  if follows(blob) then blob = string.sub(blob, #FOLLOWS + 1) end
  local info = blobinfo(blob)
  redis.call('HSET', K.pool, id, blob)
  put(info.prio, id, info.due)
  groupadd(info.group, id)
  series(id, info)
  live(info.ingest, 1)
end
