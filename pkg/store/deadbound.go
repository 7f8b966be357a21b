package store

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"
)

// TrimDeadPerSource deletes, of each source (an ingest's name; "" the
// admin API) that keeps more than max dead messages across the shards, the
// oldest beyond max (limits.max_dead), and returns how many it deleted.
// It counts each source's run of deadby in every shard in one pipeline
// (ZLEXCOUNT, exact whatever the tally says), and reads only for a source
// over max the heads of its runs (oldest first); the deletes go through
// the delete-dead script, so a message retried or deleted meanwhile is
// left alone. Two instances trimming at once pick the same oldest
// messages. max <= 0: no bound.
func (s *Store) TrimDeadPerSource(ctx context.Context, sources []string, max int) (int, error) {
	if max <= 0 || len(sources) == 0 {
		return 0, nil
	}
	pipe := s.rdb.Pipeline()
	runs := make([][]*redis.IntCmd, len(sources)) // source -> shard -> its count
	for i, src := range sources {
		runs[i] = make([]*redis.IntCmd, s.shards)
		for sh := range s.shards {
			runs[i][sh] = pipe.ZLexCount(ctx, s.keys.DeadBy(sh), "["+src+"/", "("+src+"0") // '0' follows '/'
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return 0, fmt.Errorf("store.trim_dead: count the dead messages: %w", err)
	}
	counts := make([][]int, len(sources)) // source -> shard -> dead
	for i := range sources {
		counts[i] = make([]int, s.shards)
		for sh, c := range runs[i] {
			counts[i][sh] = int(c.Val())
		}
	}
	deleted := 0
	for i, src := range sources {
		excess := -max
		for _, n := range counts[i] {
			excess += n
		}
		if excess <= 0 {
			continue
		}
		ids, err := s.oldestDead(ctx, src, counts[i], excess)
		if err != nil {
			return deleted, err
		}
		n, err := s.DeleteDeadMany(ctx, ids)
		deleted += n
		if err != nil {
			return deleted, err
		}
	}
	return deleted, nil
}

// oldestDead returns the IDs of the n oldest dead messages of src across
// the shards, reading at most n of each shard's run of src in deadby
// ("<source>/<time, 13 digits>/<ID>", lua/lib/dead.lua).
func (s *Store) oldestDead(ctx context.Context, src string, perShard []int, n int) ([]string, error) {
	pipe := s.rdb.Pipeline()
	heads := map[int]*redis.StringSliceCmd{}
	for sh, have := range perShard {
		if have > 0 {
			heads[sh] = pipe.ZRangeByLex(ctx, s.keys.DeadBy(sh), &redis.ZRangeBy{
				Min: "[" + src + "/", Max: "(" + src + "0", Count: int64(min(have, n))}) // '0' follows '/'
		}
	}
	if len(heads) == 0 {
		return nil, nil
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return nil, fmt.Errorf("store.trim_dead: read the oldest of %q: %w", src, err)
	}
	var members []string // "<time>/<ID>", which sort by time
	for sh, cmd := range heads {
		ms, err := cmd.Result()
		if err != nil && err != redis.Nil {
			return nil, fmt.Errorf("store.trim_dead shard %d: %w", sh, err)
		}
		for _, m := range ms {
			members = append(members, strings.TrimPrefix(m, src+"/"))
		}
	}
	slices.Sort(members)
	ids := make([]string, 0, min(n, len(members)))
	for _, m := range members[:min(n, len(members))] {
		if _, id, ok := strings.Cut(m, "/"); ok {
			ids = append(ids, id)
		}
	}
	return ids, nil
}
