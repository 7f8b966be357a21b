package store

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// claimScript takes due messages and puts them in flight, highest priority
// first, due order within a priority. A due message of a blocked sink (down
// or paused) is held instead: moved into the sink's hold band, due order
// kept, untouched until Release brings it back.
// (lua/claim.lua has its KEYS, ARGV and reply.)
var claimScript = loadScript("claim")

// claimAckScript is ackScript for the previous lease of the shard, then
// claimScript, in one call: the ack of a batch travels with the next claim.
// (lua/claimack.lua has its KEYS, ARGV and reply.)
var claimAckScript = loadScript("claimack")

// Claimed is one message taken by a claim.
type Claimed struct {
	ID      string
	Attempt int       // this publish attempt, from 1
	Slot    time.Time // the publish slot of its sink's max_rate it waited for (Defer); zero when none
	// Sent says a publish of this version was sent before and never
	// confirmed (Settlement.Unconfirmed): its broker may have it.
	Sent    bool
	Message *envelope.Message // nil when Err is set
	Err     error             // the stored message could not be decoded
	// Clear is, when Err is set, the part kept in clear (envelope.DecodeClear:
	// due time and route) if it could be read, for the logs.
	Clear *envelope.Message

	// Ahead is set for a message claimed ahead of its due time (Ask.Ahead):
	// it is not in flight until Commit puts it there just before its due
	// instant, At (on Redis's clock; Options.CommitLead). Until then a cancel,
	// replace or reschedule takes it from the claim, and Commit says so.
	Ahead bool
	At    time.Time
	was   string // Ahead: its due-set score before the claim (given back by Commit)
}

// Lease is what one claim on one shard took: its messages are held until
// the lease expires, then due again for any instance. Ack, Retry and
// MarkDead take the Lease and act only on messages it still holds.
type Lease struct {
	Shard int
	// ExpiryMs is when the lease ends, Unix ms on Redis's clock. It also
	// identifies the claim: a message held under it has the score
	// ExpiryMs + leaseMark in its due set (ExpiryMs + aheadMark while it
	// is claimed ahead).
	ExpiryMs int64
	Now      time.Time // Redis server time at the claim, to the microsecond
	// Next is when a claim may find something new in the shard (Redis's
	// clock): its lowest score (a due time, a lease expiry), less half the
	// ahead window for a parked message (lua/claim.lua says why); zero when
	// the shard is empty.
	Next     time.Time
	Messages []Claimed
	// Acked is how many messages of the previous lease ClaimAfter acked.
	Acked int
}

// Expiry is when the claimed messages become due again if not acked.
func (l *Lease) Expiry() time.Time { return time.UnixMilli(l.ExpiryMs) }

// Ask is what a claim takes.
type Ask struct {
	Max   int           // at most this many messages
	Lease time.Duration // held for this long
	// Ahead, when positive, also claims ahead, with what is left of Max,
	// the parked messages that fall due within it (Claimed.Ahead). It is
	// cut to less than Lease: a claim ahead whose lease ends is due again
	// at the lease's expiry, which must come after its due time.
	Ahead time.Duration
	// Blocked are the sinks (name -> hold band index, see Bands) whose due
	// messages are held instead of claimed.
	Blocked map[string]int
}

// ClaimAhead acks the messages ds of the shard's previous lease prev (as
// Ack does; none when ds is empty) and then claims what ask says, in one
// round trip. On error nothing is known of either: ack again.
func (s *Store) ClaimAhead(ctx context.Context, shard int, prev *Lease, ds []Done, ask Ask) (*Lease, error) {
	claimArgs := claimArgs(ask)
	var res []any
	var err error
	if len(ds) == 0 {
		res, err = s.run(ctx, "claim", claimScript, shard, claimArgs...).Slice()
	} else {
		if prev.Shard != shard {
			return nil, fmt.Errorf("store.claim shard %d: the acks are of shard %d", shard, prev.Shard)
		}
		ackArgs, keys := s.ackArgs(prev, ds)
		args := make([]any, 0, 1+len(ackArgs)+len(claimArgs))
		args = append(args, 2+len(ackArgs))
		args = append(args, ackArgs...)
		args = append(args, claimArgs...)
		res, err = s.runKeys(ctx, "claim", claimAckScript, shard, keys, args...).Slice()
	}
	if err != nil {
		return nil, fmt.Errorf("store.claim shard %d: %w", shard, err)
	}
	return s.lease(shard, res)
}

// ClaimAfter acks the messages ds of the shard's previous lease prev (as
// Ack does) and then claims (as Claim does), in one round trip. On error
// nothing is known of either: ack again.
func (s *Store) ClaimAfter(ctx context.Context, prev *Lease, ds []Done, max int, lease time.Duration, blocked map[string]int) (*Lease, error) {
	return s.ClaimAhead(ctx, prev.Shard, prev, ds, Ask{Max: max, Lease: lease, Blocked: blocked})
}

// Claim takes up to max due messages of a shard and holds them for lease.
// Due messages of the blocked sinks (name -> hold band index, see
// Bands) are held instead of claimed.
func (s *Store) Claim(ctx context.Context, shard, max int, lease time.Duration, blocked map[string]int) (*Lease, error) {
	return s.ClaimAhead(ctx, shard, nil, nil, Ask{Max: max, Lease: lease, Blocked: blocked})
}

// claimArgs are claimScript's arguments for a.
func claimArgs(a Ask) []any {
	args := make([]any, 0, 3+2*len(a.Blocked))
	args = append(args, a.Max, a.Lease.Milliseconds(), max(0, a.Ahead.Milliseconds()))
	for sink, band := range a.Blocked {
		args = append(args, sink, band)
	}
	return args
}

// claimFields is how many reply items each claimed message has.
const claimFields = 6

// lease reads a claim's reply.
func (s *Store) lease(shard int, res []any) (*Lease, error) {
	if len(res) < 4 || (len(res)-4)%claimFields != 0 {
		return nil, fmt.Errorf("store.claim shard %d: unexpected reply of %d items", shard, len(res))
	}
	c := &Lease{Shard: shard, Now: time.UnixMicro(toInt64(res[0])), ExpiryMs: toInt64(res[2])}
	if next := toInt64(res[1]); next >= 0 {
		c.Next = time.UnixMilli(next)
	}
	c.Acked = int(toInt64(res[3]))
	c.Messages = make([]Claimed, 0, (len(res)-4)/claimFields)
	for i := 4; i < len(res); i += claimFields {
		id, _ := toString(res[i])
		was, _ := toString(res[i+3])
		blob, _ := toString(res[i+4])
		m, err := s.decode(id, blob)
		cl := Claimed{ID: id, Attempt: int(toInt64(res[i+1])), Message: m, Err: err, Sent: toInt64(res[i+5]) == 1}
		if err != nil {
			cl.Clear, _ = envelope.DecodeClear(id, []byte(blob))
		}
		if slot := toInt64(res[i+2]); slot > 0 {
			cl.Slot = time.UnixMilli(slot)
		}
		if was != "" {
			score, perr := strconv.ParseFloat(was, 64)
			if perr != nil {
				return nil, fmt.Errorf("store.claim shard %d: unexpected score %q of %s", shard, was, id)
			}
			cl.Ahead, cl.At, cl.was = true, time.UnixMilli(int64(math.Ceil(score))), was
		}
		c.Messages = append(c.Messages, cl)
	}
	return c, nil
}

// commitScript puts in flight, just before their due instant, messages a
// claim took ahead, and gives back others. (lua/commit.lua has its KEYS, ARGV
// and reply.)
var commitScript = loadScript("commit")

// DefaultCommitLead is how long before its due instant (on Redis's clock)
// Commit puts a message claimed ahead in flight (Options.CommitLead): the
// commit's round trip is then made before the instant, and the scheduler
// publishes at the instant itself. A message committed ahead is in flight
// with its due instant still to come, and every change that meets a
// message in flight waits for that instant: a cancel, a reschedule or a
// replacement is answered (a replacement parked) after it, never before,
// so that whatever was answered before a due instant still wins over the
// message.
const DefaultCommitLead = 2 * time.Millisecond

// CommitLead is how long before its due instant Commit puts a message
// claimed ahead in flight (Options.CommitLead).
func (s *Store) CommitLead() time.Duration { return s.commitLead }

// afterCommitLead waits CommitLead, for a change that met a message in
// flight, which a commit may have put there up to CommitLead before its
// due instant: the change is answered after that instant, since Redis ran
// its script before the reply came.
func (s *Store) afterCommitLead(ctx context.Context) error {
	t := time.NewTimer(s.commitLead)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Committed is what Commit did with one message claimed ahead.
type Committed int

// What Commit did with a message (lua/commit.lua's r).
const (
	// Gone: no longer the claim's (cancelled, replaced or rescheduled
	// since, or the lease ended): publish nothing.
	Gone Committed = 0
	// InFlight: committed, in flight under the lease: publish it.
	InFlight Committed = 1
	// NotYet: not due within the commit lead on Redis's clock; still
	// claimed ahead.
	NotYet Committed = -1
)

// Commit puts the messages commit of lease l, claimed ahead, in flight if
// they are still as the claim left them and due within the commit lead on
// Redis's clock (the caller publishes none before its instant), and gives
// back the messages back of l (claimed ahead, not wanted any more) to
// their scores before the claim. It returns Redis's time and what became
// of each message of commit, in order.
func (s *Store) Commit(ctx context.Context, l *Lease, commit, back []Claimed) (time.Time, []Committed, error) {
	now, res, _, err := s.CommitAfter(ctx, l, commit, back, nil, nil)
	return now, res, err
}

// commitAckScript is the ack of the shard's previous lease, then
// commitScript, in one call.
// (lua/commitack.lua has its KEYS, ARGV and reply.)
var commitAckScript = loadScript("commitack")

// CommitAfter acks the messages ds of the shard's lease prev (as Ack does)
// and then commits (as Commit does), in one round trip, and also returns
// how many of ds were still held under prev: the acks of a publish travel
// with the shard's next commit, as with its next claim (ClaimAhead). On
// error nothing is known of either: ack again.
func (s *Store) CommitAfter(ctx context.Context, l *Lease, commit, back []Claimed, prev *Lease, ds []Done) (time.Time, []Committed, int, error) {
	if len(ds) == 0 {
		res, err := s.run(ctx, "commit", commitScript, l.Shard, s.commitArgs(l, commit, back)...).Slice()
		now, out, err := committed(l.Shard, len(commit), res, err)
		return now, out, 0, err
	}
	if prev.Shard != l.Shard {
		return time.Time{}, nil, 0, fmt.Errorf("store.commit shard %d: the acks are of shard %d", l.Shard, prev.Shard)
	}
	ackArgs, keys := s.ackArgs(prev, ds)
	commitArgs := s.commitArgs(l, commit, back)
	args := make([]any, 0, 1+len(ackArgs)+len(commitArgs))
	args = append(args, 2+len(ackArgs))
	args = append(args, ackArgs...)
	args = append(args, commitArgs...)
	res, err := s.runKeys(ctx, "commit", commitAckScript, l.Shard, keys, args...).Slice()
	acked := 0
	if err == nil && len(res) > 0 {
		acked = int(toInt64(res[len(res)-1]))
		res = res[:len(res)-1]
	}
	now, out, err := committed(l.Shard, len(commit), res, err)
	return now, out, acked, err
}

// commitArgs are commitScript's arguments.
func (s *Store) commitArgs(l *Lease, commit, back []Claimed) []any {
	args := make([]any, 0, 3+2*len(commit)+2*len(back))
	args = append(args, l.ExpiryMs, s.commitLead.Microseconds(), len(commit))
	for _, c := range commit {
		args = append(args, c.ID, c.At.UnixMilli())
	}
	for _, c := range back {
		args = append(args, c.ID, c.was)
	}
	return args
}

// committed reads commitScript's reply for n messages to commit.
func committed(shard, n int, res []any, err error) (time.Time, []Committed, error) {
	if err != nil {
		return time.Time{}, nil, fmt.Errorf("store.commit shard %d: %w", shard, err)
	}
	if len(res) != 2+n {
		return time.Time{}, nil, fmt.Errorf("store.commit shard %d: unexpected reply of %d items", shard, len(res))
	}
	out := make([]Committed, n)
	for i := range out {
		out[i] = Committed(toInt64(res[1+i]))
	}
	return time.UnixMicro(toInt64(res[0])), out, nil
}

// Occupied reports, for each of shards, whether a claim could take
// anything there now or later: a parked message, a claim's lease that will
// end, a rate slot. Held messages do not count: a release wakes the
// shards. One pipeline of plain reads, no script: the scheduler asks it
// for its empty shards each scheduler.max_sleep instead of claiming each
// of them. It reads both layouts' keys, whatever layout this Store takes
// the shard to be in (a migrate from another process changes it without a
// word to this one): a due set's first entry below the hold bands (layout
// 1, and a parked message of layout 2), or any entry of layout 2's sets of
// leases and slots.
func (s *Store) Occupied(ctx context.Context, shards []int) ([]bool, error) {
	firsts := make([][]*redis.ZSliceCmd, len(shards))
	exists := make([]*redis.IntCmd, len(shards))
	pipe := s.rdb.Pipeline()
	for i, sh := range shards {
		exists[i] = pipe.Exists(ctx, s.keys.LeaseSets(sh)...)
		for _, key := range s.keys.DueSets(sh) {
			firsts[i] = append(firsts[i], pipe.ZRangeWithScores(ctx, key, 0, 0))
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("store.occupied: %w", err)
	}
	out := make([]bool, len(shards))
	for i, cs := range firsts {
		for _, c := range cs {
			if z := c.Val(); len(z) > 0 {
				if held, _ := Held(z[0].Score); !held {
					out[i] = true
				}
			}
		}
		if exists[i].Val() > 0 {
			out[i] = true
		}
	}
	return out, nil
}
