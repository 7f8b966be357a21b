package store

import (
	"context"
	"time"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// ackArgs are the arguments and extra keys of the acks ds of lease l, for
// lua/settle.lua and lua/claimack.lua (lua/lib/fire.lua's acklease).
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
	keys := []string{s.keys.Seen(l.Shard, b.cur)}
	if s.dedupe > 0 && s.layouts[l.Shard].Load() == Layout1 {
		// The previous release, which may run beside this build in
		// layout 1, reads these (acklease, lua/lib/fire.lua).
		for _, d := range ds {
			keys = append(keys, s.keys.Done(l.Shard, d.ID, d.Origin.Log))
		}
	}
	return args, keys
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
// the recurring ones): Settle with Done alone. It returns how many were
// still held under the lease.
func (s *Store) Ack(ctx context.Context, l *Lease, ds []Done) (int, error) {
	r, err := s.settleOne(ctx, Settlement{Lease: l, Done: ds})
	return r.Acked, err
}

// RetryAt is a message of a lease to publish again at At (Redis's clock).
type RetryAt struct {
	ID     string
	At     time.Time
	Reason string // the error of the failed attempt
}

// Retry reschedules messages of a lease: Settle with Retry alone.
func (s *Store) Retry(ctx context.Context, l *Lease, rs []RetryAt) (int, error) {
	r, err := s.settleOne(ctx, Settlement{Lease: l, Retry: rs})
	return r.Retried, err
}

// Failure is a message of a lease that is given up on, and why.
type Failure struct {
	ID     string
	Reason string
}

// MarkDead moves messages of a lease to the dead set with their reasons:
// Settle with Dead alone.
func (s *Store) MarkDead(ctx context.Context, l *Lease, fs []Failure) (int, error) {
	r, err := s.settleOne(ctx, Settlement{Lease: l, Dead: fs})
	return r.Dead, err
}

// Postpone puts messages of a lease back, due at their times, without
// counting the attempt (a destination that stalled, a lease nearly over):
// Settle with Postpone alone.
func (s *Store) Postpone(ctx context.Context, l *Lease, rs []RetryAt) (int, error) {
	r, err := s.settleOne(ctx, Settlement{Lease: l, Postpone: rs})
	return r.PutBack, err
}
