--[[ release: moves held messages of a sink back to their due times,
highest priority first and earliest first within one.
--! firing
--! include: due

ARGV[1]   the sink's band index
ARGV[2]   at most this many
returns   how many were moved
]]

local base = bandlow(ARGV[1])
local r = heldof(ARGV[1], tonumber(ARGV[2]))
for i = 1, #r, 3 do move(r[i + 1], r[i], base + r[i + 2], r[i + 2]) end
return #r / 3
