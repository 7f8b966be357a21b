package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// What the operations of pkg/ops need of the dead messages beyond the
// store's own: a retry that stores a new version of the message, and a
// delete of many in one call per shard.

// retryDeadAsScript schedules a dead message again as a new version.
// (lua/ops_retrydead.lua has its KEYS, ARGV and reply.)
var retryDeadAsScript = loadScript("ops_retrydead")

// ErrOverSeries is RetryDeadAs's answer for a recurring message that would
// be a live series past limits.max_series, which Park answers OverSeries.
var ErrOverSeries = errors.New("store: a new recurring series past limits.max_series")

// ErrOverSourceSeries is the same for its ingest's ingest[].max_series
// (OverSourceSeries).
var ErrOverSourceSeries = errors.New("store: a new recurring series past its ingest's max_series")

// RetryDeadAs schedules the dead message of m's ID again as m (a new
// version: its sink, destination, headers and due time as given), due at
// m.DueAt, with its attempt count reset. It returns ErrNotFound when the ID
// is not a dead message, and ErrOverSeries when m recurs and the store
// holds Options.MaxSeries live series already (the rule Park applies to a
// new series), ErrOverSourceSeries when it holds its source's
// (Options.SourceSeries); nothing changes then.
func (s *Store) RetryDeadAs(ctx context.Context, m *envelope.Message) error {
	shard := s.ShardOf(m.ID)
	quotas, err := s.seriesQuotasFor(ctx, []*envelope.Message{m})
	if err != nil {
		return fmt.Errorf("store.retry_dead_as: %w", err)
	}
	n, err := s.run(ctx, "retry_dead_as", retryDeadAsScript, shard, quotas.storeQuota(shard),
		m.ID, s.encode(m), ms(m.DueAt), min(int(m.Priority), MaxPriority), s.codec.GroupIndex(m.Group), quotas.sourceQuota(shard, m.Ingest)).Int()
	if err != nil {
		return fmt.Errorf("store.retry_dead_as shard %d: %w", shard, err)
	}
	switch n {
	case 0:
		return ErrNotFound
	case int(OverSeries):
		return ErrOverSeries
	case int(OverSourceSeries):
		return ErrOverSourceSeries
	}
	return nil
}

// deleteDeadManyScript deletes the dead messages of a list.
// (lua/ops_deletedead.lua has its KEYS, ARGV and reply.)
var deleteDeadManyScript = loadScript("ops_deletedead")

// DeleteDeadMany deletes the messages of ids that are dead, one script call
// per shard, all in one pipeline, and returns how many it deleted; a message
// that is not dead is left alone.
func (s *Store) DeleteDeadMany(ctx context.Context, ids []string) (int, error) {
	byShard := map[int]int{} // shard -> index in calls
	var calls []shardCall
	for _, id := range ids {
		sh := s.ShardOf(id)
		c, ok := byShard[sh]
		if !ok {
			c = len(calls)
			byShard[sh] = c
			calls = append(calls, shardCall{shard: sh})
		}
		calls[c].args = append(calls[c].args, id)
	}
	if len(calls) == 0 {
		return 0, nil
	}
	total := 0
	for c, cmd := range s.runEach(ctx, "delete_dead_many", deleteDeadManyScript, calls) {
		n, err := cmd.Int()
		if err != nil {
			return total, fmt.Errorf("store.delete_dead_many shard %d: %w", calls[c].shard, err)
		}
		total += n
	}
	return total, nil
}
