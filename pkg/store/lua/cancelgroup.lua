--[[ cancelgroup: cancels up to ARGV[2] messages of a group in one shard.
--! keys: pool dead groups
--! firing
--! include: due life

ARGV[1]   the group
ARGV[2]   at most this many
returns   {how many were cancelled, 1 if one was in flight (perhaps
          committed ahead of its due instant: the caller answers CommitLead
          later) or 0}
]]

local lo, hi = '[' .. ARGV[1] .. '\0', '(' .. ARGV[1] .. '\1'
local members = redis.call('ZRANGEBYLEX', K.groups, lo, hi, 'LIMIT', 0, tonumber(ARGV[2]))
local prefix = #ARGV[1] + 2
local inflight = 0
for _, m in ipairs(members) do
  local id = string.sub(m, prefix)
  local score = duescore(id)
  if score and leased(score) then inflight = 1 end
  unschedule(id)
  redis.call('ZREM', K.dead, id)
  forget(id, redis.call('HGET', K.pool, id))
  redis.call('ZREM', K.groups, m) -- an index entry without its message goes too
end
return {#members, inflight}
