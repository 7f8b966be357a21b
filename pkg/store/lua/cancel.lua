--[[ cancel: forgets a message, whatever its state.
--! keys: pool dead
--! firing
--! include: due life

ARGV[1]   message ID
returns   0 unknown; 1 forgotten; 2 forgotten in flight, perhaps committed
          ahead of its due instant (the caller answers CommitLead later)
]]

local id = ARGV[1]
local blob = redis.call('HGET', K.pool, id)
if not blob then return 0 end
local score = duescore(id)
unschedule(id)
redis.call('ZREM', K.dead, id)
forget(id, blob)
if score and leased(score) then return 2 end
return 1
