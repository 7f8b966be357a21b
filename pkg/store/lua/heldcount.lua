--[[ heldcount: counts a shard's messages held in each hold band given.
--! include: due

ARGV      band indexes
returns   one count per band, in order
]]

local out = {}
for i, b in ipairs(ARGV) do
  out[i] = heldcount(b)
end
return out
