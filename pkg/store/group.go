package store

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/redis/go-redis/v9"
)

// A group's messages live in every shard (a message's shard follows its
// ID), each shard indexing its own in its groups set, so that parking,
// firing and cancelling a message updates its group in the same script.
// A message is indexed under the group field of its stored form: the group
// itself, or with encryption the group's token under the key that sealed
// it (envelope.Codec.GroupIndex), so that the index does not show the
// group. A group is looked up under every form it may have
// (Codec.GroupIndexes: in clear, and under each configured key).
// Listing or cancelling a group runs one script per shard; a message parked
// into the group on a shard while the group is being cancelled is parked
// either before that shard's script (cancelled) or after (kept, delivered
// in its time), never half-removed.

// groupCancelBatch bounds the messages one cancel script removes.
const groupCancelBatch = 1000

// cancelGroupScript cancels up to ARGV[2] messages of a group in one shard.
// (lua/cancelgroup.lua has its KEYS, ARGV and reply.)
var cancelGroupScript = loadScript("cancelgroup")

// CancelGroup cancels every parked and dead message of a group, and
// returns how many it cancelled and how many it left because they are in
// flight (being published: see Cancel).
func (s *Store) CancelGroup(ctx context.Context, group string) (cancelled, inflight int, err error) {
	if group == "" {
		return 0, 0, fmt.Errorf("store.cancel_group: empty group")
	}
	for _, form := range s.codec.GroupIndexes(group) {
		skip := make(map[int]int, s.shards) // shard -> entries in flight passed over
		pending := make([]int, s.shards)
		for i := range pending {
			pending[i] = i
		}
		for len(pending) > 0 {
			calls := make([]shardCall, len(pending))
			b := s.seen(time.Now())
			for i, sh := range pending {
				calls[i] = shardCall{shard: sh, keys: []string{s.keys.Seen(sh, b.cur)}, args: []any{form, skip[sh], groupCancelBatch, b.expireAt}}
			}
			var again []int
			for i, cmd := range s.runEach(ctx, "cancel_group", cancelGroupScript, calls) {
				res, err := cmd.Int64Slice()
				if err == nil && len(res) != 3 {
					err = fmt.Errorf("unexpected reply of %d items", len(res))
				}
				if err != nil {
					return cancelled, inflight, fmt.Errorf("store.cancel_group shard %d: %w", calls[i].shard, err)
				}
				cancelled += int(res[0])
				inflight += int(res[1])
				skip[calls[i].shard] += int(res[1])
				if res[2] == groupCancelBatch {
					again = append(again, calls[i].shard)
				}
			}
			pending = again
		}
	}
	return cancelled, inflight, nil
}

// GroupMembers returns the IDs of a group's messages, sorted, at most limit
// (0: all).
func (s *Store) GroupMembers(ctx context.Context, group string, limit int) ([]string, error) {
	if group == "" {
		return nil, fmt.Errorf("store.group_members: empty group")
	}
	pipe := s.rdb.Pipeline()
	type forms struct {
		form string
		cmd  interface{ Val() []string }
	}
	var cmds []forms
	for _, form := range s.codec.GroupIndexes(group) {
		lo, hi := "["+form+"\x00", "("+form+"\x01"
		for sh := 0; sh < s.shards; sh++ {
			cmds = append(cmds, forms{form, pipe.ZRangeByLex(ctx, s.keys.Groups(sh), redisRangeBy(lo, hi, limit))})
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("store.group_members: %w", err)
	}
	var ids []string
	for _, c := range cmds {
		for _, m := range c.cmd.Val() {
			ids = append(ids, m[len(c.form)+1:])
		}
	}
	sort.Strings(ids)
	ids = slices.Compact(ids) // indexed in two forms for a moment (reencrypt)
	if limit > 0 && len(ids) > limit {
		ids = ids[:limit]
	}
	return ids, nil
}

func redisRangeBy(min, max string, limit int) *redis.ZRangeBy {
	r := &redis.ZRangeBy{Min: min, Max: max}
	if limit > 0 {
		r.Count = int64(limit)
	}
	return r
}
