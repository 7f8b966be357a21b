--[[ dead: moves messages of a lease to the dead set.
--! firing
--! include: settle

ARGV[1]   the lease's expiry (Lease.ExpiryMs)
ARGV[2]   dead messages kept per shard (the oldest beyond are deleted)
ARGV[3..] pairs: message ID, reason
returns   how many were moved (those still held under the lease); a
          replacement or a follower that waited for the message takes its
          place instead
]]

return deadlease(tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV, 3, #ARGV)
