--[[ fire: claiming due messages and acking delivered ones, the per-message
path of the scheduler (claim, claimack and ack).
--! keys: pool meta next lease unconfirmed
--! include: time blob bulk meta due group life series tally unconfirmed
]]

-- acklease removes the delivered messages of a lease (the ack script):
-- args[from .. to] are 8 values per message (settle.lua has them); what the
-- dedupe window remembers of them goes into the hash seen (Keys.Seen, the
-- window's current bucket), which expires whole at seenat (Unix ms; 0:
-- the window is off); top is maxprio() as the script began (lib/settle.lua
-- says why once is enough). In layout 1 (KEEPSDONE), when the caller gives
-- them (one per message from KEYS[NKEYS + 2], after seen), the keys Keys.Done of the
-- previous release get the mark too, until seenat: a daemon of that
-- release running beside this one then tells a re-read of a message this
-- one delivered as it tells its own.
--
-- The common message (delivered, not recurring, nothing waiting) is removed
-- with the others at the end, one call per priority and one HDEL per hash
-- for the lease, not three calls each.
local function acklease(expiry, seenat, args, from, to, seen, top)
  if from > to then return 0 end
  local olddone = KEEPSDONE and seenat > 0 and #KEYS >= NKEYS + 1 + (to - from + 1) / 8
  local anynext = redis.call('EXISTS', K.next) == 1
  local anyunconfirmed = redis.call('EXISTS', K.unconfirmed) == 1
  local mine = fmtscore(expiry, LEASE_MARK)
  local n = 0
  local gone, gonesrc, zgone, marks = {}, {}, {}, {}
  local ended = {} -- per source, how many live messages the ack ended
  for i = from, to, 8 do
    local id, group = args[i], args[i + 3]
    local ok, p = claimedby(id, expiry, top)
    if ok then
      if seenat > 0 and args[i + 1] ~= '' then
        marks[#marks + 1] = args[i + 2]
        marks[#marks + 1] = args[i + 1]
        if olddone then
          local k = KEYS[NKEYS + 2 + (i - from) / 8]
          redis.call('SET', k, args[i + 1])
          redis.call('PEXPIREAT', k, seenat)
        end
      end
      local waiting = anynext and redis.call('HGET', K.next, id)
      local ends, after = ending(waiting)
      if waiting and follows(waiting) and args[i + 4] ~= '' then
        -- A new message of a series' ID came while an occurrence was in
        -- flight: the series goes on, and it is one more message of that
        -- ID, as it is while the series is parked (KNOWN), not its end.
        redis.call('HDEL', K.next, id)
        waiting = false
      end
      if ends then
        -- cancelled in flight (endseries): the series ends here, and a
        -- new message of its ID that came after takes its place
        drop(p, id, mine)
        forget(id, redis.call('HGET', K.pool, id), true)
        if after ~= '' then promote(id, after) end
      elseif waiting then
        drop(p, id, mine)
        forget(id, redis.call('HGET', K.pool, id), true)
        promote(id, waiting)
      elseif args[i + 4] ~= '' then
        local nxt = args[i + 6]
        drop(p, id, mine)
        groupdel(group, id)
        redis.call('HDEL', K.meta, id)
        if anyunconfirmed then redis.call('HDEL', K.unconfirmed, id) end
        redis.call('HSET', K.pool, id, nxt)
        put(tonumber(args[i + 5]), id, args[i + 4])
        groupadd(blobinfo(nxt).group, id)
      else
        gone[#gone + 1] = id
        gonesrc[#gonesrc + 1] = args[i + 7]
        ended[args[i + 7]] = (ended[args[i + 7]] or 0) + 1
        zgone[p] = zgone[p] or {}
        zgone[p][#zgone[p] + 1] = id
        groupdel(group, id)
      end
      n = n + 1
    end
  end
  for p, ids in pairs(zgone) do dropmany(p, ids, mine) end
  callmany('HDEL', K.pool, gone)
  callmany('HDEL', K.meta, gone)
  if anyunconfirmed then callmany('HDEL', K.unconfirmed, gone) end
  seriesgone(gone, gonesrc) -- a series that ended
  for src, k in pairs(ended) do live(src, -k) end
  if #marks > 0 then
    callmany('HSET', seen, marks)
    redis.call('PEXPIREAT', seen, seenat)
  end
  return n
end

-- claimdue takes due messages and puts them in flight (the claim script):
-- max messages, for leasems; then, with what is left of max, the messages
-- that fall due within aheadms, claimed ahead (see claim.lua); args[from..]
-- are pairs of a blocked sink and its hold band; acked is returned in the
-- reply (claim.lua has its shape).
local function claimdue(max, leasems, aheadms, args, from, acked)
  local nowus = servertimeus()
  local now = math.floor(nowus / 1000)
  -- a lease is known by its expiry: never the one of a claim before that
  -- took a message (written at the end, only when this one takes one: a
  -- claim that finds nothing writes nothing, so an idle shard's claims
  -- are not written to the AOF)
  local lease = math.max(now + leasems, tonumber(redis.call('GET', K.lease) or 0) + 1)
  local inflight = fmtscore(lease, LEASE_MARK)
  local claimedahead = fmtscore(lease, AHEAD_MARK)
  -- A claim ahead whose lease ended is due again for any instance: at its
  -- expiry, which must come after the due time, or it would fire early.
  aheadms = math.min(aheadms, leasems - 1)
  local left = max
  local holds = left * 4 -- bound of the messages held per call
  local blocked, anyblocked = {}, false
  for i = from, #args, 2 do
    blocked[args[i]] = bandlow(args[i + 1])
    anyblocked = true
  end
  local anymeta = redis.call('EXISTS', K.meta) == 1
  local anyunconfirmed = redis.call('EXISTS', K.unconfirmed) == 1
  local out = {nowus, -1, lease, acked}
  local top = maxprio()
  -- metas is the meta value of each of ids (HMGET, one call for a round),
  -- none when the shard has no meta hash.
  local function metas(ids)
    if anymeta then return hmget(K.meta, ids) end
    return {}
  end
  -- take claims one entry of a due set of priority p (score: its score;
  -- isahead: it falls due after now; mv: its meta value, false when it has
  -- none), or holds it for its blocked sink, adding its move to moves.
  local function take(p, moves, id, score, blob, mv, isahead)
    if blob and leased(score) then
      -- Its lease ended: its claimer may have sent it before, and its
      -- broker may take that copy yet. Until a publish of it is
      -- confirmed, a cancel or a change meets it as one sent without a
      -- confirmation, held or not (lib/unconfirmed.lua). The claim does
      -- not say it was sent: nothing says it was.
      markmaybe(id, blob)
      anyunconfirmed = true
    end
    local band = false
    if anyblocked and blob then
      local info = blobinfo(blob)
      if blocked[info.sink] then band = blocked[info.sink] + info.due end
    end
    if not blob then
      -- a due entry without a message (cannot happen through these scripts)
      drop(p, id, score)
      redis.call('HDEL', K.meta, id)
    elseif band then
      moves[#moves + 1] = score
      moves[#moves + 1] = band
      moves[#moves + 1] = id
      holds = holds - 1
    else
      local a, r = 0, ''
      if mv then
        local ma, _, _, mr = meta(mv)
        a, r = ma, mr
      end
      if leased(score) then
        a = a + 1 -- the claimer of the expired lease never finished it
        setmeta(id, a, 0, p, r)
        anymeta = true
      end
      local wasslotted = 0
      if slotted(score) then wasslotted = math.floor(tonumber(score)) end
      local was = ''
      moves[#moves + 1] = score
      if isahead then
        moves[#moves + 1] = claimedahead
        was = score
      else
        moves[#moves + 1] = inflight
      end
      moves[#moves + 1] = id
      out[#out + 1] = id
      out[#out + 1] = a + 1
      out[#out + 1] = wasslotted
      out[#out + 1] = was
      out[#out + 1] = blob
      out[#out + 1] = (anyunconfirmed and markof(id, blob) == 'sent') and 1 or 0
      left = left - 1
    end
  end
  for p = top, 0, -1 do
    while left > 0 and holds > 0 do
      local asked = left
      local due = claimable(p, now, asked)
      if #due == 0 then break end
      local ids = {}
      for i = 1, #due, 2 do ids[#ids + 1] = due[i] end
      local blobs, mvs = hmget(K.pool, ids), metas(ids)
      -- the new states (lease or hold band) of this round, in one call
      -- before the next round looks for due ones again
      local moves = {}
      for i = 1, #due, 2 do
        local k = (i + 1) / 2
        take(p, moves, due[i], due[i + 1], blobs[k], mvs[k] or false, false)
      end
      movemany(p, moves)
      -- fewer than asked: every due one of this priority was taken or
      -- held, and another look would find none
      if #due / 2 < asked then break end
    end
  end
  -- Ahead: one look per due set at what falls due within aheadms. An entry
  -- there that is in flight, or claimed ahead, is its claimer's until its
  -- lease ends: left alone.
  if aheadms > 0 then
    for p = top, 0, -1 do
      if left <= 0 or holds <= 0 then break end
      local ids, scores = soon(p, now, aheadms, left)
      if #ids > 0 then
        local blobs, mvs = hmget(K.pool, ids), metas(ids)
        local moves = {}
        for i = 1, #ids do take(p, moves, ids[i], scores[i], blobs[i], mvs[i] or false, true) end
        movemany(p, moves)
      end
    end
  end
  if holds <= 0 then
    out[2] = now
  else
    for p = 0, top do
      local s = nextclaim(p, now, aheadms)
      if s ~= -1 and (out[2] == -1 or s < out[2]) then out[2] = s end
    end
  end
  if #out > 4 then redis.call('SET', K.lease, lease) end
  return out
end
