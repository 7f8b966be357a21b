--[[ ahead: what a claim took ahead of its due time, committed just before
the instant or given back (commit.lua, commitack.lua).
--! include: time due
]]

-- commitahead commits and gives back as args[from..] say (commit.lua has
-- them, from its ARGV[1], and the reply) and returns the reply.
local function commitahead(args, from)
  local nowus = servertimeus()
  local now = math.floor(nowus / 1000)
  local expiry = tonumber(args[from])
  local lead = tonumber(args[from + 1])
  local n = tonumber(args[from + 2])
  local mine = expiry + AHEAD_MARK
  local inflight = fmtscore(expiry, LEASE_MARK)
  local top = maxprio()
  local out = {nowus}
  for i = from + 3, from + 2 + 2 * n, 2 do
    local id, due = args[i], tonumber(args[i + 1])
    local score, p = duescore(id, top)
    local r = 0
    if score and tonumber(score) == expiry + LEASE_MARK then
      r = 1 -- committed already (a commit whose reply was lost, sent again)
    elseif score and tonumber(score) == mine and expiry > now then
      if due * 1000 <= nowus + lead then
        move(p, id, score, inflight)
        r = 1
      else
        r = -1
      end
    end
    out[#out + 1] = r
  end
  local given = 0
  for i = from + 3 + 2 * n, #args, 2 do
    local id = args[i]
    local score, p = duescore(id, top)
    if score and tonumber(score) == mine then
      move(p, id, score, args[i + 1])
      given = given + 1
    end
  end
  out[#out + 1] = given
  return out
end
