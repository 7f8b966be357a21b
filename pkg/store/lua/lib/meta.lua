--[[ meta: a message's attempts, time of death, priority and last error.
--! keys: meta

A meta value is "attempts|deadAt|priority|reason" (parseMeta in Go reads it
too): publish attempts finished (or abandoned by a crashed claimer) before
the current one, the time of death when dead (else 0), the message's
priority (which due set holds it), and the last error or the dead reason.
It exists only once there is something to record, so a message delivered at
its first attempt never has one.
]]

local function meta(v)
  if not v then return 0, 0, 0, '' end
  local a, d, p, r = string.match(v, '^(%d+)|(%d+)|(%d)|(.*)$')
  if not a then return 0, 0, 0, '' end
  return tonumber(a), tonumber(d), tonumber(p), r
end
local function setmeta(id, a, d, p, r)
  redis.call('HSET', K.meta, id, a .. '|' .. d .. '|' .. p .. '|' .. r)
end
