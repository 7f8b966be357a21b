package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// settleScript writes every outcome of a lease's batch in one call.
// (lua/settle.lua has its KEYS, ARGV and reply.)
var settleScript = loadScript("settle")

// Settlement is every outcome of messages of one lease that a publish
// decided: the scheduler hands them to Settle together, one
// script call per lease. Each outcome acts only on a message still held
// under the lease.
type Settlement struct {
	Lease *Lease
	Done  []Done        // delivered (or, recurring, moved on to the next occurrence)
	Retry []RetryAt     // failed: published again at At, the attempt counted
	Dead  []Failure     // given up on, kept as dead with the reason
	Hold  []Unavailable // the sink could not take them: held for it, not counted
	Defer []Slot        // waiting for a publish slot of the sink's max_rate, not counted
	// Postpone puts messages back at At without counting the attempt (a
	// destination that stalled, a lease nearly over).
	Postpone []RetryAt
	// Unconfirmed are the IDs, among those retried, held or postponed,
	// whose publish was sent and never confirmed (a timeout): the broker
	// may take it yet, so until the message is gone a cancel or a change
	// meets it as in flight (ErrInFlight).
	Unconfirmed []string
}

// Len is how many outcomes s holds.
func (st *Settlement) Len() int {
	return len(st.Done) + len(st.Retry) + len(st.Dead) + len(st.Hold) + len(st.Defer) + len(st.Postpone)
}

// Settled is how many outcomes of a Settlement were written: the messages
// still held under the lease.
type Settled struct {
	Acked, Retried, Dead, PutBack int
}

// settleCall is the script call of st.
func (s *Store) settleCall(st *Settlement) shardCall {
	l := st.Lease
	acks, keys := s.ackArgs(l, st.Done) // the expiry and when the window's bucket expires, then the acks
	back := len(st.Hold) + len(st.Defer) + len(st.Postpone)
	args := make([]any, 0, 8+len(acks)+3*len(st.Retry)+2*len(st.Dead)+2*back+len(st.Unconfirmed))
	args = append(args, acks[0], acks[1], s.maxDead, len(st.Done), len(st.Retry), len(st.Dead), back, len(st.Unconfirmed))
	args = append(args, acks[2:]...)
	for _, r := range st.Retry {
		args = append(args, r.ID, ms(r.At), s.codec.SealReason(r.ID, r.Reason))
	}
	for _, f := range st.Dead {
		args = append(args, f.ID, s.codec.SealReason(f.ID, f.Reason))
	}
	for _, u := range st.Hold {
		args = append(args, u.ID, heldScore(u.Band, u.DueAt))
	}
	for _, sl := range st.Defer {
		args = append(args, sl.ID, strconv.FormatInt(ms(sl.At), 10)+strings.TrimPrefix(slotMark, "0"))
	}
	for _, r := range st.Postpone {
		args = append(args, r.ID, ms(r.At))
	}
	for _, id := range st.Unconfirmed {
		args = append(args, id)
	}
	return shardCall{shard: l.Shard, keys: keys, args: args}
}

// settled reads a settle script's reply.
func settled(shard int, v []int64, err error) (Settled, error) {
	if err == nil && len(v) != 4 {
		err = fmt.Errorf("unexpected reply of %d items", len(v))
	}
	if err != nil {
		return Settled{}, fmt.Errorf("store.settle shard %d: %w", shard, err)
	}
	return Settled{Acked: int(v[0]), Retried: int(v[1]), Dead: int(v[2]), PutBack: int(v[3])}, nil
}

// Settle writes the settlements, one script call each, in one pipeline
// (one round trip on a single Redis). It returns what each wrote, or an
// error per settlement: one that failed wrote nothing and may be given
// again.
func (s *Store) Settle(ctx context.Context, sts []Settlement) ([]Settled, []error) {
	calls := make([]call, len(sts))
	for i := range sts {
		c := s.settleCall(&sts[i])
		calls[i] = call{sc: settleScript, shardCall: c}
	}
	out := make([]Settled, len(sts))
	errs := make([]error, len(sts))
	for i, cmd := range s.runCalls(ctx, "settle", calls) {
		v, err := cmd.Int64Slice()
		out[i], errs[i] = settled(sts[i].Lease.Shard, v, err)
	}
	return out, errs
}

// settleOne writes one settlement; one without outcomes writes nothing and
// makes no call.
func (s *Store) settleOne(ctx context.Context, st Settlement) (Settled, error) {
	if st.Len() == 0 {
		return Settled{}, nil
	}
	out, errs := s.Settle(ctx, []Settlement{st})
	return out[0], errs[0]
}
