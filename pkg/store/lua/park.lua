--[[ park: parks messages that are not known yet, and replaces those asked
to when they are newer. Run by Store.Park for the ingest and the admin
API; an import writes exported records with their state through
import.lua instead.
--! keys: pool meta dead next series
--! function
--! include: blob bulk due group identity life series tally time

KEYS    the shard's keys above, then the dedupe window's buckets (Keys.Seen):
        the current one (written), the one before and the one after (read
        too: instances' clocks differ), then per message the done key an
        earlier build wrote (Keys.Done, read only)
ARGV[1] the most live series the shard may hold under limits.max_series
        (-1: no bound; Go counts the other shards', seriesbound.go)
ARGV[2] 1: a replacement of the version in flight waits behind it
        (QUEUED); 0: it is not written (FIRING): that version may be
        committed ahead of its due instant (commit.lua), and the caller
        parks the replacement again CommitLead later, after the instant
ARGV[3] when the current bucket expires (Unix ms; 0: the dedupe window,
        scheduler.dedupe_window, is off)
ARGV[4..] per message 12 values: ID, due time (Unix ms), priority (0-9),
        encoded message, replace (1 or 0), group ('' none), its mark
        (doneMark: its position in its log, or without a log its content
        print; '' none), redelivered (1: its broker says it delivered it
        before), its field in the buckets (seenField), its source (the
        ingest's name, '' the admin API: the stored message's), the most
        live series of that source the shard may hold under its
        ingest[].max_series (-1: no bound), and 1
        when it has no log (its mark is left here, not at its ack; the
        encoded message says the same, and Go says it so that no blob is
        read for it)
returns one ParkResult (R) per message: PARKED; KNOWN, the ID is known
        (parked, in flight or dead: a re-read, or one more message while
        another waits) and nothing changed; REPLACED the parked or dead one;
        DUPLICATE, a re-read of the message of that ID delivered within the
        dedupe window; QUEUED, waits behind the version in flight (a
        replacement, or a new message of that ID: a follower, Keys.Next);
        NOTNEWER than the one parked, which stays; OVERSERIES, a new
        recurring series past limits.max_series; OVERSOURCE, the same past
        its source's ingest[].max_series;
        FIRING (ARGV[2]); IDTAKEN, the ID is known as a message of another
        source (an ingest, or the admin API): nothing changed

What a re-read is and which version is newer is stated by reread and
newer (lib/identity.lua), here and nowhere else. A message without a log
(AMQP) leaves its mark in the current bucket here, at park: until the
broker is seen to process its ack (Store.AcksConfirmed deletes the mark) or
the window ends, a redelivery of it is a re-read; a delivery of another
with the same content after that is new.
]]

local quota = tonumber(ARGV[1])
local queue = ARGV[2] == '1'
local seenat = tonumber(ARGV[3])
local cur, prev, nxt = KEYS[NKEYS + 1], KEYS[NKEYS + 2], KEYS[NKEYS + 3]
local out, marks = {}, {}
local added = {} -- per source, the live messages parked (one count per source at the end)
local function add(src) added[src] = (added[src] or 0) + 1 end
-- The bucket after the current one holds marks only while an instance's
-- clock is ahead into it (rarely, briefly): looked at once, not per message.
local nxtthere = seenat > 0 and redis.call('EXISTS', nxt) == 1
local j = 0
for i = 4, #ARGV, 12 do
  j = j + 1
  local id, due, prio, blob = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3]
  local group, field, src, srcquota = ARGV[i + 5], ARGV[i + 8], ARGV[i + 9], tonumber(ARGV[i + 10])
  local done = false
  if seenat > 0 and ARGV[i + 6] ~= '' then
    done = redis.call('HGET', cur, field) or redis.call('HGET', prev, field)
      or (nxtthere and redis.call('HGET', nxt, field)) or redis.call('GET', KEYS[NKEYS + 3 + j])
  end
  local dup = done and reread(done, blob, ARGV[i + 6], ARGV[i + 7])
  local over = not dup and (quota >= 0 or srcquota >= 0) and recurs(blob) and redis.call('HEXISTS', K.pool, id) == 0
    and overseries(quota, id, true, src, srcquota)
  local r = R.KNOWN
  if dup then
    r = R.DUPLICATE
  elseif over == 'max_series' then
    r = R.OVERSERIES
  elseif over then
    r = R.OVERSOURCE
  elseif redis.call('HSETNX', K.pool, id, blob) == 1 then
    put(prio, id, due)
    groupadd(group, id)
    if recurs(blob) then joinseries(id, src) end
    add(src)
    r = R.PARKED
  elseif blobinfo(redis.call('HGET', K.pool, id)).ingest ~= src then
    r = R.IDTAKEN -- another source's: neither a re-read of it nor its to replace
  elseif ARGV[i + 4] == '1' then
    local old = blobinfo(redis.call('HGET', K.pool, id))
    local score, p = duescore(id)
    if not newer(blobinfo(blob), old) then
      r = R.NOTNEWER
    elseif score and leased(score) and not queue then
      r = R.FIRING
    elseif score and leased(score) then
      -- it waits behind the version in flight, unless a newer one waits
      -- there already (a redelivery of an older replacement, read after it)
      local waiting = redis.call('HGET', K.next, id)
      if waiting and not ending(waiting) and not follows(waiting) and not newer(blobinfo(blob), blobinfo(waiting)) then
        r = R.NOTNEWER
      else
        redis.call('HSET', K.next, id, blob)
        r = R.QUEUED
      end
    else
      local band = 0
      if score then
        drop(p, id, score)
        -- A held message's replacement stays held when it is due, for the
        -- same sink; one due later, or for another sink, is scheduled (a
        -- claim holds it again if its sink is still blocked then).
        if held(score) and old.sink == blobinfo(blob).sink and tonumber(due) <= servertime() then band = bandbase(score) end
      else
        undead(id, redis.call('HGET', K.pool, id)) -- dead: parked again as the replacement
        add(src)
      end
      groupdel(old.group, id)
      redis.call('HDEL', K.meta, id)
      redis.call('HDEL', K.next, id) -- a mark left by a cancel in flight (endseries): the replacement is its own
      redis.call('HSET', K.pool, id, blob)
      put(prio, id, band + tonumber(due))
      groupadd(group, id)
      series(id, blobinfo(blob))
      r = R.REPLACED
    end
  else
    -- Known: a re-read of the message parked, or, while it is in flight
    -- (delivered, perhaps, and not acked yet), a new message of its ID
    -- (not one read before it), which follows it: parked once that one is
    -- delivered.
    local score = duescore(id)
    if score and leased(score) and not readbefore(blobinfo(blob), blobinfo(redis.call('HGET', K.pool, id)), ARGV[i + 7], seenat > 0) then
      if redis.call('HSETNX', K.next, id, FOLLOWS .. blob) == 1 then
        r = R.QUEUED
      elseif redis.call('HGET', K.next, id) == ENDS then
        -- its series ends with the occurrence in flight: it follows that
        redis.call('HSET', K.next, id, ENDS .. FOLLOWS .. blob)
        r = R.QUEUED
      end
    end
  end
  if seenat > 0 and ARGV[i + 6] ~= '' and r ~= R.OVERSERIES and r ~= R.OVERSOURCE and ARGV[i + 11] == '1' then
    marks[#marks + 1] = field
    marks[#marks + 1] = ARGV[i + 6]
  end
  out[#out + 1] = r
end
for src, n in pairs(added) do live(src, n) end
if #marks > 0 then
  callmany('HSET', cur, marks)
  redis.call('PEXPIREAT', cur, seenat)
end
return out
