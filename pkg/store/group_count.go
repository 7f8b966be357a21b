package store

import (
	"context"
	"fmt"
)

// GroupSize counts a group's messages (parked, in flight and dead): one
// ZLEXCOUNT per shard, in one pipeline.
func (s *Store) GroupSize(ctx context.Context, group string) (int64, error) {
	if group == "" {
		return 0, fmt.Errorf("store.group_size: empty group")
	}
	lo, hi := "["+group+"\x00", "("+group+"\x01"
	pipe := s.rdb.Pipeline()
	cmds := make([]interface{ Val() int64 }, s.shards)
	for sh := 0; sh < s.shards; sh++ {
		cmds[sh] = pipe.ZLexCount(ctx, s.keys.Groups(sh), lo, hi)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("store.group_size: %w", err)
	}
	var n int64
	for _, c := range cmds {
		n += c.Val()
	}
	return n, nil
}
