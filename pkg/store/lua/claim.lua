--[[ claim: takes due messages and puts them in flight, highest priority
first, due order within a priority. A due message of a blocked sink (down or
paused) is held instead: moved into the sink's hold band, due order kept,
untouched until release brings it back.
--! firing
--! include: fire

ARGV[1]   at most this many messages
ARGV[2]   lease in ms
ARGV[3..] pairs: a blocked sink's name, its hold band index
returns   {now, next, expiry, acked, id1, attempt1, slotted1, message1, id2, ...}
          now: Redis server time (Unix µs), the clock every instance shares
          (a message is due when its score is at most now in ms);
          next: lowest score left in the due sets (held ones aside), -1 when
          none is left, now when the script stopped holding before it was
          done (claim again at once);
          expiry: when this claim's lease ends (now + lease ms, and after
          the shard's previous lease), which identifies the claim;
          acked: how many of the previous lease's messages were acked
          (claimack; 0 here);
          attempt: this publish attempt, from 1;
          slotted: 1 when the message had been given a publish slot by the
          sink's max_rate (defer), 0 otherwise.

A message is due when its score is <= now: a parked message whose due time
has come, or an in-flight message whose lease expired (its claimer died).
Claiming re-scores it to the lease expiry (+ LEASE_MARK). Only a claim that
finds an expired lease writes the meta value, to count the abandoned
attempt, so that a message that crashes its claimers still reaches
max_attempts.
]]

return claimdue(tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV, 3, 0)
