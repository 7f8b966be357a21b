--[[ settle: every outcome of a lease's published batch in one call: the
acks (fire.lua's acklease), the retries, the deaths and what is put back
without counting an attempt (held, deferred, postponed). Each acts only on
a message still held under the lease.
--! firing
--! include: fire settle

KEYS      the shard's keys, then the dedupe window's current bucket
          (Keys.Seen)
ARGV[1]   the lease's expiry (Lease.ExpiryMs)
ARGV[2]   when that bucket expires (Unix ms; 0: the dedupe window is off)
ARGV[3]   dead messages kept per shard
ARGV[4..7] how many acks, retries, deaths and put-backs follow
then      the acks, 8 values each (as ack.lua), the retries, 3 each (as
          retry.lua), the deaths, 2 each (as dead.lua), the put-backs, 2
          each (as putback.lua)
returns   {acked, retried, dead, put back}: how many of each were still
          held under the lease
]]

local expiry = tonumber(ARGV[1])
local na, nr, nd, np = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local i = 8
local acked = acklease(expiry, tonumber(ARGV[2]), ARGV, i, i + 8 * na - 1, KEYS[NKEYS + 1])
i = i + 8 * na
local retried = retrylease(expiry, ARGV, i, i + 3 * nr - 1)
i = i + 3 * nr
local dead = deadlease(expiry, tonumber(ARGV[3]), ARGV, i, i + 2 * nd - 1)
i = i + 2 * nd
local back = putbacklease(expiry, ARGV, i, i + 2 * np - 1)
return {acked, retried, dead, back}
