--[[ heldkey: the name of a held set in layout 2 (Keys.HeldAt).
--! keys: held
]]

-- heldkey is the set of the messages of priority p held in hold band k:
-- K.held .. k for priority 0, K.held .. k .. ':p' .. p for p.
local function heldkey(k, p)
  if tonumber(p) == 0 then return K.held .. k end
  return K.held .. k .. ':p' .. p
end
