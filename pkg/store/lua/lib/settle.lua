--[[ settle: what became of a lease's messages besides their acks (fire.lua's
acklease): retried, dead, or put back without counting an attempt. Each
acts only on a message still held under the lease (claimedby), so that an
instance that lost its lease cannot undo the work of the one that took
the message over.

Each takes top, maxprio() read once as the settle began: a message under
the lease is in the due set of its priority before any outcome is written,
and an outcome moves only its own message, so the sets a later outcome
looks in are the ones that existed at the start.
--! keys: pool dead next meta
--! include: time due meta life identity series tally
]]

-- claimedattempts is claimedby plus the attempts recorded before this claim.
local function claimedattempts(id, expiry, top)
  local ok, p = claimedby(id, expiry, top)
  if not ok then return false end
  return true, p, (meta(redis.call('HGET', K.meta, id)))
end

-- retrylease puts messages of the lease that ends at expiry back in their
-- due set for their next attempt: args[from .. to] are triples (ID, next
-- attempt time in Unix ms, last error). A replacement that waited for one
-- takes its place instead (a follower waits on). It returns how many.
local function retrylease(expiry, args, from, to, top)
  local n = 0
  local mine = fmtscore(expiry, LEASE_MARK)
  for i = from, to, 3 do
    local id = args[i]
    local ok, p, a = claimedattempts(id, expiry, top)
    if ok then
      local waiting = redis.call('HGET', K.next, id)
      local ends, after = ending(waiting)
      if ends then -- cancelled in flight (endseries): not tried again
        drop(p, id, mine)
        forget(id, redis.call('HGET', K.pool, id), true)
        if after ~= '' then promote(id, after) end
      elseif waiting and not follows(waiting) then
        drop(p, id, mine)
        forget(id, redis.call('HGET', K.pool, id), true)
        promote(id, waiting)
      else
        move(p, id, mine, args[i + 1])
        setmeta(id, a + 1, 0, p, args[i + 2])
      end
      n = n + 1
    end
  end
  return n
end

-- deadlease moves messages of the lease to the dead set: args[from .. to]
-- are pairs (ID, reason); maxdead bounds the dead messages of the shard
-- (the oldest beyond are deleted). What waited for one takes its place
-- instead. It returns how many.
local function deadlease(expiry, maxdead, args, from, to, top)
  if from > to then return 0 end
  local now = servertime()
  local n = 0
  local mine = fmtscore(expiry, LEASE_MARK)
  for i = from, to, 2 do
    local id = args[i]
    local ok, p, a = claimedattempts(id, expiry, top)
    if ok then
      drop(p, id, mine)
      local waiting = redis.call('HGET', K.next, id)
      local ends, after = ending(waiting)
      if ends then -- cancelled in flight (endseries)
        forget(id, redis.call('HGET', K.pool, id), true)
        if after ~= '' then promote(id, after) end
      elseif waiting then
        forget(id, redis.call('HGET', K.pool, id), true)
        promote(id, waiting)
      else
        local src = blobinfo(redis.call('HGET', K.pool, id)).ingest
        deadadd(id, now, src)
        setmeta(id, a + 1, now, p, args[i + 1])
        live(src, -1)
        leaveseries(id, src) -- a dead series is not a live one
      end
      n = n + 1
    end
  end
  if n > 0 then trimdead(maxdead) end
  return n
end

-- putbacklease puts messages of the lease back at the scores given, their
-- attempt not counted: args[from .. to] are pairs (ID, score). A hold
-- parks one in its sink's hold band, a defer at its publish slot, a
-- postpone at a later due time; an occurrence whose series was cancelled
-- in flight (endseries) is not put back: its series ends. It returns how
-- many.
local function putbacklease(expiry, args, from, to, top)
  local n = 0
  local mine = fmtscore(expiry, LEASE_MARK)
  local anynext = redis.call('EXISTS', K.next) == 1
  for i = from, to, 2 do
    local id = args[i]
    local ok, p = claimedby(id, expiry, top)
    if ok then
      local ends, after = ending(anynext and redis.call('HGET', K.next, id))
      if ends then
        drop(p, id, mine)
        forget(id, redis.call('HGET', K.pool, id), true)
        if after ~= '' then promote(id, after) end
      else
        move(p, id, mine, args[i + 1])
      end
      n = n + 1
    end
  end
  return n
end
