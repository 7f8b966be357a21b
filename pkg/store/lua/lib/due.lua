--[[ due: the due sets of a shard and what their scores say.
--! keys: due meta
--! include: meta

A parked message is in the due set of its priority with its due time (Unix
ms) as its score; in flight, with its lease's expiry + LEASE_MARK; claimed
ahead of its due time (not in flight: its due time is the stored message's,
and a commit just before that instant puts it in flight), with its lease's
expiry + AHEAD_MARK; waiting for a max_rate slot, the slot + SLOT_MARK; held for its
sink, in the sink's band: HOLDBAND * (1 + band) + its due time (see Keys in
keys.go).
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
local function held(score) return tonumber(score) >= HOLDBAND end
-- bandlow is the lowest score of hold band index k (the sink's, from the
-- sinks hash); the band holds the scores from it to bandlow(k) + HOLDBAND,
-- that one excluded.
local function bandlow(k) return HOLDBAND * (1 + tonumber(k)) end
-- bandbase is the lowest score of the hold band a due-set score is in, 0
-- for a message not held: the score less it is the due time.
local function bandbase(score)
  if not held(score) then return 0 end
  return math.floor(tonumber(score) / HOLDBAND) * HOLDBAND
end
-- leased reports whether a due-set score is a lease expiry.
local function leased(score) return tonumber(score) % 1 == LEASE_MARK end
-- ahead reports whether a due-set score is a claim ahead of the due time.
local function ahead(score) return tonumber(score) % 1 == AHEAD_MARK end
-- slotted reports whether a due-set score is a max_rate slot.
local function slotted(score) return tonumber(score) % 1 == SLOT_MARK end
-- unschedule removes an ID from whichever due set holds it.
local function unschedule(id)
  for p = 0, maxprio() do redis.call('ZREM', zkey(p), id) end
end
-- duescore returns the score and priority of an ID in the due sets of
-- priorities 0..top (top defaults to maxprio()).
local function duescore(id, top)
  for p = 0, top or maxprio() do
    local s = redis.call('ZSCORE', zkey(p), id)
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
