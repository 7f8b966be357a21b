--[[ putback: puts messages of a lease back at the scores given, their
attempt not counted: hold parks them in their sink's hold band, defer at
their publish slot, postpone at a later due time.
--! firing
--! include: settle

ARGV[1]   the lease's expiry (Lease.ExpiryMs)
ARGV[2..] pairs: message ID, score
returns   how many were put back (those still held under the lease)
]]

return putbacklease(tonumber(ARGV[1]), ARGV, 2, #ARGV)
