package store

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// parkScript parks messages that are not known yet, and replaces those
// asked to when they are newer.
//
//	KEYS[1..16] -> the shard's keys (Keys.shard); KEYS[16+j] -> the
//	           dedupe key (Keys.Done) of the j-th message
//	ARGV    -> per message 8 values: ID, due time (Unix ms), priority
//	           (0-9), encoded message, replace (1 or 0), group ("" none),
//	           what a delivery of it leaves in its dedupe key (doneMark: its
//	           position in its log, or its content print; "" none),
//	           redelivered (1: the broker says it delivered it before)
//	returns -> one integer per message, a ParkResult: 1 parked; 0 the ID
//	           is known (parked, in flight or dead: a re-read, or one more
//	           message while another waits) and nothing changed; 2 replaced
//	           the parked or dead one; 3 a re-read of the message of that ID
//	           delivered within the dedupe window; 4 waits behind the
//	           version in flight (a replacement, or a new message of that
//	           ID: a follower, see Keys); 5 not newer than the one parked,
//	           which stays
//
// What a re-read is and which version is newer is stated by reread and
// newer (store.go, after envelope.Origin), here and nowhere else.
var parkScript = newScript(`
local out = {}
local j = 0
for i = 1, #ARGV, 8 do
  j = j + 1
  local id, due, prio, blob = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3]
  local group = ARGV[i + 5]
  local done = redis.call('GET', KEYS[16 + j])
  local r = 0
  if done and reread(done, blob, ARGV[i + 6], ARGV[i + 7]) then
    r = 3
  elseif redis.call('HSETNX', KEYS[1], id, blob) == 1 then
    redis.call('ZADD', zkey(prio), due, id)
    groupadd(group, id)
    r = 1
  elseif ARGV[i + 4] == '1' then
    local old = blobinfo(redis.call('HGET', KEYS[1], id))
    local score, p = duescore(id)
    if not newer(blobinfo(blob), old) then
      r = 5
    elseif score and leased(score) then
      redis.call('HSET', KEYS[15], id, blob)
      r = 4
    else
      local band = 0
      if score then
        redis.call('ZREM', zkey(p), id)
        if held(score) then band = math.floor(tonumber(score) / HOLDBAND) * HOLDBAND end
      else
        redis.call('ZREM', KEYS[4], id) -- dead: parked again as the replacement
      end
      groupdel(old.group, id)
      redis.call('HDEL', KEYS[3], id)
      redis.call('HSET', KEYS[1], id, blob)
      redis.call('ZADD', zkey(prio), band + tonumber(due), id)
      groupadd(group, id)
      r = 2
    end
  else
    -- Known: a re-read of the message parked, or, while it is in flight
    -- (delivered, perhaps, and not acked yet), a new message of its ID,
    -- which follows it: parked once that one is delivered.
    local score = duescore(id)
    if score and leased(score) and not sameorigin(blobinfo(blob), blobinfo(redis.call('HGET', KEYS[1], id)))
        and redis.call('HSETNX', KEYS[15], id, FOLLOWS .. blob) == 1 then
      r = 4
    end
  end
  out[#out + 1] = r
end
return out
`)

// ParkResult is what Park did with one message.
type ParkResult int

// Park results.
const (
	Known        ParkResult = 0 // the ID is already parked, in flight or dead: nothing changed (idempotent ingest)
	Parked       ParkResult = 1
	Replaced     ParkResult = 2 // Message.Replace and newer: it replaced the parked (or dead) message
	Duplicate    ParkResult = 3 // a re-read of the message of that ID delivered within the dedupe window (envelope.Origin)
	Queued       ParkResult = 4 // waits behind the version in flight: a newer replacement, parked when that one is done; or a new message of its ID, parked when it is delivered
	NotNewer     ParkResult = 5 // Message.Replace but not newer than the parked one, which stays (envelope.Origin)
	maxParkValue            = NotNewer
)

// Accepted reports whether the message is now in Redis as sent (parked,
// replacing or queued behind the version in flight).
func (r ParkResult) Accepted() bool { return r == Parked || r == Replaced || r == Queued }

func (r ParkResult) String() string {
	switch r {
	case Known:
		return "known"
	case Parked:
		return "parked"
	case Replaced:
		return "replaced"
	case Duplicate:
		return "duplicate"
	case Queued:
		return "queued"
	case NotNewer:
		return "not_newer"
	}
	return "unknown"
}

// Park parks msgs, batching them into one script call per shard, all in one
// pipeline. A message whose ID is already known changes nothing (the
// contract's idempotent ingest), unless it has Replace and is a newer
// version than the known one. A re-read of a message delivered within the
// dedupe window is not parked again; any other message with that ID is
// (envelope.Origin says which is which). On error nothing can be assumed
// about which messages were parked; parking them again is safe.
func (s *Store) Park(ctx context.Context, msgs []*envelope.Message) ([]ParkResult, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	calls, index := s.groupByShard(msgs, func(m *envelope.Message) []any {
		replace, redelivered := 0, 0
		if m.Replace {
			replace = 1
		}
		if m.Redelivered {
			redelivered = 1
		}
		return []any{m.ID, ms(m.DueAt), min(int(m.Priority), MaxPriority), s.encode(m), replace, m.Group, doneMark(m.Origin), redelivered}
	})
	for c := range calls {
		for _, i := range index[c] {
			calls[c].keys = append(calls[c].keys, s.keys.Done(calls[c].shard, msgs[i].ID, msgs[i].Origin.Log))
		}
	}
	cmds := s.runEach(ctx, "park", parkScript, calls)
	res := make([]ParkResult, len(msgs))
	for c, cmd := range cmds {
		vals, err := cmd.Int64Slice()
		if err != nil {
			return nil, fmt.Errorf("store.park shard %d: %w", calls[c].shard, err)
		}
		if len(vals) != len(index[c]) {
			return nil, fmt.Errorf("store.park shard %d: %d results for %d messages", calls[c].shard, len(vals), len(index[c]))
		}
		for j, v := range vals {
			if v < 0 || v > int64(maxParkValue) {
				return nil, fmt.Errorf("store.park shard %d: unexpected result %d", calls[c].shard, v)
			}
			res[index[c][j]] = ParkResult(v)
		}
	}
	return res, nil
}

// doneMark is what the dedupe window remembers of a delivered message, in
// its key (Keys.Done, which names its log): its position in the log, or
// without a log its content print as a signed integer; "" when neither is
// known (a message of the admin API, of core NATS), which nothing can
// re-read. Both are integers, which Redis stores in the key's object.
func doneMark(o envelope.Origin) string {
	switch {
	case o.Log != "":
		return strconv.FormatUint(o.Pos, 10)
	case o.Print != 0:
		return strconv.FormatInt(int64(o.Print), 10)
	}
	return ""
}

// groupByShard builds one call per shard from msgs; index[c][j] is the
// position in msgs of the j-th message of call c.
func (s *Store) groupByShard(msgs []*envelope.Message, args func(*envelope.Message) []any) ([]shardCall, [][]int) {
	pos := make(map[int]int) // shard -> call index
	var calls []shardCall
	var index [][]int
	for i, m := range msgs {
		sh := s.ShardOf(m.ID)
		c, ok := pos[sh]
		if !ok {
			c = len(calls)
			pos[sh] = c
			calls = append(calls, shardCall{shard: sh})
			index = append(index, nil)
		}
		calls[c].args = append(calls[c].args, args(m)...)
		index[c] = append(index[c], i)
	}
	return calls, index
}

// rejectScript keeps rejected messages as dead messages.
//
//	KEYS[1] -> pool, KEYS[3] -> meta, KEYS[4] -> dead (of one shard)
//	ARGV[1] -> dead messages kept per shard
//	ARGV[2..] -> quadruples: message ID, encoded message, reason, priority
//	returns -> one integer per message: 1 kept; 2 kept already (this very
//	           rejection, redelivered by its broker or sent again after a
//	           failed call): nothing changed; 0 the ID is taken by another
//	           message
var rejectScript = newScript(`
local now = servertime()
local out = {}
for i = 2, #ARGV, 4 do
  local id = ARGV[i]
  if redis.call('HSETNX', KEYS[1], id, ARGV[i + 1]) == 1 then
    redis.call('ZADD', KEYS[4], now, id)
    setmeta(id, 0, now, ARGV[i + 3], ARGV[i + 2])
    groupadd(blobinfo(ARGV[i + 1]).group, id)
    out[#out + 1] = 1
  elseif redis.call('ZSCORE', KEYS[4], id) and select(4, meta(redis.call('HGET', KEYS[3], id))) == ARGV[i + 2] then
    out[#out + 1] = 2
  else
    out[#out + 1] = 0
  end
end
trimdead(tonumber(ARGV[1]))
return out
`)

// Rejected is an ingested message that cannot be parked.
type Rejected struct {
	Message *envelope.Message
	Reason  string
}

// Reject keeps messages as dead messages with their reasons. Rejecting the
// same message again (a broker redelivery) keeps one dead message. A message
// whose ID is taken by another is kept under a new ID (envelope.NewID) with
// the original ID named in its reason, so that a bad message never
// overwrites a good one and is never lost. It returns the IDs they were
// kept under; rs is not changed.
func (s *Store) Reject(ctx context.Context, rs []Rejected) ([]string, error) {
	rs = slices.Clone(rs) // renamed entries stay ours
	ids := make([]string, len(rs))
	pending := make([]int, len(rs))
	for i := range rs {
		pending[i] = i
	}
	for attempt := 0; len(pending) > 0; attempt++ {
		if attempt == 3 {
			return nil, fmt.Errorf("store.reject: IDs still taken after %d tries", attempt)
		}
		msgs := make([]*envelope.Message, len(pending))
		for j, i := range pending {
			msgs[j] = rs[i].Message
		}
		reasons := make(map[*envelope.Message]string, len(pending))
		for _, i := range pending {
			reasons[rs[i].Message] = rs[i].Reason
		}
		calls, index := s.groupByShard(msgs, func(m *envelope.Message) []any {
			return []any{m.ID, s.encode(m), reasons[m], min(int(m.Priority), MaxPriority)}
		})
		for c := range calls {
			calls[c].args = append([]any{s.maxDead}, calls[c].args...)
		}
		cmds := s.runEach(ctx, "reject", rejectScript, calls)
		var retry []int
		for c, cmd := range cmds {
			res, err := cmd.Int64Slice()
			if err != nil {
				return nil, fmt.Errorf("store.reject shard %d: %w", calls[c].shard, err)
			}
			for j, v := range res {
				i := pending[index[c][j]]
				if v == 1 || v == 2 {
					ids[i] = rs[i].Message.ID
					continue
				}
				// Keep it under a fresh ID; a copy, so the caller's message is unchanged.
				m := *rs[i].Message
				rs[i].Reason = fmt.Sprintf("%s (its ID %q was already taken)", rs[i].Reason, m.ID)
				m.ID = envelope.NewID()
				rs[i].Message = &m
				retry = append(retry, i)
			}
		}
		pending = retry
	}
	return ids, nil
}
