--[[ retry: puts messages of a lease whose publish failed back in the due
set, for their next attempt.
--! firing
--! include: settle

ARGV[1]   the lease's expiry (Lease.ExpiryMs)
ARGV[2..] triples: message ID, next attempt time (Unix ms), last error
returns   how many were rescheduled (those still held under the lease); a
          replacement that waited for the message takes its place instead
          (a follower waits on)
]]

return retrylease(tonumber(ARGV[1]), ARGV, 2, #ARGV)
