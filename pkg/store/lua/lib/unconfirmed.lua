--[[ unconfirmed: messages a publish of which was sent and never confirmed
(it timed out, or the sink could not tell what became of it), or may have
been (a claim took it over from a lease that ended, lib/fire.lua): the broker
may take it yet, so a cancel or a change meets such a message as one in
flight (cancel.lua, cancelgroup.lua, reschedule.lua). A mark holds the
digest of the message as it was sent, so it stands only while the message
is that version: a replacement, the next occurrence of a series, or a new
message of the ID is not it. It goes with the message (lib/life.lua's
forget, lib/fire.lua's acks).
--! keys: unconfirmed pool
]]

-- unconfirmed reports whether the message id, stored as blob, was sent
-- without a confirmation.
local function unconfirmed(id, blob)
  if not blob then return false end
  local mark = redis.call('HGET', K.unconfirmed, id)
  return mark ~= false and mark == redis.sha1hex(blob)
end

-- carrymark moves the mark of the message id from its stored form old to
-- new, the same message stored anew (re-encrypted).
local function carrymark(id, old, new)
  if unconfirmed(id, old) then redis.call('HSET', K.unconfirmed, id, redis.sha1hex(new)) end
end

-- sentblobs reads the messages of args[from .. to] (IDs) as they are
-- stored before their outcome is written: the versions that were sent.
local function sentblobs(args, from, to)
  local sent = {}
  for i = from, to do
    sent[#sent + 1] = {args[i], redis.call('HGET', K.pool, args[i])}
  end
  return sent
end

-- marksent marks each message of sent (sentblobs) as sent without a
-- confirmation, when it is still that version.
local function marksent(sent)
  for _, s in ipairs(sent) do
    if s[2] and redis.call('HGET', K.pool, s[1]) == s[2] then
      redis.call('HSET', K.unconfirmed, s[1], redis.sha1hex(s[2]))
    end
  end
end
