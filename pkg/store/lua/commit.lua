--[[ commit: just before their due instant (ARGV[2], Options.CommitLead), puts
in flight the messages a claim took ahead of their due time (claim.lua) that
are still as the claim left them, and gives back those the claimer no
longer holds for (it stops; their sink
was blocked meanwhile). A message that was cancelled, replaced or
rescheduled after the claim has another score, or none: it is not
committed, and so not published. Whatever Redis ran before the due instant
wins over the claim.
--! firing
--! include: time due

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

local nowus = servertimeus()
local now = math.floor(nowus / 1000)
local expiry = tonumber(ARGV[1])
local lead = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local mine = expiry + AHEAD_MARK
local inflight = fmtscore(expiry, LEASE_MARK)
local top = maxprio()
local out = {nowus}
for i = 4, 3 + 2 * n, 2 do
  local id, due = ARGV[i], tonumber(ARGV[i + 1])
  local score, p = duescore(id, top)
  local r = 0
  if score and tonumber(score) == expiry + LEASE_MARK then
    r = 1 -- committed already (a commit whose reply was lost, sent again)
  elseif score and tonumber(score) == mine and expiry > now then
    if due * 1000 <= nowus + lead then
      move(p, id, score, inflight)
      r = 1
    else
      r = -1
    end
  end
  out[#out + 1] = r
end
local given = 0
for i = 4 + 2 * n, #ARGV, 2 do
  local id = ARGV[i]
  local score, p = duescore(id, top)
  if score and tonumber(score) == mine then
    move(p, id, score, ARGV[i + 1])
    given = given + 1
  end
end
out[#out + 1] = given
return out
