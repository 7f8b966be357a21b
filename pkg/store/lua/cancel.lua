--[[ cancel: forgets a parked or dead message; one in flight is left alone,
since its publish may be under way or, its lease ended, may have been sent
before and reach its broker yet (lib/wire.lua's firing), and so is one
sent before without a confirmation (lib/unconfirmed.lua), which its broker
may take yet.
--! keys: pool
--! firing
--! include: due life unconfirmed

KEYS      the shard's keys above, then the dedupe window's current bucket
          (Keys.Seen), which keeps a cancelled message's mark (remember)
ARGV[1]   message ID
ARGV[2]   when that bucket expires (Unix ms; 0: the window is off)
returns   0 unknown; 1 forgotten (parked, claimed ahead and not committed,
          or dead: it will not be published);
          2 in flight, or sent without a confirmation: it may be
          published; 3 an occurrence of a series in
          flight: it may be published, and its series ends with it
          (endseries): nothing of it is published after it
]]

local id = ARGV[1]
local blob = redis.call('HGET', K.pool, id)
if not blob then return 0 end
local score = duescore(id)
if firing(score) or (score ~= false and unconfirmed(id, blob)) then
  if endseries(id, blob) then return 3 end
  return 2
end
unschedule(id)
undead(id, blob)
remember(KEYS[NKEYS + 1], tonumber(ARGV[2]), id, blob)
forget(id, blob, score ~= false)
return 1
