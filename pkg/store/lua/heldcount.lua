--[[ heldcount: counts a shard's messages held in each hold band given.
--! include: due

ARGV      band indexes
returns   one count per band, in order
]]

local out = {}
for i, b in ipairs(ARGV) do
  local base = bandlow(b)
  local n = 0
  for p = 0, maxprio() do
    n = n + redis.call('ZCOUNT', zkey(p), base, '(' .. (base + HOLDBAND))
  end
  out[i] = n
end
return out
