--[[ commitack: ack of the shard's previous lease, then commit, in one call:
the ack of a publish travels with the shard's next commit, as it does with
its next claim (claimack.lua).
--! firing
--! function
--! include: fire ahead

KEYS      the shard's keys, then the dedupe window's current bucket, then
          in layout 1 the key Keys.Done of each message acked (or none)
ARGV[1]   c, the index of the commit's arguments
ARGV[2..c-1] the ack's arguments (the lease's expiry, the bucket's expiry,
          then 8 values per message: lib/fire.lua's acklease)
ARGV[c..] the commit script's arguments
returns   the commit script's reply, then the acked count
]]

local c = tonumber(ARGV[1])
local acked = acklease(tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV, 4, c - 1, KEYS[NKEYS + 1], maxprio())
local out = commitahead(ARGV, c)
out[#out + 1] = acked
return out
