--[[ group: the index of a shard's messages by group (x-delay-group).
--! keys: groups pool
--! include: blob

A member is "<group>\0<message ID>" with score 0, so that a group's
messages are found by range. <group> is the group field of the message's
stored form (blobinfo): the group itself, or with encryption its index
token under the key that sealed the message (envelope.Codec.GroupIndex).
]]

local function groupadd(group, id)
  if group ~= '' then redis.call('ZADD', K.groups, 0, group .. '\0' .. id) end
end
-- groupdel takes the message out of its group. A caller that passes the
-- group as the active key indexes it (an ack) may hold another form than
-- the message was indexed under (sealed with an older key, or in clear):
-- then the stored message, still there, says which.
local function groupdel(group, id)
  if group == '' then return end
  if redis.call('ZREM', K.groups, group .. '\0' .. id) == 0 then
    local stored = blobinfo(redis.call('HGET', K.pool, id)).group
    if stored ~= '' and stored ~= group then redis.call('ZREM', K.groups, stored .. '\0' .. id) end
  end
end
