--[[ group: the index of a shard's messages by group (x-delay-group).
--! keys: groups

A member is "<group>\0<message ID>" with score 0, so that a group's
messages are found by range.
]]

local function groupadd(group, id)
  if group ~= '' then redis.call('ZADD', K.groups, 0, group .. '\0' .. id) end
end
local function groupdel(group, id)
  if group ~= '' then redis.call('ZREM', K.groups, group .. '\0' .. id) end
end
