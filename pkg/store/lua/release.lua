--[[ release: moves held messages of a sink back to their due times,
earliest first.
--! firing
--! include: due

ARGV[1]   the sink's band index
ARGV[2]   at most this many
returns   how many were moved
]]

local left = tonumber(ARGV[2])
for p = maxprio(), 0, -1 do
  if left == 0 then break end
  local r = heldof(ARGV[1], p, left)
  for i = 1, #r, 2 do
    place(p, r[i], r[i + 1])
    left = left - 1
  end
end
return tonumber(ARGV[2]) - left
