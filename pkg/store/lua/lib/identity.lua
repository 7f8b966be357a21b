--[[ identity: what a re-read is, which version is newer, what follows.
--! include: blob

The rules of envelope.Origin ("Identity and order" of the contract), stated
here once; every path that parks a message goes through the park script.
]]

-- reread reports whether a message (its blob; mark, its position in its
-- log or its content print, '' none; redelivered '1' when its broker says
-- so) is a re-read of the message that done remembers, from the key of the
-- same ID and log (Keys.Done): with a log, the delivered message's
-- position, and a re-read is at the same or an earlier one (a log is read
-- in order, so that position was read before); without one (AMQP), the
-- content of a delivery parked whose ack the broker has not been seen to
-- process, and a re-read is redelivered with that content. Any other
-- message is new.
local function reread(done, blob, mark, redelivered)
  if mark == '' then return false end
  if blobinfo(blob).log ~= '' then return tonumber(mark) <= tonumber(done) end
  return redelivered == '1' and mark == done
end
-- newer reports whether version a is newer than version b (blobinfo of
-- each): the later of one log; else the later broker publish time, when
-- both have one and they differ; else a, the one parked later.
local function newer(a, b)
  if a.log ~= '' and a.log == b.log then return a.pos > b.pos end
  if a.pub > 0 and b.pub > 0 and (a.pub ~= b.pub or a.pubns ~= b.pubns) then
    return a.pub > b.pub or (a.pub == b.pub and a.pubns > b.pubns)
  end
  return true
end
-- readbefore reports whether message a (blobinfo; redelivered '1' when
-- its broker says so) was read before b or is b read again, so that it is
-- no new message of b's ID: from b's log at b's position or an earlier one
-- (a log is read in order). Without a log, marked says whether the dedupe
-- window keeps marks (reread has then decided already: a is new); without
-- marks, a redelivery with b's content print is taken for b read again.
local function readbefore(a, b, redelivered, marked)
  if a.log ~= '' then return a.log == b.log and a.pos <= b.pos end
  return not marked and redelivered == '1' and a.print ~= '' and a.print == b.print
end
-- follows reports whether a value of next (Keys.Next) is a follower, a new
-- message of the ID that came while its version was in flight (FOLLOWS and
-- the blob), not a replacement: it waits for that version's ack or death,
-- not for a retry, which keeps the version in flight.
local function follows(waiting)
  return string.sub(waiting, 1, #FOLLOWS) == FOLLOWS
end
