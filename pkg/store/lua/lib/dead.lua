--[[ dead: the dead set and its index by source, for limits.max_dead_messages.
A dead message is a member of dead, scored by its time of death (Unix ms),
and of deadby, whose members "<source>/<time of death, 13 digits>/<ID>"
(every score 0) sort by source, then by time of death: a source's oldest
dead message is the first of its range. The tally's "d:<source>" counts a
source's members of deadby. trimdead (life.lua) reads both; a build
before the index wrote dead entries without one, which trimdead deletes
first.
--! keys: dead deadby
--! include: blob tally
]]

local function deadmember(src, t, id)
  return src .. '/' .. string.format('%013d', tonumber(t)) .. '/' .. id
end
-- deadadd records id, a message of source src, dead at t.
local function deadadd(id, t, src)
  redis.call('ZADD', K.dead, t, id)
  redis.call('ZADD', K.deadby, 0, deadmember(src, t, id))
  tally('d', src, 1)
end
-- undead removes the dead entry of id, whose stored message is blob, and
-- reports whether there was one.
local function undead(id, blob)
  local t = redis.call('ZSCORE', K.dead, id)
  if not t then return false end
  redis.call('ZREM', K.dead, id)
  if blob then
    local src = blobingest(blob)
    if redis.call('ZREM', K.deadby, deadmember(src, t, id)) == 1 then tally('d', src, -1) end
  end
  return true
end
