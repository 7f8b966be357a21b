--[[ ack: removes delivered messages: forgets them, or parks their next
occurrence (recurring), or what waited for them (a replacement, a follower).
--! firing
--! include: fire

KEYS      the shard's keys, then the dedupe window's current bucket
          (Keys.Seen)
ARGV[1]   the lease's expiry (Lease.ExpiryMs)
ARGV[2]   when that bucket expires (Unix ms; 0: the dedupe window is off)
ARGV[3..] per message 8 values: ID, what the dedupe window remembers of it
          (doneMark, '' nothing), its field in the bucket (seenField),
          group ('' none), then for a recurring message the next
          occurrence: due time (Unix ms), priority, encoded message; '' ''
          '' when the series ends or the message does not recur; then its
          source (its ingest, '' the admin API), whose count (tally.lua)
          a message removed leaves
returns   how many were removed or moved on; a message no longer held under
          the lease (it expired and another claim took the message, or it
          was cancelled) is left alone

The caller passes each message's group and source, so that the common ack
reads no blob; next (something waiting) is looked at only when it exists.
]]

return acklease(tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV, 3, #ARGV, KEYS[NKEYS + 1])
