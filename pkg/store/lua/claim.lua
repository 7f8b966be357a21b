--[[ claim: takes due messages and puts them in flight, highest priority
first, due order within a priority; then, with what is left of the batch,
claims ahead what falls due within the ahead window. A due message of a
blocked sink (down or paused) is held instead: moved into the sink's hold
band, due order kept, untouched until release brings it back.
--! firing
--! function
--! include: fire

ARGV[1]   at most this many messages
ARGV[2]   lease in ms
ARGV[3]   ahead window in ms (0: claim only what is due)
ARGV[4..] pairs: a blocked sink's name, its hold band index
returns   {now, next, expiry, acked, id1, attempt1, slotted1, ahead1, message1, sent1, id2, ...}
          now: Redis server time (Unix µs), the clock every instance shares
          (a message is due when its score is at most now in ms);
          next: when a claim may find something new (Unix ms): the lowest
          score left in the due sets (held ones aside), less half the
          ahead window for a parked message (a claim then takes at least
          half a window of messages ahead, not one at each step of a
          steady stream); -1 when none is left, now when the
          script stopped holding before it was done (claim again at once);
          expiry: when this claim's lease ends (now + lease ms, and after
          the shard's previous lease), which identifies the claim;
          acked: how many of the previous lease's messages were acked
          (claimack; 0 here);
          attempt: this publish attempt, from 1;
          slotted: the publish slot (Unix ms) the message had been given
          by its sink's max_rate (defer), 0 when none;
          ahead: "" for a message claimed due (in flight), else its score
          before the claim (it was claimed ahead: see commit.lua);
          sent: 1 when a publish of this version was sent and never
          confirmed (lib/unconfirmed.lua), 0 otherwise.

A message is due when its score is <= now: a parked message whose due time
has come, or a message whose lease expired (its claimer died, or stopped
before committing what it claimed ahead). Claiming re-scores it to the
lease expiry + LEASE_MARK. Only a claim that finds an expired lease
(LEASE_MARK) writes the meta value, to count the abandoned attempt, so that
a message that crashes its claimers still reaches max_attempts; an expired
claim ahead was never published and counts nothing.

A parked message due within the ahead window is claimed ahead: re-scored
to the lease expiry + AHEAD_MARK. It is not in flight: every script that
changes a parked message (cancel, replace, reschedule) changes it as it
would a parked one, which takes it from the claim; commit.lua puts what is
left of the claim in flight just before the due instant.
]]

return claimdue(tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV, 4, 0)
