--[[ commit: just before their due instant (ARGV[2], Options.CommitLead), puts
in flight the messages a claim took ahead of their due time (claim.lua) that
are still as the claim left them, and gives back those the claimer no
longer holds for (it stops; their sink
was blocked meanwhile). A message that was cancelled, replaced or
rescheduled after the claim has another score, or none: it is not
committed, and so not published. Whatever Redis ran before the due instant
wins over the claim.
--! firing
--! function
--! include: ahead

ARGV[1]   the claim's lease expiry (Lease.ExpiryMs)
ARGV[2]   the commit lead in µs: a message due within it is committed
ARGV[3]   n, how many messages to commit
ARGV[4..] n pairs: message ID, its due instant (Unix ms: the ceiling of its
          score before the claim)
then      pairs: message ID, its score before the claim, to give back
returns   {now, r1, ..., rn, given}: now, Redis server time (Unix µs);
          r 1: committed, in flight under the lease (also when it was
          already: a commit is idempotent); 0: not the claim's
          any more (changed, removed, or its lease ended: publish nothing);
          -1: not due within the lead on Redis's clock (still
          claimed ahead: commit it again later); given: how many were given
          back
A message committed is in flight before its due instant: whoever changes a
message in flight answers after the lead (Go's Store.afterCommitLead).
]]

return commitahead(ARGV, 1)
