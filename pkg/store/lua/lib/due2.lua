--[[ due2: the states of a message in its shard in layout 2, the same
functions as lib/due.lua (layout 1) has, over keys that show each state as
it is: a sorted set per state and priority, scored by a time and nothing
else (see Keys in keys.go):
  due        parked: its due time (Unix ms)
  inflight   in flight: its lease's expiry
  ahead      claimed ahead of its due time: its lease's expiry
  slot       waiting for a max_rate slot: the slot
  held:<k>   held for the sink of hold band k: its due time (held:<k>:pP
             for priority P), with holding (hash: ID -> "<k>:<priority>")
             saying where
Each function takes and gives scores on the wire (lib/wire.lua), as the
layout-1 one does, so that the scripts and Go are the same for both.
--! keys: pool due inflight ahead slot holding meta layout
--! include: meta bulk wire heldkey
]]

-- A shard in layout 2 has its marker "2" (Keys.LayoutMark). One without a
-- marker that holds nothing yet takes it here; one that holds messages,
-- or that migrate down marked "1" (a daemon that still takes it for
-- layout 2 must not mark it again, even empty), is in layout 1, and this
-- build's layout-1 scripts run there instead.
local mark = redis.call('GET', K.layout)
if mark ~= '2' then
  if mark and mark ~= '1' then return redis.error_reply('LAYOUT the shard is in layout ' .. mark .. ', which this build does not know') end
  if mark or redis.call('EXISTS', K.pool) == 1 then return redis.error_reply('LAYOUT the shard is in layout 1') end
  redis.call('SET', K.layout, '2')
end

-- KEEPSDONE: no release before layouts runs beside this one in layout 2,
-- so an ack writes no key of the previous release (lib/due.lua).
local KEEPSDONE = false

-- The key of each state of priority p that is not held, and the mark its
-- times carry on the wire.
local MARKS = {due = 0, inflight = LEASE_MARK, ahead = AHEAD_MARK, slot = SLOT_MARK}
local PLAIN = {'due', 'inflight', 'ahead', 'slot'}
-- statekey is the key of the state a score not held says, and the time
-- it keeps there.
local function statekey(p, score)
  -- a due time, the common case: a whole number (Redis writes a score
  -- without a fraction with no point)
  if not string.find(score, '.', 1, true) then return K.due[p], score end
  local n = tonumber(score)
  if leased(n) then return K.inflight[p], n - LEASE_MARK end
  if ahead(n) then return K.ahead[p], n - AHEAD_MARK end
  if slotted(n) then return K.slot[p], n - SLOT_MARK end
  return K.due[p], score
end
-- maxprio is the highest priority any of whose sets exists, 0 when only
-- the default ones may hold messages (held messages aside: holding knows
-- their priority): one EXISTS of the sets of priorities 1 and up
-- (the KEYS from PRIOFROM to PRIOTO, scripts.go), no table built.
local function maxprio()
  if redis.call('EXISTS', unpack(KEYS, PRIOFROM, PRIOTO)) == 0 then return 0 end
  return MAXPRIO
end

-- Finding a message.

-- heldat returns an ID's score and priority when it is held, else false.
local function heldat(id)
  local v = redis.call('HGET', K.holding, id)
  if not v then return false, 0 end
  local k, p = string.match(v, '^(%d+):(%d+)$')
  local due = redis.call('ZSCORE', heldkey(k, p), id)
  if not due then return false, 0 end
  return fmtscore(bandlow(k) + tonumber(due), 0), tonumber(p)
end
-- plainat returns an ID's score in the states of priority p that are not
-- held, false when it is in none of them.
local function plainat(p, id)
  for _, st in ipairs(PLAIN) do
    local s = redis.call('ZSCORE', K[st][p], id)
    if s then
      if MARKS[st] == 0 then return s end
      return fmtscore(tonumber(s), MARKS[st])
    end
  end
  return false
end
-- scoreat is the score of an ID in the states of priority p, false when
-- it is in none of them.
local function scoreat(p, id)
  local s = plainat(p, id)
  if s then return s end
  local h, hp = heldat(id)
  if h and hp == p then return h end
  return false
end
-- duescore returns the score and priority of an ID in the states of
-- priorities 0..top (top defaults to maxprio()).
local function duescore(id, top)
  for p = 0, top or maxprio() do
    local s = plainat(p, id)
    if s then return s, p end
  end
  return heldat(id)
end
-- claimedby reports whether an ID is still in flight under the lease that
-- ends at expiry (ms), and its priority.
local function claimedby(id, expiry, top)
  for p = 0, top or maxprio() do
    local s = redis.call('ZSCORE', K.inflight[p], id)
    if s then return tonumber(s) == expiry, p end
  end
  return false, 0
end

-- Moving a message. Each takes the message's score on the wire where it
-- is (from) and where it goes (to).

-- put puts an ID of priority p in the state a score says; it is in no
-- state of that priority, or in that same one.
local function put(p, id, to)
  if held(to) then
    local n = tonumber(to)
    local k = math.floor(n / HOLDBAND) - 1
    redis.call('ZADD', heldkey(k, p), n - bandlow(k), id)
    redis.call('HSET', K.holding, id, k .. ':' .. p)
    return
  end
  local key, t = statekey(p, to)
  redis.call('ZADD', key, t, id)
end
-- drop takes an ID of priority p out of its state.
local function drop(p, id, from)
  if held(from) then
    redis.call('ZREM', heldkey(math.floor(tonumber(from) / HOLDBAND) - 1, p), id)
    redis.call('HDEL', K.holding, id)
    return
  end
  redis.call('ZREM', (statekey(p, from)), id)
end
-- move takes an ID of priority p from one state to another. Into a held
-- set from another state, the new state is written first: a held set is
-- the one key the scripts name by a prefix (lib/heldkey.lua) rather than
-- get in KEYS, and should a write to it fail mid-script, the message stays
-- where it was instead of being in no state. A precaution: while a shard's slot
-- moves, Redis Cluster refuses a script whose declared keys are not all on
-- the node before it starts, and most of a shard's declared keys do not
-- exist. (The other uses of a held set read it before they change the
-- message.)
local function move(p, id, from, to)
  if held(to) and not held(from) then
    put(p, id, to)
    drop(p, id, from)
    return
  end
  drop(p, id, from)
  put(p, id, to)
end
-- movemany is move for the triples of moves: {from1, to1, id1, from2, ...},
-- one call per key. A claim's moves share a few scores (its lease, a
-- band), whose keys are worked out once.
local function movemany(p, moves)
  local rems, adds, order = {}, {}, {}
  local tokey, totime = {}, {}
  local function list(t, key)
    if not t[key] then
      t[key] = {}
      order[#order + 1] = key
    end
    return t[key]
  end
  for i = 1, #moves, 3 do
    local from, to, id = moves[i], moves[i + 1], moves[i + 2]
    if held(from) or held(to) then
      move(p, id, from, to)
    else
      local fk = statekey(p, from)
      if not tokey[to] then tokey[to], totime[to] = statekey(p, to) end
      local tk, t = tokey[to], totime[to]
      if fk ~= tk then
        local r = list(rems, fk)
        r[#r + 1] = id
      end
      local a = list(adds, tk)
      a[#a + 1] = t
      a[#a + 1] = id
    end
  end
  for _, key in ipairs(order) do
    if rems[key] then callmany('ZREM', key, rems[key]) end
  end
  for _, key in ipairs(order) do
    if adds[key] then callmany('ZADD', key, adds[key]) end
  end
end
-- dropmany is drop for a list of IDs all in the state from says.
local function dropmany(p, ids, from)
  if held(from) then
    for _, id in ipairs(ids) do drop(p, id, from) end
    return
  end
  callmany('ZREM', (statekey(p, from)), ids)
end
-- unschedule takes an ID out of whichever state holds it.
local function unschedule(id)
  for p = 0, maxprio() do
    for _, st in ipairs(PLAIN) do redis.call('ZREM', K[st][p], id) end
  end
  local h, hp = heldat(id)
  if h then drop(hp, id, h) end
end

-- What a claim looks at.

-- claimable returns up to n entries of priority p a claim takes now, due
-- order, as {id1, score1, id2, ...}: parked and due, claimed under a lease
-- that ended, or at a rate slot that came.
local function claimable(p, now, n)
  local due = redis.call('ZRANGEBYSCORE', K.due[p], '-inf', now, 'WITHSCORES', 'LIMIT', 0, n)
  local all = {}
  for i = 2, #PLAIN do
    local st = PLAIN[i]
    -- a time t of a marked state is claimable once t + mark <= now
    local r = redis.call('ZRANGEBYSCORE', K[st][p], '-inf', '(' .. now, 'WITHSCORES', 'LIMIT', 0, n)
    for j = 1, #r, 2 do
      local sc = fmtscore(tonumber(r[j + 1]), MARKS[st])
      all[#all + 1] = {id = r[j], score = sc, n = tonumber(sc)}
    end
  end
  -- only parked messages, the common case: the due set's own order
  if #all == 0 then return due end
  for j = 1, #due, 2 do all[#all + 1] = {id = due[j], score = due[j + 1], n = tonumber(due[j + 1])} end
  -- the order one sorted set would give: by score, then by ID
  table.sort(all, function(a, b)
    if a.n ~= b.n then return a.n < b.n end
    return a.id < b.id
  end)
  local out = {}
  for j = 1, math.min(n, #all) do
    out[#out + 1] = all[j].id
    out[#out + 1] = all[j].score
  end
  return out
end
-- soon returns up to n messages of priority p that a claim may take ahead:
-- parked, or waiting for a rate slot, and due after now and within win ms;
-- due order, as two lists: IDs and their scores.
local function soon(p, now, win, n)
  local all = {}
  local r = redis.call('ZRANGEBYSCORE', K.due[p], '(' .. now, now + win, 'WITHSCORES', 'LIMIT', 0, n)
  for i = 1, #r, 2 do all[#all + 1] = {id = r[i], score = r[i + 1], n = tonumber(r[i + 1])} end
  -- a slot t is after now and within win when now < t + SLOT_MARK <= now + win
  r = redis.call('ZRANGEBYSCORE', K.slot[p], now, '(' .. (now + win), 'WITHSCORES', 'LIMIT', 0, n)
  for i = 1, #r, 2 do
    local s = fmtscore(tonumber(r[i + 1]), SLOT_MARK)
    all[#all + 1] = {id = r[i], score = s, n = tonumber(s)}
  end
  table.sort(all, function(a, b)
    if a.n ~= b.n then return a.n < b.n end
    return a.id < b.id
  end)
  local ids, scores = {}, {}
  for i = 1, math.min(n, #all) do
    ids[i] = all[i].id
    scores[i] = all[i].score
  end
  return ids, scores
end
-- nextclaim returns when a claim may next find something in the states of
-- priority p (Unix ms; -1 nothing): the first lease or slot to end, or a
-- parked message's due time less half the ahead window (a claim then takes
-- at least half a window ahead, not one message at each step of a steady
-- stream), but not before now + 1. Held messages wait for a release.
local function nextclaim(p, now, aheadms)
  local best = -1
  for _, st in ipairs(PLAIN) do
    local first = redis.call('ZRANGE', K[st][p], 0, 0, 'WITHSCORES')
    if first[2] then
      local t = tonumber(first[2])
      local s = math.ceil(t + MARKS[st]) -- a lease x.5 is claimable from x+1
      if s > now and (st == 'due' or st == 'slot') then
        s = math.max(now + 1, s - math.ceil(aheadms / 2))
      end
      if best == -1 or s < best then best = s end
    end
  end
  return best
end

-- Held messages.

-- heldof returns up to n messages held in band k, highest priority first
-- and due order within one, as {id1, priority1, due1, id2, ...}.
local function heldof(k, n)
  local out = {}
  for p = MAXPRIO, 0, -1 do
    if n <= 0 then break end
    local r = redis.call('ZRANGE', heldkey(k, p), 0, n - 1, 'WITHSCORES')
    for i = 1, #r, 2 do
      out[#out + 1] = r[i]
      out[#out + 1] = p
      out[#out + 1] = tonumber(r[i + 1])
      n = n - 1
    end
  end
  return out
end
-- heldcount counts the messages held in band k.
local function heldcount(k)
  local n = 0
  for p = 0, MAXPRIO do n = n + redis.call('ZCARD', heldkey(k, p)) end
  return n
end

-- Walking a shard's states (browse, stats).

-- spans lists the runs of entries a listing or a count walks: each is a
-- sorted set key whose entries, from off (inclusive) to off + top
-- (exclusive), have positions score - off (a score on the wire less its
-- hold band); held says they are held, slot that they wait for a max_rate
-- slot (due already: their positions are their slots). They are the sets
-- of each state and priority, held in the first bands hold bands included.
local function spans(bands)
  local out = {}
  for p = 0, maxprio() do
    for _, st in ipairs(PLAIN) do
      local key = K[st][p]
      if redis.call('EXISTS', key) == 1 then
        out[#out + 1] = {key = key, off = -MARKS[st], top = HOLDBAND, held = false, slot = st == 'slot'}
      end
    end
  end
  for k = 0, bands - 1 do
    for p = 0, MAXPRIO do
      local key = heldkey(k, p)
      if redis.call('EXISTS', key) == 1 then
        out[#out + 1] = {key = key, off = 0, top = HOLDBAND, held = true}
      end
    end
  end
  return out
end
