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

-- MAYBE begins the mark of a message that may have been sent (markmaybe):
-- a claim took it over from a lease that ended, whose claimer may have sent
-- it or not; the mark of one sent (marksent) is the digest alone.
local MAYBE = 'maybe:'

-- markof reads the mark of the message id stored as blob: 'sent', 'maybe'
-- or false (none, or a mark of another version).
local function markof(id, blob)
  if not blob then return false end
  local mark = redis.call('HGET', K.unconfirmed, id)
  if not mark then return false end
  local digest = redis.sha1hex(blob)
  if mark == digest then return 'sent' end
  if mark == MAYBE .. digest then return 'maybe' end
  return false
end

-- unconfirmed reports whether the message id, stored as blob, was or may
-- have been sent without a confirmation: what a cancel or a change meets
-- as in flight.
local function unconfirmed(id, blob) return markof(id, blob) ~= false end

-- markmaybe marks the message id, stored as blob, as one that may have been
-- sent, unless it is marked as sent already.
local function markmaybe(id, blob)
  if markof(id, blob) ~= 'sent' then redis.call('HSET', K.unconfirmed, id, MAYBE .. redis.sha1hex(blob)) end
end

-- carrymark moves the mark of the message id from its stored form old to
-- new, the same message stored anew (re-encrypted).
local function carrymark(id, old, new)
  local m = markof(id, old)
  if m == 'sent' then redis.call('HSET', K.unconfirmed, id, redis.sha1hex(new)) end
  if m == 'maybe' then redis.call('HSET', K.unconfirmed, id, MAYBE .. redis.sha1hex(new)) end
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
