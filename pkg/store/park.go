package store

import (
	"context"
	"fmt"
	"slices"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// parkScript parks messages that are not known yet.
//
//	KEYS[1] -> pool hash, KEYS[2] and KEYS[5..13] -> due sets (of one shard)
//	ARGV    -> quadruples: message ID, due time (Unix ms), priority (0-9),
//	           encoded message
//	returns -> one integer per message: 1 parked, 0 the ID is already known
//	           (parked, in flight or dead) and nothing was changed
var parkScript = newScript(`
local out = {}
for i = 1, #ARGV, 4 do
  if redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 3]) == 1 then
    redis.call('ZADD', zkey(tonumber(ARGV[i + 2])), ARGV[i + 1], ARGV[i])
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
`)

// Park parks msgs, batching them into one script call per shard, all in one
// pipeline. parked[i] is false when msgs[i]'s ID was already known (the
// contract's idempotent ingest). On error nothing can be assumed about
// which messages were parked; parking them again is safe.
func (s *Store) Park(ctx context.Context, msgs []*envelope.Message) (parked []bool, err error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	calls, index := s.groupByShard(msgs, func(m *envelope.Message) []any {
		return []any{m.ID, ms(m.DueAt), min(int(m.Priority), MaxPriority), s.encode(m)}
	})
	cmds := s.runEach(ctx, "park", parkScript, calls)
	parked = make([]bool, len(msgs))
	for c, cmd := range cmds {
		res, err := cmd.Int64Slice()
		if err != nil {
			return nil, fmt.Errorf("store.park shard %d: %w", calls[c].shard, err)
		}
		if len(res) != len(index[c]) {
			return nil, fmt.Errorf("store.park shard %d: %d results for %d messages", calls[c].shard, len(res), len(index[c]))
		}
		for j, v := range res {
			parked[index[c][j]] = v == 1
		}
	}
	return parked, nil
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
