--[[ wire: what a score on the wire says, the number Go and the scripts pass
each other for a message's state, whatever the layout keeps (lib/due.lua,
lib/due2.lua):
  parked          its due time (Unix ms)
  in flight       its lease's expiry + LEASE_MARK
  claimed ahead   its lease's expiry + AHEAD_MARK (not in flight: its due
                  time is the stored message's, and a commit just before
                  that instant puts it in flight)
  rate slot       the slot + SLOT_MARK
  held            in its sink's band: HOLDBAND * (1 + band) + its due time
A script's reply carries a message's score, and an outcome (lib/settle.lua)
the score to put it at. Layout 1 stores these very numbers in its due sets.
]]

-- fmtscore formats a score exactly (Lua's own number to string conversion
-- keeps 14 digits, and a lease expiry with its mark needs 16).
local function fmtscore(ms, mark) return string.format('%.2f', ms + mark) end
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
-- firing reports whether a score (false: none) is a lease, ended or not:
-- the message's publish may be under way, or may have been sent before
-- the lease ended and reach its broker yet (its holder paused, its broker
-- slow to store it). A claim that takes it over marks it as maybe sent
-- (lib/unconfirmed.lua's markmaybe, from lib/fire.lua), which stands
-- until a publish of it is confirmed.
local function firing(score) return score ~= false and score ~= nil and leased(score) end
