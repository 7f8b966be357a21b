package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrInFlight is returned for a change to a message that is being published.
var ErrInFlight = errors.New("store: message is in flight")

// ErrDueAtMismatch is returned by Reschedule when the message's due time is
// not the one the caller expected (if_due_at).
var ErrDueAtMismatch = errors.New("store: due time is not the expected one")

// rescheduleScript gives a scheduled message a new due time, with its new
// encoding (whose due time is the new one), unless it changed meanwhile.
// (lua/reschedule.lua has its KEYS, ARGV and reply.)
var rescheduleScript = loadScript("reschedule")

// Reschedule moves a scheduled message to due (now when due is zero: fire
// it now), and returns the due time set. With ifDueAt non-zero it only does
// so when the message's due time is ifDueAt (ErrDueAtMismatch otherwise). It
// returns ErrNotFound for an unknown or dead message, ErrInFlight for one
// being published (after its due instant: CommitLead). A message held for
// its sink stays held when its new time has come; one moved later is
// scheduled until then.
func (s *Store) Reschedule(ctx context.Context, id string, due, ifDueAt time.Time) (time.Time, error) {
	if err := s.refused(); err != nil { // before the read that may say "not found"
		return time.Time{}, fmt.Errorf("store.reschedule: %w", err)
	}
	shard := s.ShardOf(id)
	for range 10 { // a message changed between the read and the write: read again
		blob, err := s.rdb.HGet(ctx, s.keys.Pool(shard), id).Result()
		if err != nil {
			if errors.Is(err, redis.Nil) {
				return time.Time{}, ErrNotFound
			}
			return time.Time{}, fmt.Errorf("store.reschedule shard %d: %w", shard, err)
		}
		m, err := s.decode(id, blob)
		if err != nil {
			return time.Time{}, fmt.Errorf("store.reschedule %q: %w", id, err)
		}
		if !ifDueAt.IsZero() && !m.DueAt.Equal(ifDueAt.Truncate(time.Millisecond)) {
			return m.DueAt, ErrDueAtMismatch
		}
		dueArg := any("now")
		m.DueAt = due
		if due.IsZero() {
			if now, err := s.rdb.Time(ctx).Result(); err == nil {
				m.DueAt = now.Truncate(time.Millisecond) // in the blob; the score is the server's time
			}
		} else {
			dueArg = ms(due)
		}
		res, err := s.run(ctx, "reschedule", rescheduleScript, shard, id, blob, s.encode(m), dueArg).Int64Slice()
		if err != nil {
			return time.Time{}, fmt.Errorf("store.reschedule shard %d: %w", shard, err)
		}
		if len(res) != 2 {
			return time.Time{}, fmt.Errorf("store.reschedule shard %d: unexpected reply of %d items", shard, len(res))
		}
		switch res[0] {
		case 1:
			return time.UnixMilli(res[1]), nil
		case 0:
			return time.Time{}, ErrNotFound
		case -1:
			if err := s.afterCommitLead(ctx); err != nil {
				return time.Time{}, err
			}
			return time.Time{}, ErrInFlight
		}
	}
	return time.Time{}, fmt.Errorf("store.reschedule %q: the message kept changing; try again", id)
}

// Fire makes a scheduled message due now.
func (s *Store) Fire(ctx context.Context, id string) error {
	_, err := s.Reschedule(ctx, id, time.Time{}, time.Time{})
	return err
}
