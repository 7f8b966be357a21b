package store

import (
	"context"
	"fmt"
)

// GroupSize counts a group's messages (parked, in flight and dead): one
// ZLEXCOUNT per shard and form of the group (Codec.GroupIndexes), in one
// pipeline.
func (s *Store) GroupSize(ctx context.Context, group string) (int64, error) {
	if group == "" {
		return 0, fmt.Errorf("store.group_size: empty group")
	}
	pipe := s.rdb.Pipeline()
	var cmds []interface{ Val() int64 }
	for _, form := range s.codec.GroupIndexes(group) {
		lo, hi := "["+form+"\x00", "("+form+"\x01"
		for sh := 0; sh < s.shards; sh++ {
			cmds = append(cmds, pipe.ZLexCount(ctx, s.keys.Groups(sh), lo, hi))
		}
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
