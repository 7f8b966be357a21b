--[[ putback: puts messages of a lease back at the scores given, their
attempt not counted: hold parks them in their sink's hold band, defer at
their publish slot, postpone at a later due time.
--! firing
--! include: due

ARGV[1]   the lease's expiry (Lease.ExpiryMs)
ARGV[2..] pairs: message ID, score
returns   how many were put back (those still held under the lease)
]]

local expiry = tonumber(ARGV[1])
local top = maxprio()
local n = 0
for i = 2, #ARGV, 2 do
  local ok, p = claimedby(ARGV[i], expiry, top)
  if ok then
    redis.call('ZADD', zkey(p), ARGV[i + 1], ARGV[i])
    n = n + 1
  end
end
return n
