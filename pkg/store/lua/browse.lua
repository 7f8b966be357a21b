--[[ browse: returns the next entries of one shard in browse order.
--! keys: pool dead groups
--! include: blob due order

ARGV[1] -> mode: "parked" (the due sets) or "dead" (the dead set)
ARGV[2] -> 1 with a cursor, else 0
ARGV[3], ARGV[4] -> the cursor's position time (ms, may have a
           fraction) and ID
ARGV[5], ARGV[6] -> the position range: lowest (inclusive) and bound
           (exclusive), "" for none
ARGV[7] -> how many hold bands are in use
ARGV[8] -> at most this many entries returned
ARGV[9] -> at most this many entries examined (0: no bound)
ARGV[10] -> state: "" any, "scheduled", "held", "inflight"
ARGV[11..14] -> sink, destination, ingest, group ("" any; the group as
           indexed, Codec.GroupIndexes' first form)
ARGV[15] -> "1": recurring messages only
ARGV[16] -> browseGroupIndexMax
ARGV[17..] -> the group's other forms (its token under each key)
returns -> {why, frontier time, frontier ID, examined, then per entry:
           position time, ID, state}; why is "done" when the shard has
           nothing more after the entries, else "limit" or "scan" (the
           bound it stopped at) and every entry up to the frontier was
           examined; state s scheduled, h held, i in flight, d dead.
           Times are strings with every digit ("%.17g").
]]

local mode = ARGV[1]
local hascur = ARGV[2] == '1'
local ck, cid = tonumber(ARGV[3]), ARGV[4]
local lo, hi = -math.huge, math.huge
if ARGV[5] ~= '' then lo = tonumber(ARGV[5]) end
if ARGV[6] ~= '' then hi = tonumber(ARGV[6]) end
local bands = tonumber(ARGV[7])
local limit, scan = tonumber(ARGV[8]), tonumber(ARGV[9])
local fstate = ARGV[10]
local fsink, fdest, fingest, fgroup = ARGV[11], ARGV[12], ARGV[13], ARGV[14]
local frecur = ARGV[15] == '1'
local groupmax = tonumber(ARGV[16])
local fgroups = {} -- every form of the group, as stored in the blob and the index
if fgroup ~= '' then
  fgroups[#fgroups + 1] = fgroup
  for i = 17, #ARGV do fgroups[#fgroups + 1] = ARGV[i] end
end
local ingroup = {}
for _, g in ipairs(fgroups) do ingroup[g] = true end
local needblob = fsink ~= '' or fdest ~= '' or fingest ~= '' or fgroup ~= '' or frecur

local function before(k1, i1, k2, i2)
  if k1 ~= k2 then return k1 < k2 end
  return idlt(i1, i2)
end
local function state(e)
  if mode == 'dead' then return 'd' end
  if e.held then return 'h' end
  if firing(e.score) then return 'i' end
  return 's'
end
local function keep(e, st)
  if fstate == 'inflight' and st ~= 'i' then return false end
  if fstate == 'scheduled' and st ~= 's' then return false end
  if fstate == 'held' and st ~= 'h' then return false end
  if not needblob then return true end
  local blob = redis.call('HGET', K.pool, e.id)
  if not blob then return false end
  local ok, r = pcall(parseblob, blob)
  if not ok then return false end
  return (fsink == '' or r.sink == fsink) and (fdest == '' or r.dest == fdest) and
    (fingest == '' or r.ingest == fingest) and (fgroup == '' or ingroup[r.group]) and
    (not frecur or r.recur)
end

local out = {'', '', '', 0}
local examined, n = 0, 0
local lastk, lastid
local function take(e)
  examined = examined + 1
  local st = state(e)
  if keep(e, st) then
    out[#out + 1] = fmt(e.k)
    out[#out + 1] = e.id
    out[#out + 1] = st
    n = n + 1
  end
  lastk, lastid = e.k, e.id
end
local function finish(why)
  out[1] = why
  if why ~= 'done' then out[2], out[3] = fmt(lastk), lastid end
  out[4] = examined
  return out
end

-- The group's index, when the shard holds few enough of its messages:
-- every one is looked at, sorted, and the page taken from them.
local function grange(g) return '[' .. g .. '\0', '(' .. g .. '\1' end
local ingroupindex = 0
for _, g in ipairs(fgroups) do
  local glo, ghi = grange(g)
  ingroupindex = ingroupindex + redis.call('ZLEXCOUNT', K.groups, glo, ghi)
end
if fgroup ~= '' and ingroupindex <= groupmax then
  local cands = {}
  local top = maxprio()
  local seen = {} -- an ID indexed in two forms for a moment (reencrypt) is listed once
  for _, g in ipairs(fgroups) do
    local glo, ghi = grange(g)
    for _, m in ipairs(redis.call('ZRANGEBYLEX', K.groups, glo, ghi)) do
      local id = string.sub(m, #g + 2)
      local score
      if seen[id] then score = false
      elseif mode == 'dead' then score = redis.call('ZSCORE', K.dead, id) else score = duescore(id, top) end
      seen[id] = true
      if score then
        score = tonumber(score)
        local base = 0
        if mode ~= 'dead' then base = bandbase(score) end
        local k = score - base
        if k >= lo and k < hi and (not hascur or before(ck, cid, k, id)) then
          cands[#cands + 1] = {id = id, score = score, k = k, held = base > 0}
        end
      end
    end
  end
  table.sort(cands, function(a, b) return before(a.k, a.id, b.k, b.id) end)
  for _, e in ipairs(cands) do
    take(e)
    if n >= limit then return finish('limit') end
  end
  return finish('done')
end

local streams = {}
-- stream adds the entries of key whose score minus base is in [lo, hi)
-- and below top, after the cursor.
local function stream(key, base, top, held)
  local low, high = base + lo, base + math.min(hi, top)
  if held and low < base then low = base end
  local stop
  if high == math.huge then stop = redis.call('ZCARD', key) else stop = redis.call('ZCOUNT', key, '-inf', '(' .. fmt(high)) end
  local rank
  if hascur and base + ck >= low then
    rank = after(key, base + ck, cid)
  elseif low == -math.huge then
    rank = 0
  else
    rank = redis.call('ZCOUNT', key, '-inf', '(' .. fmt(low))
  end
  if rank < stop then
    streams[#streams + 1] = {key = key, base = base, held = held, rank = rank, stop = stop, buf = {}, pos = 1}
  end
end
if mode == 'dead' then
  stream(K.dead, 0, math.huge, false)
else
  -- A state filter walks the sets that can hold that state only: a held
  -- backlog costs a listing of scheduled messages nothing, and the other
  -- way round (a message in flight is in a set that is not held).
  for _, sp in ipairs(spans(bands)) do
    if fstate == '' or sp.held == (fstate == 'held') then stream(sp.key, sp.off, sp.top, sp.held) end
  end
end
local chunk = math.max(16, math.min(limit, 256))
local function head(st)
  if st.pos > #st.buf then
    if st.rank >= st.stop then return nil end
    local last = math.min(st.rank + chunk, st.stop) - 1
    local r = redis.call('ZRANGE', st.key, st.rank, last, 'WITHSCORES')
    st.buf, st.pos, st.rank = {}, 1, last + 1
    for i = 1, #r, 2 do
      local k = tonumber(r[i + 1]) - st.base
      -- the score on the wire (held aside: e.held says it)
      st.buf[#st.buf + 1] = {id = r[i], score = k, k = k, held = st.held}
    end
    if #st.buf == 0 then
      st.rank = st.stop
      return nil
    end
  end
  return st.buf[st.pos]
end
while true do
  local best, from
  for _, st in ipairs(streams) do
    local h = head(st)
    if h and (not best or before(h.k, h.id, best.k, best.id)) then best, from = h, st end
  end
  if not best then return finish('done') end
  if scan > 0 and examined >= scan then return finish('scan') end
  from.pos = from.pos + 1
  take(best)
  if n >= limit then return finish('limit') end
end
