--[[ migrateup: converts a shard from layout 1 to layout 2 (Store.MigrateUp):
each message that is not parked leaves its due set for the key of its state
and priority (lib/due2.lua), scored by its time, and the shard gets its marker. A shard
that has it already is left alone. One call per shard, so that no script of
either layout sees it half converted.
--! keys: due inflight ahead slot holding layout
--! include: bulk wire heldkey

returns   how many messages moved out of the due sets
]]

local mark = redis.call('GET', K.layout)
if mark == '2' then return 0 end
if mark and mark ~= '1' then return redis.error_reply('LAYOUT the shard is in layout ' .. mark .. ', which this build does not know') end
local moved = 0
local chunk = 1000
for p = 0, MAXPRIO do
  local key = K.due[p]
  if redis.call('EXISTS', key) == 1 then
    -- held: above every due time, one range
    local hs = redis.call('ZRANGEBYSCORE', key, HOLDBAND, '+inf', 'WITHSCORES')
    local byband, ids = {}, {}
    for i = 1, #hs, 2 do
      local n = tonumber(hs[i + 1])
      local k = math.floor(n / HOLDBAND) - 1
      byband[k] = byband[k] or {}
      local b = byband[k]
      b[#b + 1] = n - bandlow(k)
      b[#b + 1] = hs[i]
      redis.call('HSET', K.holding, hs[i], k .. ':' .. p)
      ids[#ids + 1] = hs[i]
    end
    for k, adds in pairs(byband) do callmany('ZADD', heldkey(k, p), adds) end
    callmany('ZREM', key, ids)
    moved = moved + #ids
    -- leases, claims ahead and slots: a fraction, anywhere below the bands
    local to = {inflight = {}, ahead = {}, slot = {}}
    local gone = {}
    local n = redis.call('ZCARD', key)
    for r = 0, n - 1, chunk do
      local part = redis.call('ZRANGE', key, r, r + chunk - 1, 'WITHSCORES')
      for i = 1, #part, 2 do
        local s = part[i + 1]
        local st
        if leased(s) then st = 'inflight' elseif ahead(s) then st = 'ahead' elseif slotted(s) then st = 'slot' end
        if st then
          local t = to[st]
          t[#t + 1] = math.floor(tonumber(s))
          t[#t + 1] = part[i]
          gone[#gone + 1] = part[i]
        end
      end
    end
    for st, adds in pairs(to) do callmany('ZADD', K[st][p], adds) end
    callmany('ZREM', key, gone)
    moved = moved + #gone
  end
end
redis.call('SET', K.layout, '2')
return moved
