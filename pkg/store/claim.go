package store

import (
	"context"
	"fmt"
	"time"

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

// Claimed is one message taken by Claim.
type Claimed struct {
	ID      string
	Attempt int               // this publish attempt, from 1
	Slotted bool              // it waited for a publish slot of its sink's max_rate (Defer)
	Message *envelope.Message // nil when Err is set
	Err     error             // the stored message could not be decoded
}

// Lease is what one claim on one shard took: its messages are held until
// the lease expires, then due again for any instance. Ack, Retry and
// MarkDead take the Lease and act only on messages it still holds.
type Lease struct {
	Shard int
	// ExpiryMs is when the lease ends, Unix ms on Redis's clock. It also
	// identifies the claim: a message held under it has the score
	// ExpiryMs + leaseMark in its due set.
	ExpiryMs int64
	Now      time.Time // Redis server time at the claim, to the microsecond
	Next     time.Time // lowest score left in the shard (due time or lease expiry); zero when empty
	Messages []Claimed
	// Acked is how many messages of the previous lease ClaimAfter acked.
	Acked int
}

// Expiry is when the claimed messages become due again if not acked.
func (l *Lease) Expiry() time.Time { return time.UnixMilli(l.ExpiryMs) }

// ClaimAfter acks the messages ds of the shard's previous lease prev (as
// Ack does) and then claims (as Claim does), in one round trip. On error
// nothing is known of either: ack again.
func (s *Store) ClaimAfter(ctx context.Context, prev *Lease, ds []Done, max int, lease time.Duration, blocked map[string]int) (*Lease, error) {
	if len(ds) == 0 {
		return s.Claim(ctx, prev.Shard, max, lease, blocked)
	}
	ackArgs, keys := s.ackArgs(prev, ds)
	args := make([]any, 0, 1+len(ackArgs)+2+2*len(blocked))
	args = append(args, 2+len(ackArgs))
	args = append(args, ackArgs...)
	args = append(args, max, lease.Milliseconds())
	for sink, band := range blocked {
		args = append(args, sink, band)
	}
	res, err := s.runKeys(ctx, "claim", claimAckScript, prev.Shard, keys, args...).Slice()
	if err != nil {
		return nil, fmt.Errorf("store.claim shard %d: %w", prev.Shard, err)
	}
	return s.lease(prev.Shard, res)
}

// Claim takes up to max due messages of a shard and holds them for lease.
// Due messages of the blocked sinks (name -> hold band index, see
// Bands) are held instead of claimed.
func (s *Store) Claim(ctx context.Context, shard, max int, lease time.Duration, blocked map[string]int) (*Lease, error) {
	args := make([]any, 0, 2+2*len(blocked))
	args = append(args, max, lease.Milliseconds())
	for sink, band := range blocked {
		args = append(args, sink, band)
	}
	res, err := s.run(ctx, "claim", claimScript, shard, args...).Slice()
	if err != nil {
		return nil, fmt.Errorf("store.claim shard %d: %w", shard, err)
	}
	return s.lease(shard, res)
}

// lease reads a claim's reply.
func (s *Store) lease(shard int, res []any) (*Lease, error) {
	if len(res) < 4 || (len(res)-4)%4 != 0 {
		return nil, fmt.Errorf("store.claim shard %d: unexpected reply of %d items", shard, len(res))
	}
	c := &Lease{Shard: shard, Now: time.UnixMicro(toInt64(res[0])), ExpiryMs: toInt64(res[2])}
	if next := toInt64(res[1]); next >= 0 {
		c.Next = time.UnixMilli(next)
	}
	c.Acked = int(toInt64(res[3]))
	c.Messages = make([]Claimed, 0, (len(res)-4)/4)
	for i := 4; i < len(res); i += 4 {
		id, _ := toString(res[i])
		blob, _ := toString(res[i+3])
		m, err := s.decode(id, blob)
		c.Messages = append(c.Messages, Claimed{ID: id, Attempt: int(toInt64(res[i+1])), Slotted: toInt64(res[i+2]) == 1, Message: m, Err: err})
	}
	return c, nil
}
