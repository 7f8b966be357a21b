--[[ blob: the one reader of envelope's stored encoding in Lua.

It reads the routing part every version keeps in clear (pkg/envelope/codec.go
has the layout; B, generated from the Go constants, its version numbers and
bits), to learn a message's due time, publish time, priority, sink,
destination, ingest, origin and group without a round trip. Nothing else in
the scripts reads a blob's bytes.
]]

local function uvar(s, i)
  local v, m = 0, 1
  while true do
    local b = string.byte(s, i)
    i = i + 1
    if b < 128 then return v + b * m, i end
    v = v + (b - 128) * m
    m = m * 128
  end
end
local function svar(s, i)
  local u
  u, i = uvar(s, i)
  if u % 2 == 0 then return u / 2, i end
  return -(u + 1) / 2, i
end
local function bstr(s, i)
  local n
  n, i = uvar(s, i)
  return string.sub(s, i, i + n - 1), i + n
end
-- bit reports whether bit n (from 0) of byte v is set.
local function bit(v, n) return math.floor(v / 2 ^ n) % 2 == 1 end

-- parseblob returns the routing fields of a stored message: due, pub and
-- pubns (its broker publish time in ms and the ns within, 0 when none),
-- prio, sink, dest, ingest, log and pos (its origin), print (its content
-- print as 16 hex digits, '' none), group, recur (whether it recurs). It
-- fails on a version it does not know.
local function parseblob(s)
  local ver, flags, ext, i = string.byte(s, 1), string.byte(s, 2), 0, 3
  if ver == B.V2 or ver == B.V3 then
    ext, i = string.byte(s, 3), 4
  elseif ver ~= B.V1 then
    error('unknown version')
  end
  local r = {pub = 0, pubns = 0, log = '', pos = 0, print = '', group = '', recur = bit(ext, B.EXT_RECUR)}
  local _
  r.due, i = svar(s, i)
  _, i = svar(s, i)
  if bit(ext, B.EXT_PUBLISHED) then
    r.pub, i = svar(s, i)
    r.pub = r.due + r.pub
    if ver == B.V3 then r.pubns, i = uvar(s, i) end
  end
  r.prio = string.byte(s, i)
  r.sink, i = bstr(s, i + 1)
  r.dest, i = bstr(s, i)
  r.ingest, i = bstr(s, i)
  if ver == B.V3 and bit(flags, B.FLAG_SOURCE) then _, i = bstr(s, i) end
  if bit(ext, B.EXT_ORIGIN) then
    r.log, i = bstr(s, i)
    r.pos, i = uvar(s, i)
  end
  if bit(ext, B.EXT_PRINT) then
    r.print = string.format('%02x%02x%02x%02x%02x%02x%02x%02x', string.byte(s, i, i + 7))
    i = i + 8
  end
  if bit(ext, B.EXT_GROUP) then r.group = bstr(s, i) end
  return r
end

-- blobingest is parseblob's ingest alone, read without the rest (the
-- census reads it of every message of a shard); '' when unreadable.
local function blobingest(s)
  local ok, ingest = pcall(function()
    local ver, i = string.byte(s, 1), 3
    if ver == B.V2 or ver == B.V3 then
      i = 4
    elseif ver ~= B.V1 then
      error('unknown version')
    end
    local _
    _, i = svar(s, i)
    _, i = svar(s, i)
    if ver ~= B.V1 and bit(string.byte(s, 3), B.EXT_PUBLISHED) then
      _, i = svar(s, i)
      if ver == B.V3 then _, i = uvar(s, i) end
    end
    _, i = bstr(s, i + 1) -- the priority byte, then the sink
    _, i = bstr(s, i)
    return (bstr(s, i))
  end)
  if ok then return ingest end
  return ''
end

-- recurs reports whether a stored message recurs, from its version and
-- ext byte alone: what every park asks of every message, without the
-- table parseblob builds (it was a tenth of Redis's work per message).
local function recurs(s)
  local ver, ext = string.byte(s, 1), string.byte(s, 3)
  return (ver == B.V2 or ver == B.V3) and ext ~= nil and bit(ext, B.EXT_RECUR)
end

-- blobinfo is parseblob that never fails: an unreadable blob (or none) has
-- no sink and no group (it is never held, and in no group).
local function blobinfo(s)
  if s then
    local ok, info = pcall(parseblob, s)
    if ok then return info end
  end
  return {due = 0, pub = 0, pubns = 0, prio = 0, sink = '', dest = '', ingest = '', log = '', pos = 0, print = '', group = '', recur = false}
end
