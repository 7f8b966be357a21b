--[[ reschedule: gives a scheduled message a new due time, with its new
encoding (whose due time is the new one), unless it changed meanwhile.
--! firing
--! keys: pool
--! include: time due unconfirmed

ARGV[1]   message ID
ARGV[2]   the encoded message the new one was made from
ARGV[3]   the new encoded message
ARGV[4]   the new due time (Unix ms); "now" for the Redis server time
returns   {result, due}: result 1 done, 0 not found (or dead), -1 in flight
          (its lease ended or not), or sent before without a confirmation
          (lib/unconfirmed.lua),
          -2 changed meanwhile (read it again); due: the due time set (Unix ms)
]]

local id = ARGV[1]
local score, p = duescore(id)
if not score then return {0, 0} end
-- In flight its publish may be under way, or have been sent before its
-- lease ended (lib/wire.lua's firing), as one sent without a confirmation.
local blob = redis.call('HGET', K.pool, id)
if firing(score) or unconfirmed(id, blob) then return {-1, 0} end
if blob ~= ARGV[2] then return {-2, 0} end
local due, now = ARGV[4], servertime()
if due == 'now' then due = now else due = tonumber(due) end
-- A held message stays held when its new time has come; one moved later
-- is scheduled (a claim holds it again if its sink is still blocked then).
local s = due
if due <= now then s = bandbase(score) + due end
redis.call('HSET', K.pool, id, ARGV[3])
move(p, id, score, s)
return {1, due}
