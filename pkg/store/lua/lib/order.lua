--[[ order: positions in a sorted set by (score, ID), the order Redis keeps:
a walk that goes on across calls from the last (score, ID) it saw, so that
entries taken out or put in before that point meanwhile move nothing.
]]

-- idlt is the byte-wise order of IDs, as a sorted set orders equal scores
-- (Lua's own string comparison follows the server's locale).
local function idlt(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end
-- fmt writes a score with every digit, and the infinities as Redis reads
-- them.
local function fmt(x)
  if x == math.huge then return '+inf' end
  if x == -math.huge then return '-inf' end
  return string.format('%.17g', x)
end
-- after returns the rank of the first entry of key after (score, id): the
-- scores below score, then a binary search among the entries scored score.
local function after(key, score, id)
  local s = fmt(score)
  local r = redis.call('ZCOUNT', key, '-inf', '(' .. s)
  local e = r + redis.call('ZCOUNT', key, s, s)
  while r < e do
    local mid = math.floor((r + e) / 2)
    local m = redis.call('ZRANGE', key, mid, mid)[1]
    if idlt(id, m) then e = mid else r = mid + 1 end
  end
  return r
end
