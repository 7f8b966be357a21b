--[[ due: the states of a message in its shard, besides its pool entry and
the dead set: parked, claimed ahead, in flight, waiting for a max_rate slot,
held for its sink. Every script reads and writes a message's state through
the functions here and touches no due set itself, so that a layout that
keeps these states elsewhere is this file alone.
--! keys: due meta
--! include: meta bulk

Layout 1 keeps them in the due sets, one per priority, scored:
  parked          its due time (Unix ms)
  in flight       its lease's expiry + LEASE_MARK
  claimed ahead   its lease's expiry + AHEAD_MARK (not in flight: its due
                  time is the stored message's, and a commit just before
                  that instant puts it in flight)
  rate slot       the slot + SLOT_MARK
  held            in its sink's band: HOLDBAND * (1 + band) + its due time
(see Keys in keys.go). The same numbers are what Go and the scripts pass
each other for a state (the wire score): a script's reply carries a
message's score, and an outcome (lib/settle.lua) the score to put it at.
]]

-- fmtscore formats a due-set score exactly (Lua's own number to string
-- conversion keeps 14 digits, and a lease expiry with its mark needs 16).
local function fmtscore(ms, mark) return string.format('%.2f', ms + mark) end
-- zkey is the due set of priority p.
local function zkey(p) return K.due[p] end
-- maxprio is the highest priority whose due set exists, 0 when only the
-- default set may hold messages: one EXISTS instead of a lookup per set
-- for the common case of no priorities in use.
local function maxprio()
  local sets = {}
  for p = 1, MAXPRIO do sets[p] = K.due[p] end
  if redis.call('EXISTS', unpack(sets)) == 0 then return 0 end
  return MAXPRIO
end

-- What a wire score says.
local function held(score) return tonumber(score) >= HOLDBAND end
-- bandlow is the lowest score of hold band index k (the sink's, from the
-- sinks hash); the band holds the scores from it to bandlow(k) + HOLDBAND,
-- that one excluded.
local function bandlow(k) return HOLDBAND * (1 + tonumber(k)) end
-- bandbase is the lowest score of the hold band a score is in, 0 for a
-- message not held: the score less it is the due time.
local function bandbase(score)
  if not held(score) then return 0 end
  return math.floor(tonumber(score) / HOLDBAND) * HOLDBAND
end
-- leased reports whether a score is a lease expiry.
local function leased(score) return tonumber(score) % 1 == LEASE_MARK end
-- ahead reports whether a score is a claim ahead of the due time.
local function ahead(score) return tonumber(score) % 1 == AHEAD_MARK end
-- slotted reports whether a score is a max_rate slot.
local function slotted(score) return tonumber(score) % 1 == SLOT_MARK end
-- firing reports whether a score (false: none) is a lease that has not
-- ended at now (Unix ms): its publish may be under way.
local function firing(score, now) return score ~= false and score ~= nil and leased(score) and tonumber(score) > now end

-- Finding a message.

-- scoreat is the score of an ID in the states of priority p, false when
-- it is in none of them.
local function scoreat(p, id) return redis.call('ZSCORE', zkey(p), id) end
-- duescore returns the score and priority of an ID in the states of
-- priorities 0..top (top defaults to maxprio()).
local function duescore(id, top)
  for p = 0, top or maxprio() do
    local s = scoreat(p, id)
    if s then return s, p end
  end
  return false, 0
end
-- claimedby reports whether an ID is still in flight under the lease that
-- ends at expiry (ms), and its priority.
local function claimedby(id, expiry, top)
  local s, p = duescore(id, top)
  return s ~= false and tonumber(s) == expiry + LEASE_MARK, p
end
-- claimedattempts is claimedby plus the attempts recorded before this claim.
local function claimedattempts(id, expiry, top)
  local ok, p = claimedby(id, expiry, top)
  if not ok then return false end
  return true, p, (meta(redis.call('HGET', K.meta, id)))
end

-- Moving a message.

-- place puts an ID of priority p in the state a score says, out of the
-- one it was in at that priority.
local function place(p, id, score) redis.call('ZADD', zkey(p), score, id) end
-- placemany is place for the pairs of adds: {score1, id1, score2, ...}.
local function placemany(p, adds) callmany('ZADD', zkey(p), adds) end
-- unplace takes an ID of priority p out of its state.
local function unplace(p, id) redis.call('ZREM', zkey(p), id) end
-- unplacemany is unplace for a list of IDs.
local function unplacemany(p, ids) callmany('ZREM', zkey(p), ids) end
-- unschedule takes an ID out of whichever state holds it.
local function unschedule(id)
  for p = 0, maxprio() do unplace(p, id) end
end

-- What a claim looks at.

-- claimable returns up to n entries of priority p a claim takes now, due
-- order, as {id1, score1, id2, ...}: parked and due, claimed under a lease
-- that ended, or at a rate slot that came.
local function claimable(p, now, n)
  return redis.call('ZRANGEBYSCORE', zkey(p), '-inf', now, 'WITHSCORES', 'LIMIT', 0, n)
end
-- soon returns up to n messages of priority p that a claim may take ahead:
-- parked, or waiting for a rate slot, and due after now and within win ms;
-- due order, as two lists: IDs and their scores.
local function soon(p, now, win, n)
  local r = redis.call('ZRANGEBYSCORE', zkey(p), '(' .. now, now + win, 'WITHSCORES', 'LIMIT', 0, 2 * n)
  local ids, dues = {}, {}
  for i = 1, #r, 2 do
    if not leased(r[i + 1]) and not ahead(r[i + 1]) and #ids < n then
      ids[#ids + 1] = r[i]
      dues[#dues + 1] = r[i + 1]
    end
  end
  return ids, dues
end
-- nextclaim returns when a claim may next find something in the states of
-- priority p (Unix ms; -1 nothing): the first lease or slot to end, or a
-- parked message's due time less half the ahead window (a claim then takes
-- at least half a window ahead, not one message at each step of a steady
-- stream), but not before now + 1. Held messages wait for a release.
local function nextclaim(p, now, aheadms)
  local first = redis.call('ZRANGE', zkey(p), 0, 0, 'WITHSCORES')
  if not first[2] or held(first[2]) then return -1 end
  local s = math.ceil(tonumber(first[2])) -- a lease x.5 is claimable from x+1
  if s > now and not leased(first[2]) and not ahead(first[2]) then
    s = math.max(now + 1, s - math.ceil(aheadms / 2))
  end
  return s
end

-- Held messages.

-- heldof returns up to n messages of priority p held in band k, due order,
-- as {id1, due1, id2, ...}.
local function heldof(k, p, n)
  local base = bandlow(k)
  local r = redis.call('ZRANGEBYSCORE', zkey(p), base, '(' .. (base + HOLDBAND), 'WITHSCORES', 'LIMIT', 0, n)
  for i = 2, #r, 2 do r[i] = tonumber(r[i]) - base end
  return r
end
-- heldcount counts the messages held in band k.
local function heldcount(k)
  local base, n = bandlow(k), 0
  for p = 0, maxprio() do
    n = n + redis.call('ZCOUNT', zkey(p), base, '(' .. (base + HOLDBAND))
  end
  return n
end

-- Walking a shard's states (browse, stats).

-- spans lists the runs of entries a listing or a count walks: each is a
-- sorted set key whose entries, from off (inclusive) to off + top
-- (exclusive), have positions score - off (a score on the wire less its
-- hold band); held says they are held. They are the not-held run of each
-- priority and the held run of each hold band, bands of them (nil: as
-- many as the sets hold).
local function spans(bands)
  local out = {}
  for p = 0, maxprio() do
    local key = zkey(p)
    if redis.call('EXISTS', key) == 1 then
      local nb = bands
      if not nb then
        nb = math.max(0, math.floor(tonumber(redis.call('ZRANGE', key, 0, 0, 'REV', 'WITHSCORES')[2]) / HOLDBAND))
      end
      out[#out + 1] = {key = key, off = 0, top = HOLDBAND, held = false}
      for k = 0, nb - 1 do out[#out + 1] = {key = key, off = bandlow(k), top = HOLDBAND, held = true} end
    end
  end
  return out
end
