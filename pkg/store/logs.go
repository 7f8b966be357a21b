package store

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// FirstLog records created as the creation time of the log named log (a
// JetStream stream) unless one is recorded, and returns the one recorded:
// that of the first log of that name this deployment read. It is kept in
// <prefix>:config, field "log:" and the name, Unix ms.
func (s *Store) FirstLog(ctx context.Context, log string, created time.Time) (time.Time, error) {
	key, field := s.keys.Config(), "log:"+log
	pipe := s.rdb.Pipeline()
	pipe.HSetNX(ctx, key, field, created.UnixMilli())
	got := pipe.HGet(ctx, key, field)
	if _, err := pipe.Exec(ctx); err != nil {
		return time.Time{}, fmt.Errorf("store: record the first log %q in %s: %w", log, key, err)
	}
	ms, err := strconv.ParseInt(got.Val(), 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("store: the first log %q in %s is %q, not Unix ms", log, key, got.Val())
	}
	return time.UnixMilli(ms), nil
}
