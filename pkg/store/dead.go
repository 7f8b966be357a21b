package store

import (
	"context"
	"fmt"
	"sort"
	"time"
)

// reviveScript schedules a dead message again, due now, with its attempt
// count reset.
// (lua/revive.lua has its KEYS, ARGV and reply.)
var reviveScript = loadScript("revive")

// RetryDead schedules a dead message again, due now. It returns ErrNotFound
// when the ID is not a dead message.
func (s *Store) RetryDead(ctx context.Context, id string) error {
	shard := s.ShardOf(id)
	n, err := s.run(ctx, "revive", reviveScript, shard, id).Int()
	if err != nil {
		return fmt.Errorf("store.retry_dead shard %d: %w", shard, err)
	}
	if n == 0 {
		return ErrNotFound
	}
	return nil
}

// deleteDeadScript deletes a message only if it is dead.
// (lua/deletedead.lua has its KEYS, ARGV and reply.)
var deleteDeadScript = loadScript("deletedead")

// DeleteDead deletes a dead message. It returns ErrNotFound when the ID is
// not a dead message; a parked or in-flight message is left alone.
func (s *Store) DeleteDead(ctx context.Context, id string) error {
	shard := s.ShardOf(id)
	n, err := s.run(ctx, "delete_dead", deleteDeadScript, shard, id).Int()
	if err != nil {
		return fmt.Errorf("store.delete_dead shard %d: %w", shard, err)
	}
	if n == 0 {
		return ErrNotFound
	}
	return nil
}

// listDeadScript reads the newest dead messages of a shard.
// (lua/listdead.lua has its KEYS, ARGV and reply.)
var listDeadScript = loadScript("listdead")

// ListDead returns up to limit dead messages, newest first.
func (s *Store) ListDead(ctx context.Context, limit int) ([]*Info, error) {
	if limit <= 0 {
		limit = 100
	}
	calls := make([]shardCall, s.shards)
	for i := range calls {
		calls[i] = shardCall{shard: i, args: []any{limit}}
	}
	var out []*Info
	for c, cmd := range s.runEach(ctx, "list_dead", listDeadScript, calls) {
		res, err := cmd.Slice()
		if err != nil {
			return nil, fmt.Errorf("store.list_dead shard %d: %w", c, err)
		}
		for i := 0; i+2 < len(res); i += 3 {
			id, _ := toString(res[i])
			info := &Info{ID: id, State: StateDead, Shard: c}
			if m, ok := toString(res[i+1]); ok {
				var deadAt int64
				info.Attempts, deadAt, info.Reason = s.meta(id, m)
				info.DeadAt = time.UnixMilli(deadAt)
			}
			if blob, ok := toString(res[i+2]); ok {
				info.EncodedSize = len(blob)
				s.decodeInto(info, blob)
			}
			out = append(out, info)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].DeadAt.After(out[j].DeadAt) })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// purgeDeadScript deletes up to ARGV[1] dead messages of a shard.
// (lua/purgedead.lua has its KEYS, ARGV and reply.)
var purgeDeadScript = loadScript("purgedead")

// PurgeDead deletes every dead message and returns how many.
func (s *Store) PurgeDead(ctx context.Context) (int, error) {
	total := 0
	for shard := 0; shard < s.shards; shard++ {
		for {
			n, err := s.run(ctx, "purge_dead", purgeDeadScript, shard, 1000).Int()
			if err != nil {
				return total, fmt.Errorf("store.purge_dead shard %d: %w", shard, err)
			}
			total += n
			if n < 1000 {
				break
			}
		}
	}
	return total, nil
}
