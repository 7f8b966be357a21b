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
//
//	KEYS[1..16] -> the shard's keys (Keys.shard)
//	ARGV[1] -> at most this many messages
//	ARGV[2] -> lease in ms
//	ARGV[3..] -> pairs: a blocked sink's name, its hold band index
//	returns -> {now, next, expiry, acked, id1, attempt1, slotted1, message1, id2, ...}
//	           now: Redis server time (Unix µs), the clock every instance
//	           shares (a message is due when its score is at most now in ms);
//	           next: lowest score left in the due sets (held ones aside), -1
//	           when none is left, now when the script stopped holding before
//	           it was done (claim again at once);
//	           expiry: when this claim's lease ends (now + lease ms), which
//	           identifies the claim;
//	           acked: how many of the previous lease's messages were acked
//	           (claimAckScript; 0 here);
//	           attempt: this publish attempt, from 1;
//	           slotted: 1 when the message had been given a publish slot by
//	           the sink's max_rate (Defer), 0 otherwise.
//
// A message is due when its score is <= now: a parked message whose due time
// has come, or an in-flight message whose lease expired (its claimer died).
// Claiming re-scores it to the lease expiry (+ .5). Only a claim that finds
// an expired lease writes the meta value, to count the abandoned attempt, so
// that a message that crashes its claimers still reaches max_attempts.
var claimScript = newFiringScript(`
return claimdue(tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV, 3, 0)
`)

// claimAckScript is ackScript for the previous lease of the shard, then
// claimScript, in one call: the ack of a batch travels with the next claim.
//
//	KEYS[1..16] -> the shard's keys; KEYS[16+j] -> the dedupe key of the
//	           j-th acked message
//	ARGV[1] -> c, the index of the claim's arguments
//	ARGV[2..c-1] -> ackScript's arguments
//	ARGV[c..] -> claimScript's arguments
//	returns -> claimScript's reply, with the acked count
var claimAckScript = newFiringScript(`
local c = tonumber(ARGV[1])
local acked = acklease(tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV, 4, c - 1, 16)
return claimdue(tonumber(ARGV[c]), tonumber(ARGV[c + 1]), ARGV, c + 2, acked)
`)

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
	// ExpiryMs + 0.5 in its due set.
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

// ackScript removes delivered messages: forgets them, or parks their next
// occurrence (recurring), or the replacement that waited for them.
//
//	KEYS[1..16] -> the shard's keys; KEYS[16+j] -> the dedupe key
//	           (Keys.Done) of the j-th message
//	ARGV[1] -> the lease's expiry (Lease.ExpiryMs)
//	ARGV[2] -> dedupe window in ms (0: off)
//	ARGV[3..] -> per message 6 values: ID, what the dedupe window remembers
//	           of it (doneMark, "" nothing), group ("" none), then for a
//	           recurring message the
//	           next occurrence: due time (Unix ms), priority, encoded message;
//	           "" "" "" when the series ends or the message does not recur
//	returns -> how many were removed or moved on; a message no longer held
//	           under the lease (it expired and another claim took the
//	           message, or it was cancelled) is left alone
//
// The caller passes each message's group, so that the common ack reads no
// blob; next (a replacement waiting) is looked at only when it exists.
var ackScript = newFiringScript(`
return acklease(tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV, 3, #ARGV, 16)
`)

// ackArgs are ackScript's arguments and extra keys for ds of lease l.
func (s *Store) ackArgs(l *Lease, ds []Done) ([]any, []string) {
	args := make([]any, 0, 6*len(ds)+2)
	keys := make([]string, 0, len(ds))
	args = append(args, l.ExpiryMs, s.dedupe.Milliseconds())
	for _, d := range ds {
		mark := doneMark(d.Origin)
		if d.Next != nil {
			args = append(args, d.ID, mark, d.Group, ms(d.Next.DueAt), min(int(d.Next.Priority), MaxPriority), s.encode(d.Next))
		} else {
			args = append(args, d.ID, mark, d.Group, "", "", "")
		}
		keys = append(keys, s.keys.Done(l.Shard, d.ID, d.Origin.Log))
	}
	return args, keys
}

// Done is a message a sink confirmed, for Ack.
type Done struct {
	ID     string
	Origin envelope.Origin // where it was read, remembered for the dedupe window (zero: a skipped occurrence, or nothing to remember)
	Group  string          // its group (x-delay-group), to take it out of the group's index
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
//
//	KEYS[3] -> meta, the due sets (of one shard)
//	ARGV[1] -> the lease's expiry (Lease.ExpiryMs)
//	ARGV[2..] -> triples: message ID, next attempt time (Unix ms), last error
//	returns -> how many were rescheduled (those still held under the
//	           lease); a replacement that waited for the message takes its
//	           place instead (a follower waits on)
var retryScript = newFiringScript(`
local expiry = tonumber(ARGV[1])
local top = maxprio()
local n = 0
for i = 2, #ARGV, 3 do
  local id = ARGV[i]
  local ok, p, a = claimedattempts(id, expiry, top)
  if ok then
    local waiting = redis.call('HGET', KEYS[15], id)
    if waiting and not follows(waiting) then
      -- a replacement waited for this version: it takes its place
      redis.call('ZREM', zkey(p), id)
      forget(id, redis.call('HGET', KEYS[1], id))
      promote(id, waiting)
    else
      redis.call('ZADD', zkey(p), ARGV[i + 1], id)
      setmeta(id, a + 1, 0, p, ARGV[i + 2])
    end
    n = n + 1
  end
end
return n
`)

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
		args = append(args, r.ID, ms(r.At), r.Reason)
	}
	n, err := s.run(ctx, "retry", retryScript, l.Shard, args...).Int()
	if err != nil {
		return 0, fmt.Errorf("store.retry shard %d: %w", l.Shard, err)
	}
	return n, nil
}

// deadScript moves messages of a lease to the dead set.
//
//	KEYS[1] -> pool, KEYS[3] -> meta, KEYS[4] -> dead, the due sets
//	ARGV[1] -> the lease's expiry (Lease.ExpiryMs)
//	ARGV[2] -> dead messages kept per shard (the oldest beyond are deleted)
//	ARGV[3..] -> pairs: message ID, reason
//	returns -> how many were moved (those still held under the lease); a
//	           replacement or a follower that waited for the message takes
//	           its place instead
var deadScript = newFiringScript(`
local expiry = tonumber(ARGV[1])
local now = servertime()
local top = maxprio()
local n = 0
for i = 3, #ARGV, 2 do
  local id = ARGV[i]
  local ok, p, a = claimedattempts(id, expiry, top)
  if ok then
    redis.call('ZREM', zkey(p), id)
    local waiting = redis.call('HGET', KEYS[15], id)
    if waiting then
      -- a replacement waited for this version: it takes its place
      forget(id, redis.call('HGET', KEYS[1], id))
      promote(id, waiting)
    else
      redis.call('ZADD', KEYS[4], now, id)
      setmeta(id, a + 1, now, p, ARGV[i + 1])
    end
    n = n + 1
  end
end
trimdead(tonumber(ARGV[2]))
return n
`)

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
		args = append(args, f.ID, f.Reason)
	}
	n, err := s.run(ctx, "dead", deadScript, l.Shard, args...).Int()
	if err != nil {
		return 0, fmt.Errorf("store.dead shard %d: %w", l.Shard, err)
	}
	return n, nil
}
