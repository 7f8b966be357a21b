package store

import (
	"context"
	"fmt"
	"time"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// ackScript removes delivered messages: forgets them, or parks their next
// occurrence (recurring), or the replacement that waited for them.
// (lua/ack.lua has its KEYS, ARGV and reply.)
var ackScript = loadScript("ack")

// ackArgs are ackScript's arguments and extra keys for ds of lease l.
func (s *Store) ackArgs(l *Lease, ds []Done) ([]any, []string) {
	args := make([]any, 0, 8*len(ds)+2)
	b := s.seen(time.Now())
	args = append(args, l.ExpiryMs, b.expireAt)
	for _, d := range ds {
		mark := ""
		if d.Origin.Log != "" { // without a log, park left the mark (AcksConfirmed)
			mark = doneMark(d.Origin)
		}
		// The group as the active key indexes it; a message indexed in
		// another form (sealed with an older key, or in clear) is taken out
		// of the index by its stored form (groupdel).
		group := s.codec.GroupIndex(d.Group)
		field := SeenField(d.ID, d.Origin.Log)
		if d.Next != nil {
			args = append(args, d.ID, mark, field, group, ms(d.Next.DueAt), min(int(d.Next.Priority), MaxPriority), s.encode(d.Next), d.Source)
		} else {
			args = append(args, d.ID, mark, field, group, "", "", "", d.Source)
		}
	}
	return args, []string{s.keys.Seen(l.Shard, b.cur)}
}

// Done is a message a sink confirmed, for Ack.
type Done struct {
	ID     string
	Origin envelope.Origin // where it was read, remembered for the dedupe window (zero: a skipped occurrence, or nothing to remember)
	Group  string          // its group (x-delay-group), to take it out of the group's index
	Source string          // its ingest (envelope.Message.Ingest; "" the admin API), whose count it leaves
	// Next is the next occurrence of a recurring message, parked in the
	// same step; nil when the message does not recur or its series ended.
	Next *envelope.Message
}

// Ack removes messages the sink confirmed (and parks the next occurrence of
// the recurring ones). It returns how many were still held under the lease.
func (s *Store) Ack(ctx context.Context, l *Lease, ds []Done) (int, error) {
	if len(ds) == 0 {
		return 0, nil
	}
	args, keys := s.ackArgs(l, ds)
	n, err := s.runKeys(ctx, "ack", ackScript, l.Shard, keys, args...).Int()
	if err != nil {
		return 0, fmt.Errorf("store.ack shard %d: %w", l.Shard, err)
	}
	return n, nil
}

// retryScript puts messages whose publish failed back in the due set.
// (lua/retry.lua has its KEYS, ARGV and reply.)
var retryScript = loadScript("retry")

// RetryAt is a message of a lease to publish again at At (Redis's clock).
type RetryAt struct {
	ID     string
	At     time.Time
	Reason string // the error of the failed attempt
}

// Retry reschedules messages of a lease.
func (s *Store) Retry(ctx context.Context, l *Lease, rs []RetryAt) (int, error) {
	if len(rs) == 0 {
		return 0, nil
	}
	args := make([]any, 0, 3*len(rs)+1)
	args = append(args, l.ExpiryMs)
	for _, r := range rs {
		args = append(args, r.ID, ms(r.At), s.codec.SealReason(r.ID, r.Reason))
	}
	n, err := s.run(ctx, "retry", retryScript, l.Shard, args...).Int()
	if err != nil {
		return 0, fmt.Errorf("store.retry shard %d: %w", l.Shard, err)
	}
	return n, nil
}

// deadScript moves messages of a lease to the dead set.
// (lua/dead.lua has its KEYS, ARGV and reply.)
var deadScript = loadScript("dead")

// Failure is a message of a lease that is given up on, and why.
type Failure struct {
	ID     string
	Reason string
}

// MarkDead moves messages of a lease to the dead set with their reasons.
func (s *Store) MarkDead(ctx context.Context, l *Lease, fs []Failure) (int, error) {
	if len(fs) == 0 {
		return 0, nil
	}
	args := make([]any, 0, 2*len(fs)+2)
	args = append(args, l.ExpiryMs, s.maxDead)
	for _, f := range fs {
		args = append(args, f.ID, s.codec.SealReason(f.ID, f.Reason))
	}
	n, err := s.run(ctx, "dead", deadScript, l.Shard, args...).Int()
	if err != nil {
		return 0, fmt.Errorf("store.dead shard %d: %w", l.Shard, err)
	}
	return n, nil
}

// Postpone puts messages of a lease back, due at their times, without
// counting the attempt: a destination that did not answer while its sink
// confirmed others (the scheduler's stall), for the first times in a row.
func (s *Store) Postpone(ctx context.Context, l *Lease, rs []RetryAt) (int, error) {
	if len(rs) == 0 {
		return 0, nil
	}
	pairs := make([]any, 0, 2*len(rs))
	for _, r := range rs {
		pairs = append(pairs, r.ID, ms(r.At))
	}
	return s.putBack(ctx, "postpone", l, pairs)
}
