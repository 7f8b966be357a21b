--[[ claimack: ack of the shard's previous lease, then claim, in one call:
the ack of a batch travels with the next claim.
--! firing
--! function
--! include: fire

KEYS      the shard's keys, then the dedupe window's current bucket, then
          in layout 1 the key Keys.Done of each message acked (or none)
ARGV[1]   c, the index of the claim's arguments
ARGV[2..c-1] the ack script's arguments
ARGV[c..] the claim script's arguments
returns   the claim script's reply, with the acked count
]]

local c = tonumber(ARGV[1])
local acked = acklease(tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV, 4, c - 1, KEYS[NKEYS + 1], maxprio())
return claimdue(tonumber(ARGV[c]), tonumber(ARGV[c + 1]), tonumber(ARGV[c + 2]), ARGV, c + 3, acked)
