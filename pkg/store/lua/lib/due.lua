--[[ due: the states of a message in its shard in layout 1, besides its pool
entry and the dead set: parked, claimed ahead, in flight, waiting for a
max_rate slot, held for its sink. Every script reads and writes a message's
state through the functions here and touches no due set itself;
lib/due2.lua has the same functions for layout 2, and Go builds each script
once per layout (scripts.go).
--! keys: due meta layout
--! include: meta bulk wire

Layout 1 keeps them in the due sets, one per priority, each message scored
by its score on the wire (lib/wire.lua): the state is in the score's
fraction or band (see Keys in keys.go).
]]

-- A shard converted to layout 2 (migrate up) has its marker "2": this
-- build's layout-1 scripts refuse it, and Go runs the layout-2 ones
-- instead. One converted back (migrate down) has "1". A marker of a
-- layout this build does not know (a newer delaybridge's) is refused,
-- never guessed at.
local mark = redis.call('GET', K.layout)
if mark == '2' then return redis.error_reply('LAYOUT the shard is in layout 2') end
if mark and mark ~= '1' then return redis.error_reply('LAYOUT the shard is in layout ' .. mark .. ', which this build does not know') end

-- KEEPSDONE: in layout 1, which the previous release runs in beside this
-- build during a rolling upgrade, an ack also writes the key of the
-- delivered message that that release reads to tell a re-read (Keys.Done),
-- as it wrote it itself (acklease, lib/fire.lua).
local KEEPSDONE = true

-- zkey is the due set of priority p.
local function zkey(p) return K.due[p] end
-- maxprio is the highest priority whose due set exists, 0 when only the
-- default set may hold messages: one EXISTS of the due sets of priorities
-- 1 and up (the KEYS from PRIOFROM to PRIOTO, scripts.go) instead of a
-- lookup per set for the common case of no priorities in use.
local function maxprio()
  if redis.call('EXISTS', unpack(KEYS, PRIOFROM, PRIOTO)) == 0 then return 0 end
  return MAXPRIO
end

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

-- Moving a message. Each takes the message's score on the wire where it
-- is (from) and where it goes (to).

-- put puts an ID of priority p in the state a score says; it is in no
-- state of that priority, or in that same one.
local function put(p, id, to) redis.call('ZADD', zkey(p), to, id) end
-- drop takes an ID of priority p out of its state.
local function drop(p, id, from) redis.call('ZREM', zkey(p), id) end
-- move takes an ID of priority p from one state to another.
local function move(p, id, from, to) redis.call('ZADD', zkey(p), to, id) end
-- movemany is move for the triples of moves: {from1, to1, id1, from2, ...}.
local function movemany(p, moves)
  local adds = {}
  for i = 1, #moves, 3 do
    adds[#adds + 1] = moves[i + 1]
    adds[#adds + 1] = moves[i + 2]
  end
  callmany('ZADD', zkey(p), adds)
end
-- dropmany is drop for a list of IDs all in the state from says.
local function dropmany(p, ids, from) callmany('ZREM', zkey(p), ids) end
-- unschedule takes an ID out of whichever state holds it.
local function unschedule(id)
  for p = 0, maxprio() do redis.call('ZREM', zkey(p), id) end
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

-- heldof returns up to n messages held in band k, highest priority first
-- and due order within one, as {id1, priority1, due1, id2, ...}.
local function heldof(k, n)
  local base, out = bandlow(k), {}
  for p = maxprio(), 0, -1 do
    if n <= 0 then break end
    local r = redis.call('ZRANGEBYSCORE', zkey(p), base, '(' .. (base + HOLDBAND), 'WITHSCORES', 'LIMIT', 0, n)
    for i = 1, #r, 2 do
      out[#out + 1] = r[i]
      out[#out + 1] = p
      out[#out + 1] = tonumber(r[i + 1]) - base
      n = n - 1
    end
  end
  return out
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
-- priority and the held run of each of the first bands hold bands. None is
-- a slot run (lib/due2.lua): here a message waiting for a max_rate slot is
-- among the others at its slot, and counts as due once the slot has come.
local function spans(bands)
  local out = {}
  for p = 0, maxprio() do
    local key = zkey(p)
    if redis.call('EXISTS', key) == 1 then
      out[#out + 1] = {key = key, off = 0, top = HOLDBAND, held = false}
      for k = 0, bands - 1 do out[#out + 1] = {key = key, off = bandlow(k), top = HOLDBAND, held = true} end
    end
  end
  return out
end
