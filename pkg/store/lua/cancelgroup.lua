--[[ cancelgroup: cancels up to ARGV[3] messages of a group in one shard,
leaving those in flight or sent without a confirmation (as cancel does).
--! keys: pool groups
--! firing
--! include: due life unconfirmed

KEYS      the shard's keys above, then the dedupe window's current bucket
          (Keys.Seen), which keeps each cancelled message's mark (remember)
ARGV[1]   the group
ARGV[2]   how many index entries to pass over first (the ones in flight
          that the calls before left)
ARGV[3]   at most this many entries
ARGV[4]   when that bucket expires (Unix ms; 0: the window is off)
returns   {how many were cancelled, how many are in flight and left,
          how many entries were read}
]]

local lo, hi = '[' .. ARGV[1] .. '\0', '(' .. ARGV[1] .. '\1'
local members = redis.call('ZRANGEBYLEX', K.groups, lo, hi, 'LIMIT', tonumber(ARGV[2]), tonumber(ARGV[3]))
local prefix = #ARGV[1] + 2
local cancelled, inflight = 0, 0
for _, m in ipairs(members) do
  local id = string.sub(m, prefix)
  local score = duescore(id)
  local blob = redis.call('HGET', K.pool, id)
  if firing(score) or (score ~= false and unconfirmed(id, blob)) then
    endseries(id, blob)
    inflight = inflight + 1
  else
    unschedule(id)
    undead(id, blob)
    remember(KEYS[NKEYS + 1], tonumber(ARGV[4]), id, blob)
    forget(id, blob, score ~= false)
    redis.call('ZREM', K.groups, m) -- an index entry without its message goes too
    cancelled = cancelled + 1
  end
end
return {cancelled, inflight, #members}
