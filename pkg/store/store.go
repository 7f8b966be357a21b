// Package store keeps parked messages in Redis: per shard a pool hash and a
// sorted set by due time (the "Version 1.0" layout, see keys.go), moved
// atomically by Lua scripts that each touch one shard, so the same code runs
// on a single Redis and on Redis Cluster.
//
// Life of a message in a shard:
//
//	park ──> due (score = due time) ──claim──> in flight (score = lease expiry)
//	                  ^                          │  │  │
//	                  └──── retry (back-off) ────┘  │  └──dead──> dead set
//	                                   ack: removed ┘
//
// A lease that expires makes the message due again for any instance, so a
// crashed daemon's claims are recovered without a coordinator. Ack, Retry
// and MarkDead act only on messages still held under the Lease that Claim
// returned (identified by its expiry), so an instance that lost its lease
// cannot undo the work of the instance that took the message over.
package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// ErrNotFound is returned for an ID that is neither parked nor dead.
var ErrNotFound = errors.New("store: message not found")

// ErrShardMismatch is returned by CheckShards when Redis holds messages
// parked under another shard count.
var ErrShardMismatch = errors.New("store: shard count differs from the one recorded in Redis")

// Store is the Redis side of delaybridge. It is safe for concurrent use.
type Store struct {
	rdb       redis.UniversalClient
	keys      Keys
	shardKeys [][]string // the KEYS of every shard's scripts, built once
	shards    int
	maxDead   int // dead messages kept per shard
	dedupe    time.Duration
	noFlags   bool // the Redis cannot read script flags (before 7.0, miniredis)
	observe   func(op string, d time.Duration, err error)
	codec     envelope.Codec
	cursor    cursorCache // the deployment's cursor key (browse.go)
}

// Options configure a Store.
type Options struct {
	Prefix string // key prefix, e.g. "delaybridge"
	Shards int    // number of shards, e.g. 16

	// DedupeWindow is how long a delivered message's ID is remembered, so
	// that a re-read of it is not parked again (scheduler.dedupe_window);
	// 0 remembers nothing.
	DedupeWindow time.Duration

	// MaxDead is the number of dead messages kept, spread over the shards
	// (ceil(MaxDead/Shards) each); beyond it the oldest of a shard are
	// deleted. 0 keeps them all.
	MaxDead int

	// Observe, when set, is called after every script with its name,
	// duration and error (for metrics).
	Observe func(op string, d time.Duration, err error)

	// Sealer, when set, encrypts every message stored from now on (pkg/seal's
	// Keyring) and opens sealed ones; messages stored in clear still read.
	// Without it a sealed message cannot be read: Claimed.Err and Info.Err
	// say why.
	Sealer envelope.Sealer
	// RequireSealed refuses messages found in clear (envelope.Codec).
	RequireSealed bool

	// NoScriptFlags is for a Redis that cannot read Lua script flags (Redis
	// before 7.0, and miniredis in `delaybridge dev`): the firing scripts run
	// without allow-oom, so at maxmemory firing stops with ingest. See
	// ScriptFlagsSupported.
	NoScriptFlags bool
}

// New returns a Store on rdb (a *redis.Client or *redis.ClusterClient).
//
// Options carry no defaults of their own (config.ApplyDefaults has them):
// New panics when Prefix is empty or Shards is not positive.
func New(rdb redis.UniversalClient, o Options) *Store {
	if o.Shards <= 0 || o.Prefix == "" {
		panic(fmt.Sprintf("store.New: Options.Prefix (%q) and Options.Shards (%d) are required", o.Prefix, o.Shards))
	}
	perShard := math.MaxInt32 // MaxDead 0: keep every dead message
	if o.MaxDead > 0 {
		perShard = (o.MaxDead + o.Shards - 1) / o.Shards
	}
	s := &Store{rdb: rdb, keys: NewKeys(o.Prefix), shards: o.Shards, maxDead: perShard, dedupe: o.DedupeWindow, observe: o.Observe,
		codec: envelope.Codec{Sealer: o.Sealer, RequireSealed: o.RequireSealed}, noFlags: o.NoScriptFlags}
	s.shardKeys = make([][]string, o.Shards)
	for i := range s.shardKeys {
		s.shardKeys[i] = s.keys.shard(i)
	}
	return s
}

// ScriptFlagsSupported reports whether rdb runs scripts with a
// "#!lua flags=" line (Redis 7.0 and later).
func ScriptFlagsSupported(ctx context.Context, rdb redis.UniversalClient) bool {
	return rdb.Eval(ctx, "#!lua flags=allow-oom\nreturn 1", nil).Err() == nil
}

// Shards returns the shard count.
func (s *Store) Shards() int { return s.shards }

// Keys returns the key builder.
func (s *Store) Keys() Keys { return s.keys }

// ShardOf returns the shard of a message ID.
func (s *Store) ShardOf(id string) int { return ShardOf(id, s.shards) }

// Client returns the Redis client.
func (s *Store) Client() redis.UniversalClient { return s.rdb }

// CheckShards records the shard count in Redis on first start and refuses
// to run with another one, which would strand every parked message in shards
// nobody reads.
func (s *Store) CheckShards(ctx context.Context) error {
	key := s.keys.Config()
	if err := s.rdb.HSetNX(ctx, key, "shards", s.shards).Err(); err != nil {
		return fmt.Errorf("store: record shard count in %s: %w", key, err)
	}
	v, err := s.rdb.HGet(ctx, key, "shards").Result()
	if err != nil {
		return fmt.Errorf("store: read shard count from %s: %w", key, err)
	}
	if v != strconv.Itoa(s.shards) {
		return fmt.Errorf("%w: redis.shards is %d but %s says %s; set redis.shards: %s (or use another redis.key_prefix)",
			ErrShardMismatch, s.shards, key, v, v)
	}
	return nil
}

// Ping checks the connection.
func (s *Store) Ping(ctx context.Context) error { return s.rdb.Ping(ctx).Err() }

// luaMeta is prepended to every script.
//
// A message in flight is in its due set with the lease expiry plus half a
// millisecond as its score: due times are whole milliseconds, so the .5 marks
// a claim, and the lease expiry in ms identifies the claim (Lease.ExpiryMs).
// A meta value is "attempts|deadAt|priority|reason": publish attempts
// finished (or abandoned by a crashed claimer) before the current one, the
// time of death when dead (else 0), the message's priority (which due set
// holds it), and the last error or the dead reason; it exists only once there
// is something to record, so a message delivered at its first attempt never
// has one. zkey(p) is the due set of priority p; the scripts get every shard
// key (see Keys.shard).
const luaMeta = `
local function meta(v)
  if not v then return 0, 0, 0, '' end
  local a, d, p, r = string.match(v, '^(%d+)|(%d+)|(%d)|(.*)$')
  if not a then return 0, 0, 0, '' end
  return tonumber(a), tonumber(d), tonumber(p), r
end
local function setmeta(id, a, d, p, r)
  redis.call('HSET', KEYS[3], id, a .. '|' .. d .. '|' .. p .. '|' .. r)
end
local function zkey(p)
  if p == 0 then return KEYS[2] end
  return KEYS[4 + p]
end
-- maxprio is the highest priority whose due set exists, 0 when only the
-- default set may hold messages: one EXISTS instead of a lookup per set
-- for the common case of no priorities in use.
local function maxprio()
  if redis.call('EXISTS', unpack(KEYS, 5, 13)) == 0 then return 0 end
  return 9
end
local function servertime()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- servertimeus is servertime in microseconds.
local function servertimeus()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- blob parsing: the routing part of envelope's stored encoding (versions 1
-- to 3, see pkg/envelope/codec.go), read here to learn a message's due
-- time, publish time, priority, sink, origin and group without a round
-- trip.
local function uvar(s, i)
  local v, m = 0, 1
  while true do
    local b = string.byte(s, i)
    i = i + 1
    if b < 128 then return v + b * m, i end
    v = v + (b - 128) * m
    m = m * 128
  end
end
local function svar(s, i)
  local u
  u, i = uvar(s, i)
  if u % 2 == 0 then return u / 2, i end
  return -(u + 1) / 2, i
end
local function bstr(s, i)
  local n
  n, i = uvar(s, i)
  return string.sub(s, i, i + n - 1), i + n
end
local function bit(v, n) return math.floor(v / 2 ^ n) % 2 == 1 end
local function parseblob(s)
  local ver, ext, i = string.byte(s, 1), 0, 3
  if ver == 2 or ver == 3 then ext, i = string.byte(s, 3), 4 elseif ver ~= 1 then error('unknown version') end
  local due, pub, pubns, _ = 0, 0, 0
  due, i = svar(s, i)
  _, i = svar(s, i)
  if bit(ext, 0) then
    pub, i = svar(s, i)
    pub = due + pub
    if ver == 3 then pubns, i = uvar(s, i) end
  end
  local prio = string.byte(s, i)
  local sink, group, log, pos
  sink, i = bstr(s, i + 1)
  _, i = bstr(s, i)
  _, i = bstr(s, i)
  if ver == 3 and bit(string.byte(s, 2), 4) then _, i = bstr(s, i) end -- source
  log, pos = '', 0
  if bit(ext, 5) then
    log, i = bstr(s, i)
    pos, i = uvar(s, i)
  end
  local cprint = ''
  if bit(ext, 7) then
    cprint = string.format('%02x%02x%02x%02x%02x%02x%02x%02x', string.byte(s, i, i + 7))
    i = i + 8
  end
  group = ''
  if bit(ext, 1) then group = bstr(s, i) end
  return {due = due, pub = pub, pubns = pubns, prio = prio, sink = sink, group = group, log = log, pos = pos, print = cprint}
end
-- blobinfo is parseblob that never fails: an unreadable blob has no sink
-- and no group (it is never held, and in no group).
local function blobinfo(s)
  if s then
    local ok, info = pcall(parseblob, s)
    if ok then return info end
  end
  return {due = 0, pub = 0, pubns = 0, prio = 0, sink = '', group = '', log = '', pos = 0, print = ''}
end
-- reread reports whether a message (its blob; mark, its position in its
-- log or its content print, '' none; redelivered '1' when its broker says
-- so) is a re-read of the delivered message that done remembers, from the
-- key of the same ID and log (Keys.Done): with a log, at the same or an
-- earlier position (a log is read in order, so that position was read
-- before); without one, redelivered with the same content. Any other
-- message is new (envelope.Origin).
local function reread(done, blob, mark, redelivered)
  if mark == '' then return false end
  if blobinfo(blob).log ~= '' then return tonumber(mark) <= tonumber(done) end
  return redelivered == '1' and mark == done
end
-- newer reports whether version a is newer than version b (blobinfo of
-- each): the later of one log; else the later broker publish time, when
-- both have one and they differ; else a, the one parked later
-- (envelope.Origin).
local function newer(a, b)
  if a.log ~= '' and a.log == b.log then return a.pos > b.pos end
  if a.pub > 0 and b.pub > 0 and (a.pub ~= b.pub or a.pubns ~= b.pubns) then
    return a.pub > b.pub or (a.pub == b.pub and a.pubns > b.pubns)
  end
  return true
end
local function groupadd(group, id)
  if group ~= '' then redis.call('ZADD', KEYS[14], 0, group .. '\0' .. id) end
end
local function groupdel(group, id)
  if group ~= '' then redis.call('ZREM', KEYS[14], group .. '\0' .. id) end
end
-- callmany calls a command of one key with the values of list as its
-- further arguments, at most 1000 at a time (unpack's stack bound is 8000):
-- one call for many members of a set or fields of a hash. list holds whole
-- groups of an even count (ZADD's score, member pairs).
local function callmany(cmd, key, list)
  for i = 1, #list, 1000 do
    redis.call(cmd, key, unpack(list, i, math.min(i + 999, #list)))
  end
end
-- hmget is HMGET of a hash for many fields, in order; false for a field the
-- hash does not have.
local function hmget(key, fields)
  local out = {}
  for i = 1, #fields, 1000 do
    local part = redis.call('HMGET', key, unpack(fields, i, math.min(i + 999, #fields)))
    for k = 1, #part do out[#out + 1] = part[k] end
  end
  return out
end
-- HOLDBAND is the width of a sink's hold band (Keys): a held message's
-- score is HOLDBAND * (1 + the sink's index) + its due time.
local HOLDBAND = 4398046511104
local function held(score) return tonumber(score) >= HOLDBAND end
-- forget deletes everything of a message but its dead entry, which the
-- callers handle.
local function forget(id, blob)
  redis.call('HDEL', KEYS[1], id)
  redis.call('HDEL', KEYS[3], id)
  redis.call('HDEL', KEYS[15], id)
  groupdel(blobinfo(blob).group, id)
end
local function trimdead(max)
  local n = redis.call('ZCARD', KEYS[4])
  if n <= max then return end
  local old = redis.call('ZRANGE', KEYS[4], 0, n - max - 1)
  for _, id in ipairs(old) do forget(id, redis.call('HGET', KEYS[1], id)) end
  redis.call('ZREMRANGEBYRANK', KEYS[4], 0, n - max - 1)
end
-- unschedule removes an ID from whichever due set holds it.
local function unschedule(id)
  for p = 0, maxprio() do redis.call('ZREM', zkey(p), id) end
end
-- duescore returns the score and priority of an ID in the due sets of
-- priorities 0..top (top defaults to maxprio()).
local function duescore(id, top)
  for p = 0, top or maxprio() do
    local s = redis.call('ZSCORE', zkey(p), id)
    if s then return s, p end
  end
  return false, 0
end
-- leased reports whether a due-set score is a lease expiry: leases end in
-- .5, due times are whole milliseconds (rate slots end in .25).
local function leased(score)
  return tonumber(score) % 1 == 0.5
end
-- claimedby reports whether an ID is still in flight under the lease that
-- ends at expiry (ms), and its priority.
local function claimedby(id, expiry, top)
  local s, p = duescore(id, top)
  return s ~= false and tonumber(s) == expiry + 0.5, p
end
-- FOLLOWS marks a value of next (KEYS[15]) that is not a replacement of
-- the version in flight but a new message of its ID that came while it was
-- in flight (Keys.Next): it waits for that version's ack or death, not for
-- a retry, which keeps the version in flight.
local FOLLOWS = 'F'
local function follows(waiting)
  return string.sub(waiting, 1, 1) == FOLLOWS
end
-- sameorigin reports whether two messages (blobinfo) were read from the
-- same place: the same log position, or without a log the same content
-- print (a re-read of the one, not a new message).
local function sameorigin(a, b)
  if a.log ~= '' then return a.log == b.log and a.pos == b.pos end
  return a.print ~= '' and a.print == b.print
end
-- promote parks what waited in next for the version in flight, which the
-- caller forgot: a replacement, or a follower (FOLLOWS and the blob).
local function promote(id, blob)
  if follows(blob) then blob = string.sub(blob, 2) end
  local info = blobinfo(blob)
  redis.call('HSET', KEYS[1], id, blob)
  redis.call('ZADD', zkey(info.prio), info.due, id)
  groupadd(info.group, id)
end
-- acklease removes the delivered messages of a lease (ackScript): args[from
-- .. to] are 6 values per message, the dedupe keys are KEYS[keybase + j].
--
-- The common message (delivered, not recurring, nothing waiting) is removed
-- with the others at the end, one ZREM per due set and one HDEL per hash
-- for the lease, not three calls each.
local function acklease(expiry, window, args, from, to, keybase)
  local top = maxprio()
  local anynext = redis.call('EXISTS', KEYS[15]) == 1
  local n, j = 0, 0
  local gone, zgone = {}, {}
  for i = from, to, 6 do
    j = j + 1
    local id, group = args[i], args[i + 2]
    local ok, p = claimedby(id, expiry, top)
    if ok then
      if window > 0 and args[i + 1] ~= '' then
        redis.call('SET', KEYS[keybase + j], args[i + 1], 'PX', window)
      end
      local waiting = anynext and redis.call('HGET', KEYS[15], id)
      if waiting then
        redis.call('ZREM', zkey(p), id)
        forget(id, redis.call('HGET', KEYS[1], id))
        promote(id, waiting)
      elseif args[i + 3] ~= '' then
        local nxt = args[i + 5]
        redis.call('ZREM', zkey(p), id)
        groupdel(group, id)
        redis.call('HDEL', KEYS[3], id)
        redis.call('HSET', KEYS[1], id, nxt)
        redis.call('ZADD', zkey(tonumber(args[i + 4])), args[i + 3], id)
        groupadd(blobinfo(nxt).group, id)
      else
        gone[#gone + 1] = id
        zgone[p] = zgone[p] or {}
        zgone[p][#zgone[p] + 1] = id
        groupdel(group, id)
      end
      n = n + 1
    end
  end
  for p, ids in pairs(zgone) do callmany('ZREM', zkey(p), ids) end
  callmany('HDEL', KEYS[1], gone)
  callmany('HDEL', KEYS[3], gone)
  return n
end
-- claimdue takes due messages and puts them in flight (claimScript):
-- max messages, for leasems; args[from..] are pairs of a blocked sink and
-- its hold band; acked is returned in the reply.
local function claimdue(max, leasems, args, from, acked)
  local nowus = servertimeus()
  local now = math.floor(nowus / 1000)
  -- a lease is known by its expiry: never the one of the claim before
  local lease = math.max(now + leasems, tonumber(redis.call('GET', KEYS[16]) or 0) + 1)
  redis.call('SET', KEYS[16], lease)
  local score = string.format('%d.5', lease)
  local left = max
  local holds = left * 4 -- bound of the messages held per call
  local blocked, anyblocked = {}, false
  for i = from, #args, 2 do
    blocked[args[i]] = HOLDBAND * (1 + tonumber(args[i + 1]))
    anyblocked = true
  end
  local anymeta = redis.call('EXISTS', KEYS[3]) == 1
  local out = {nowus, -1, lease, acked}
  local top = maxprio()
  for p = top, 0, -1 do
    local key = zkey(p)
    while left > 0 and holds > 0 do
      local due = redis.call('ZRANGEBYSCORE', key, '-inf', now, 'WITHSCORES', 'LIMIT', 0, left)
      if #due == 0 then break end
      local ids = {}
      for i = 1, #due, 2 do ids[#ids + 1] = due[i] end
      local blobs = hmget(KEYS[1], ids)
      -- the new scores (lease or hold band) of this round, in one ZADD
      -- before the next round looks for due ones again
      local adds = {}
      for i = 1, #due, 2 do
        local id = due[i]
        local blob = blobs[(i + 1) / 2]
        local band = false
        if anyblocked and blob then
          local info = blobinfo(blob)
          if blocked[info.sink] then band = blocked[info.sink] + info.due end
        end
        if not blob then
          -- a due entry without a message (cannot happen through these scripts)
          redis.call('ZREM', key, id)
          redis.call('HDEL', KEYS[3], id)
        elseif band then
          adds[#adds + 1] = band
          adds[#adds + 1] = id
          holds = holds - 1
        else
          local a, r = 0, ''
          if anymeta then
            local ma, _, _, mr = meta(redis.call('HGET', KEYS[3], id))
            a, r = ma, mr
          end
          if leased(due[i + 1]) then
            a = a + 1 -- the claimer of the expired lease never finished it
            setmeta(id, a, 0, p, r)
            anymeta = true
          end
          local slotted = 0
          if tonumber(due[i + 1]) % 1 == 0.25 then slotted = 1 end
          adds[#adds + 1] = score
          adds[#adds + 1] = id
          out[#out + 1] = id
          out[#out + 1] = a + 1
          out[#out + 1] = slotted
          out[#out + 1] = blob
          left = left - 1
        end
      end
      callmany('ZADD', key, adds)
    end
  end
  if holds <= 0 then
    out[2] = now
  else
    for p = 0, top do
      local first = redis.call('ZRANGE', zkey(p), 0, 0, 'WITHSCORES')
      if first[2] and not held(first[2]) then
        local s = math.ceil(tonumber(first[2])) -- a lease x.5 is claimable from x+1
        if out[2] == -1 or s < out[2] then out[2] = s end
      end
    end
  end
  return out
end
-- claimedattempts is claimedby plus the attempts recorded before this claim.
local function claimedattempts(id, expiry, top)
  local ok, p = claimedby(id, expiry, top)
  if not ok then return false end
  return true, p, (meta(redis.call('HGET', KEYS[3], id)))
end
`

// luaChunk is one definition of luaMeta (a local function or constant, with
// the comment above it) and the names it defines and uses.
type luaChunk struct {
	name string
	text string
}

// luaChunks are luaMeta's definitions in order.
var luaChunks = splitLua(luaMeta)

var luaDef = regexp.MustCompile(`^local (?:function )?([a-zA-Z_][a-zA-Z0-9_]*)`)

// splitLua splits luaMeta at its top-level definitions; a comment block
// belongs to the definition below it.
func splitLua(src string) []luaChunk {
	var chunks []luaChunk
	var pending strings.Builder // comment lines waiting for their definition
	for _, line := range strings.SplitAfter(strings.TrimPrefix(src, "\n"), "\n") {
		switch m := luaDef.FindStringSubmatch(line); {
		case m != nil:
			chunks = append(chunks, luaChunk{name: m[1], text: pending.String() + line})
			pending.Reset()
		case strings.HasPrefix(line, "--"):
			pending.WriteString(line)
		case len(chunks) > 0:
			chunks[len(chunks)-1].text += line
		}
	}
	return chunks
}

// prelude returns the definitions of luaMeta that src uses, directly or
// through others, in luaMeta's order: every script runs its prelude on
// every call (Redis runs the whole chunk), so a script carries only what it
// needs.
func prelude(src string) string {
	need := map[string]bool{}
	uses := func(text, name string) bool {
		return regexp.MustCompile(`\b` + name + `\b`).MatchString(text)
	}
	for changed := true; changed; {
		changed = false
		for _, c := range luaChunks {
			if need[c.name] {
				continue
			}
			if uses(src, c.name) {
				need[c.name], changed = true, true
				continue
			}
			for _, d := range luaChunks {
				if need[d.name] && d.name != c.name && uses(strings.TrimPrefix(d.text, commentOf(d.text)), c.name) {
					need[c.name], changed = true, true
					break
				}
			}
		}
	}
	var b strings.Builder
	b.WriteString("\n")
	for _, c := range luaChunks {
		if need[c.name] {
			b.WriteString(c.text)
		}
	}
	return b.String()
}

// commentOf returns the leading comment lines of a chunk.
func commentOf(text string) string {
	end := 0
	for _, line := range strings.SplitAfter(text, "\n") {
		if !strings.HasPrefix(line, "--") {
			break
		}
		end += len(line)
	}
	return text[:end]
}

// script is a Lua script in two forms: with flags for Redis 7 and without
// for a Redis that cannot read them (the same script when it has none).
type script struct{ flagged, plain *redis.Script }

func newScript(src string) script {
	sc := redis.NewScript(prelude(src) + src)
	return script{sc, sc}
}

// newFiringScript is newScript for the scripts that fire messages and record
// their outcome. They may run when Redis is at maxmemory with noeviction
// (allow-oom): they write little (a lease, a meta value) and acks free
// memory, so firing goes on and makes room; parks and rejects stay refused,
// which pauses ingest instead.
func newFiringScript(src string) script {
	pre := prelude(src)
	return script{redis.NewScript("#!lua flags=allow-oom\n" + pre + src), redis.NewScript(pre + src)}
}

// pick returns the form of sc this Store's Redis runs.
func (s *Store) pick(sc script) *redis.Script {
	if s.noFlags {
		return sc.plain
	}
	return sc.flagged
}

// run executes a script on one shard. Every script gets every key of the
// shard: KEYS[1] pool, KEYS[2] due, KEYS[3] meta, KEYS[4] dead, KEYS[5..13]
// the due sets of priorities 1..9.
func (s *Store) run(ctx context.Context, op string, scr script, shard int, args ...any) *redis.Cmd {
	return s.runKeys(ctx, op, scr, shard, nil, args...)
}

// runKeys is run with more keys after the shard's (from KEYS[17]).
func (s *Store) runKeys(ctx context.Context, op string, scr script, shard int, extra []string, args ...any) *redis.Cmd {
	start := time.Now()
	cmd := s.pick(scr).Run(ctx, s.rdb, s.keysOf(shard, extra), args...)
	if s.observe != nil {
		s.observe(op, time.Since(start), ignoreNil(cmd.Err()))
	}
	return cmd
}

type shardCall struct {
	shard int
	keys  []string // more keys after the shard's, from KEYS[17]
	args  []any
}

// keysOf returns the KEYS of a script call on shard.
func (s *Store) keysOf(shard int, extra []string) []string {
	if len(extra) == 0 {
		return s.shardKeys[shard]
	}
	return append(slices.Clip(s.shardKeys[shard]), extra...)
}

// runEach runs one script per call in a single pipeline (one round trip on
// a single Redis; one per node on a cluster). A call that hit NOSCRIPT (a
// restarted or flushed Redis) is run again with the script's source.
func (s *Store) runEach(ctx context.Context, op string, scr script, calls []shardCall) []*redis.Cmd {
	start := time.Now()
	sc := s.pick(scr)
	cmds := make([]*redis.Cmd, len(calls))
	if len(calls) == 1 {
		cmds[0] = sc.Run(ctx, s.rdb, s.keysOf(calls[0].shard, calls[0].keys), calls[0].args...)
	} else {
		pipe := s.rdb.Pipeline()
		for i, c := range calls {
			cmds[i] = sc.EvalSha(ctx, pipe, s.keysOf(c.shard, c.keys), c.args...)
		}
		_, _ = pipe.Exec(ctx) // errors are read per command below
		for i, c := range calls {
			if err := cmds[i].Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
				cmds[i] = sc.Run(ctx, s.rdb, s.keysOf(c.shard, c.keys), c.args...)
			}
		}
	}
	if s.observe != nil {
		var err error
		for _, c := range cmds {
			if e := ignoreNil(c.Err()); e != nil {
				err = e
				break
			}
		}
		s.observe(op, time.Since(start), err)
	}
	return cmds
}

func ignoreNil(err error) error {
	if errors.Is(err, redis.Nil) {
		return nil
	}
	return err
}

// parseMeta decodes a meta value (see luaMeta).
func parseMeta(v string) (attempts int, deadAt int64, reason string) {
	p := strings.SplitN(v, "|", 4)
	if len(p) != 4 {
		return 0, 0, ""
	}
	attempts, _ = strconv.Atoi(p[0])
	deadAt, _ = strconv.ParseInt(p[1], 10, 64)
	return attempts, deadAt, p[3]
}

// ms converts a time to Unix milliseconds.
func ms(t time.Time) int64 { return t.UnixMilli() }

func toInt64(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

func toString(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case []byte:
		return string(x), true
	}
	return "", false
}

// encode is the store's codec's Encode (sealed when it has a Sealer) into a
// fresh buffer.
func (s *Store) encode(m *envelope.Message) []byte {
	return s.codec.Encode(make([]byte, 0, envelope.EncodedSize(m)), m)
}

// decode is the store's codec's DecodeString: the blob as Redis answered it.
func (s *Store) decode(id string, blob string) (*envelope.Message, error) {
	return s.codec.DecodeString(id, blob)
}

// ClockOffset measures Redis's clock minus this process's: what to add to
// time.Now() to read the clock every instance shares (the due times and the
// claims are in Redis time). It assumes the TIME reply is taken halfway
// through the round trip; the error is at most half of it.
func (s *Store) ClockOffset(ctx context.Context) (time.Duration, error) {
	before := time.Now()
	t, err := s.rdb.Time(ctx).Result()
	after := time.Now()
	if err != nil {
		return 0, fmt.Errorf("store.clock_offset: %w", err)
	}
	return t.Sub(before.Add(after.Sub(before) / 2)), nil
}
