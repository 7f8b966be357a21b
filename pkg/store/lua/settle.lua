--[[ settle: every outcome of a lease's published batch in one call: the
acks (lib/fire.lua's acklease), the retries, the deaths and what is put back
without counting an attempt (held, deferred, postponed). Each acts only on
a message still held under the lease.
--! firing
--! function
--! include: fire settle unconfirmed

KEYS      the shard's keys, then the dedupe window's current bucket, then
          in layout 1 the key Keys.Done of each message acked (or none)
          (Keys.Seen)
ARGV[1]   the lease's expiry (Lease.ExpiryMs)
ARGV[2]   when that bucket expires (Unix ms; 0: the dedupe window is off)
ARGV[3]   dead messages kept per shard
ARGV[4..8] how many acks, retries, deaths, put-backs and unconfirmed
          follow
then      the acks, 8 values each: ID, what the dedupe window remembers
          of it (doneMark, '' nothing), its field in the bucket
          (SeenField), group ('' none), then for a recurring message the
          next occurrence: due time (Unix ms), priority, encoded message
          ('' '' '' when the series ends or the message does not recur),
          then its source (its ingest, '' the admin API), whose count
          (lib/tally.lua) a message removed leaves;
          the retries, 3 each: ID, next attempt time (Unix ms), last error;
          the deaths, 2 each: ID, reason;
          the put-backs, 2 each: ID, score (a hold band, a publish slot, a
          later due time);
          the unconfirmed: IDs of the retried and put back whose publish
          was sent and not confirmed (lib/unconfirmed.lua), marked while
          they are the version that was sent, whoever holds them now
returns   {acked, retried, dead, put back}: how many of each were still
          held under the lease; a message no longer held under it (it
          expired and another claim took it, or it was cancelled) is left
          alone. What waited in next for a message takes its place where
          the outcome ends it (ack, dead; a retried replacement too, a
          follower waits on)

The caller passes each ack's group and source, so that the common ack
reads no blob; next (something waiting) is looked at only when it exists.
]]

local expiry = tonumber(ARGV[1])
local na, nr, nd, np, nu = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local top = maxprio()
local sentat = 9 + 8 * na + 3 * nr + 2 * nd + 2 * np
local sent = sentblobs(ARGV, sentat, sentat + nu - 1)
local i = 9
local acked = acklease(expiry, tonumber(ARGV[2]), ARGV, i, i + 8 * na - 1, KEYS[NKEYS + 1], top)
i = i + 8 * na
local retried = retrylease(expiry, ARGV, i, i + 3 * nr - 1, top)
i = i + 3 * nr
local dead = deadlease(expiry, tonumber(ARGV[3]), ARGV, i, i + 2 * nd - 1, top)
i = i + 2 * nd
local back = putbacklease(expiry, ARGV, i, i + 2 * np - 1, top)
marksent(sent)
return {acked, retried, dead, back}
