--[[ ops_deletedead: deletes the messages of a list that are dead in one
call per shard (a purge with filters: pkg/ops PurgeDead); one that is not
dead (retried, deleted or cancelled meanwhile) is left alone.
--! firing
--! keys: pool
--! include: life

ARGV      message IDs
returns   how many were dead and are deleted
]]

local n = 0
for _, id in ipairs(ARGV) do
  local blob = redis.call('HGET', K.pool, id)
  if undead(id, blob) then
    forget(id, blob, false)
    n = n + 1
  end
end
return n
