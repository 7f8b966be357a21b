--[[ dead: moves messages of a lease to the dead set.
--! keys: pool dead next series
--! firing
--! include: time due meta life

ARGV[1]   the lease's expiry (Lease.ExpiryMs)
ARGV[2]   dead messages kept per shard (the oldest beyond are deleted)
ARGV[3..] pairs: message ID, reason
returns   how many were moved (those still held under the lease); a
          replacement or a follower that waited for the message takes its
          place instead
]]

local expiry = tonumber(ARGV[1])
local now = servertime()
local top = maxprio()
local n = 0
for i = 3, #ARGV, 2 do
  local id = ARGV[i]
  local ok, p, a = claimedattempts(id, expiry, top)
  if ok then
    redis.call('ZREM', zkey(p), id)
    local waiting = redis.call('HGET', K.next, id)
    if waiting then
      -- what waited for this version takes its place
      forget(id, redis.call('HGET', K.pool, id))
      promote(id, waiting)
    else
      redis.call('ZADD', K.dead, now, id)
      setmeta(id, a + 1, now, p, ARGV[i + 1])
      redis.call('SREM', K.series, id) -- a dead series is not a live one
    end
    n = n + 1
  end
end
trimdead(tonumber(ARGV[2]))
return n
