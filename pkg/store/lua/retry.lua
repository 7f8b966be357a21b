--[[ retry: puts messages of a lease whose publish failed back in the due
set, for their next attempt.
--! keys: pool next
--! firing
--! include: due meta life identity

ARGV[1]   the lease's expiry (Lease.ExpiryMs)
ARGV[2..] triples: message ID, next attempt time (Unix ms), last error
returns   how many were rescheduled (those still held under the lease); a
          replacement that waited for the message takes its place instead
          (a follower waits on)
]]

local expiry = tonumber(ARGV[1])
local top = maxprio()
local n = 0
for i = 2, #ARGV, 3 do
  local id = ARGV[i]
  local ok, p, a = claimedattempts(id, expiry, top)
  if ok then
    local waiting = redis.call('HGET', K.next, id)
    if waiting and not follows(waiting) then
      -- a replacement waited for this version: it takes its place
      redis.call('ZREM', zkey(p), id)
      forget(id, redis.call('HGET', K.pool, id))
      promote(id, waiting)
    else
      redis.call('ZADD', zkey(p), ARGV[i + 1], id)
      setmeta(id, a + 1, 0, p, ARGV[i + 2])
    end
    n = n + 1
  end
end
return n
