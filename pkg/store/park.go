package store

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// parkScript parks messages that are not known yet, and replaces those
// asked to when they are newer.
// (lua/park.lua has its KEYS, ARGV and reply.)
var parkScript = loadScript("park")

// ParkResult is what Park did with one message.
type ParkResult int

// Park results.
const (
	Known      ParkResult = 0 // the ID is already parked, in flight or dead: nothing changed (idempotent ingest)
	Parked     ParkResult = 1
	Replaced   ParkResult = 2 // Message.Replace and newer: it replaced the parked (or dead) message
	Duplicate  ParkResult = 3 // a re-read of the message of that ID delivered within the dedupe window (envelope.Origin)
	Queued     ParkResult = 4 // waits behind the version in flight: a newer replacement, parked when that one is done; or a new message of its ID, parked when it is delivered
	NotNewer   ParkResult = 5 // Message.Replace but not newer than the parked one, which stays (envelope.Origin)
	OverSeries ParkResult = 6 // a new recurring series past limits.max_series: not parked (the caller rejects it)
	// firing is Park's own: a replacement of the version in flight, not
	// written yet, since that version may be committed ahead of its due
	// instant; Park parks it again after CommitLead, then Queued.
	firing ParkResult = 7
	// IDTaken: the ID is known (parked, in flight or dead) as a message of
	// another source (another ingest, or the admin API, Message.Ingest ""):
	// nothing changed, and the caller rejects this one (id_taken), since a
	// publisher may not drop or replace another's message by reusing its ID.
	IDTaken ParkResult = 8
	// OverSourceSeries: a new recurring series past its ingest's share of
	// ingest[].max_series (Options.SourceSeries): not parked (the caller
	// rejects it).
	OverSourceSeries ParkResult = 9
	maxParkValue                = OverSourceSeries
)

// Accepted reports whether the message is now in Redis as sent (parked,
// replacing or queued behind the version in flight).
func (r ParkResult) Accepted() bool { return r == Parked || r == Replaced || r == Queued }

func (r ParkResult) String() string {
	switch r {
	case Known:
		return "known"
	case Parked:
		return "parked"
	case Replaced:
		return "replaced"
	case Duplicate:
		return "duplicate"
	case Queued:
		return "queued"
	case NotNewer:
		return "not_newer"
	case OverSeries:
		return "over_max_series"
	case IDTaken:
		return "id_taken"
	case OverSourceSeries:
		return "over_ingest_max_series"
	}
	return "unknown"
}

// Park parks msgs, batching them into one script call per shard, all in one
// pipeline. A message whose ID is already known changes nothing (the
// contract's idempotent ingest), unless it has Replace and is a newer
// version than the known one. A re-read of a message delivered within the
// dedupe window is not parked again; any other message with that ID is
// (envelope.Origin says which is which). A replacement of a version in
// flight is parked after that version's due instant (CommitLead), so that
// it waits behind it only when it came after the instant. On error nothing
// can be assumed about which messages were parked; parking them again is
// safe.
func (s *Store) Park(ctx context.Context, msgs []*envelope.Message) ([]ParkResult, error) {
	res, err := s.park(ctx, msgs, false)
	if err != nil {
		return nil, err
	}
	var again []*envelope.Message
	var at []int
	for i, r := range res {
		if r == firing {
			again, at = append(again, msgs[i]), append(at, i)
		}
	}
	if len(again) == 0 {
		return res, nil
	}
	if err := s.afterCommitLead(ctx); err != nil {
		return nil, fmt.Errorf("store.park: %w", err)
	}
	after, err := s.park(ctx, again, true)
	if err != nil {
		return nil, err
	}
	for j, i := range at {
		res[i] = after[j]
	}
	return res, nil
}

// park runs lua/park.lua for msgs; queue is its ARGV[2].
func (s *Store) park(ctx context.Context, msgs []*envelope.Message, queue bool) ([]ParkResult, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	quotas, err := s.seriesQuotasFor(ctx, msgs)
	if err != nil {
		return nil, fmt.Errorf("store.park: %w", err)
	}
	calls, index := s.groupByShard(msgs, func(m *envelope.Message) []any {
		replace, redelivered, nolog := 0, 0, 0
		if m.Replace {
			replace = 1
		}
		if m.Redelivered {
			redelivered = 1
		}
		if m.Origin.Log == "" {
			nolog = 1
		}
		return []any{m.ID, ms(m.DueAt), min(int(m.Priority), MaxPriority), s.encode(m), replace, s.codec.GroupIndex(m.Group), doneMark(m.Origin), redelivered,
			SeenField(m.ID, m.Origin.Log), m.Ingest, quotas.sourceQuota(s.ShardOf(m.ID), m.Ingest), nolog}
	})
	now := time.Now()
	var seenAt int64
	for c := range calls {
		b := s.seen(now)
		seenAt = b.expireAt
		calls[c].keys = append(calls[c].keys, s.keys.Seen(calls[c].shard, b.cur), s.keys.Seen(calls[c].shard, b.cur-1), s.keys.Seen(calls[c].shard, b.cur+1))
		for _, i := range index[c] {
			calls[c].keys = append(calls[c].keys, s.keys.Done(calls[c].shard, msgs[i].ID, msgs[i].Origin.Log))
		}
	}
	q := 0
	if queue {
		q = 1
	}
	for c := range calls {
		calls[c].args = append([]any{quotas.storeQuota(calls[c].shard), q, seenAt}, calls[c].args...)
	}
	cmds := s.runEach(ctx, "park", parkScript, calls)
	res := make([]ParkResult, len(msgs))
	for c, cmd := range cmds {
		vals, err := cmd.Int64Slice()
		if err != nil {
			return nil, fmt.Errorf("store.park shard %d: %w", calls[c].shard, err)
		}
		if len(vals) != len(index[c]) {
			return nil, fmt.Errorf("store.park shard %d: %d results for %d messages", calls[c].shard, len(vals), len(index[c]))
		}
		for j, v := range vals {
			if v < 0 || v > int64(maxParkValue) || (queue && ParkResult(v) == firing) {
				return nil, fmt.Errorf("store.park shard %d: unexpected result %d", calls[c].shard, v)
			}
			res[index[c][j]] = ParkResult(v)
		}
	}
	return res, nil
}

// doneMark is what the dedupe window remembers of a message, in its key
// (Keys.Done, which names its log): of a delivered message its position in
// the log; of a message without a log (AMQP) its content print as a signed
// integer, from its park until its ack is confirmed (AcksConfirmed); ""
// when neither is known (a message of the admin API, of core NATS), which
// nothing can re-read. Both are integers, which Redis stores in the key's
// object.
func doneMark(o envelope.Origin) string {
	switch {
	case o.Log != "":
		return strconv.FormatUint(o.Pos, 10)
	case o.Print != 0:
		return strconv.FormatInt(int64(o.Print), 10)
	}
	return ""
}

// seenBuckets are the buckets of the dedupe window at a time: the current
// one, which marks go into, and when it expires (Unix ms; 0 when the
// window is off). The ones before and after it are read too, so that the
// marks of instances whose clocks are ahead or behind are found.
type seenBuckets struct {
	cur      int64
	expireAt int64
}

// seen returns the dedupe window's buckets at now. A mark is written into
// the bucket of its time and read while that bucket or the next one is
// current: it is remembered for at least the window, at most two; a
// bucket expires whole a window after that, for the instances behind.
func (s *Store) seen(now time.Time) seenBuckets {
	w := s.dedupe.Milliseconds()
	if w <= 0 {
		return seenBuckets{}
	}
	b := now.UnixMilli() / w
	return seenBuckets{cur: b, expireAt: (b + 3) * w}
}

// AcksConfirmed forgets the marks park left for msgs read without a log
// (AMQP), whose acks the broker has now processed: a redelivery of the
// same content from now on is a new message, not a re-read (the contract's
// "Re-reads on RabbitMQ"). Messages with a log, or without a print, have
// no mark and are passed over.
func (s *Store) AcksConfirmed(ctx context.Context, msgs []*envelope.Message) error {
	if s.dedupe <= 0 {
		return nil
	}
	pipe := s.rdb.Pipeline()
	b := s.seen(time.Now())
	n := 0
	for _, m := range msgs {
		if m.Origin.Log == "" && m.Origin.Print != 0 {
			shard, f := s.ShardOf(m.ID), SeenField(m.ID, m.Origin.Log)
			for _, k := range []int64{b.cur - 1, b.cur, b.cur + 1} {
				pipe.HDel(ctx, s.keys.Seen(shard, k), f)
			}
			n++
		}
	}
	if n == 0 {
		return nil
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("store.acks_confirmed: %w", err)
	}
	return nil
}

// groupByShard builds one call per shard from msgs; index[c][j] is the
// position in msgs of the j-th message of call c.
func (s *Store) groupByShard(msgs []*envelope.Message, args func(*envelope.Message) []any) ([]shardCall, [][]int) {
	pos := make(map[int]int) // shard -> call index
	var calls []shardCall
	var index [][]int
	for i, m := range msgs {
		sh := s.ShardOf(m.ID)
		c, ok := pos[sh]
		if !ok {
			c = len(calls)
			pos[sh] = c
			calls = append(calls, shardCall{shard: sh})
			index = append(index, nil)
		}
		calls[c].args = append(calls[c].args, args(m)...)
		index[c] = append(index[c], i)
	}
	return calls, index
}

// rejectScript keeps rejected messages as dead messages.
// (lua/reject.lua has its KEYS, ARGV and reply.)
var rejectScript = loadScript("reject")

// Rejected is an ingested message that cannot be parked.
type Rejected struct {
	Message *envelope.Message
	Reason  string
}

// Reject keeps messages as dead messages with their reasons. Rejecting the
// same message again (a broker redelivery) keeps one dead message. A message
// whose ID is taken by another is kept under a new ID (envelope.NewID) with
// the original ID named in its reason, so that a bad message never
// overwrites a good one and is never lost. It returns the IDs they were
// kept under; rs is not changed.
func (s *Store) Reject(ctx context.Context, rs []Rejected) ([]string, error) {
	rs = slices.Clone(rs) // renamed entries stay ours
	ids := make([]string, len(rs))
	pending := make([]int, len(rs))
	for i := range rs {
		pending[i] = i
	}
	for attempt := 0; len(pending) > 0; attempt++ {
		if attempt == 3 {
			return nil, fmt.Errorf("store.reject: IDs still taken after %d tries", attempt)
		}
		msgs := make([]*envelope.Message, len(pending))
		for j, i := range pending {
			msgs[j] = rs[i].Message
		}
		reasons := make(map[*envelope.Message]string, len(pending))
		for _, i := range pending {
			reasons[rs[i].Message] = rs[i].Reason
		}
		calls, index := s.groupByShard(msgs, func(m *envelope.Message) []any {
			return []any{m.ID, s.encode(m), s.codec.SealReason(m.ID, reasons[m]), min(int(m.Priority), MaxPriority)}
		})
		for c := range calls {
			calls[c].args = append([]any{s.maxDead}, calls[c].args...)
		}
		cmds := s.runEach(ctx, "reject", rejectScript, calls)
		var retry []int
		for c, cmd := range cmds {
			res, err := cmd.Int64Slice()
			if err != nil {
				return nil, fmt.Errorf("store.reject shard %d: %w", calls[c].shard, err)
			}
			for j, v := range res {
				i := pending[index[c][j]]
				if v == 1 || v == 2 {
					ids[i] = rs[i].Message.ID
					continue
				}
				// Keep it under a fresh ID; a copy, so the caller's message is unchanged.
				m := *rs[i].Message
				rs[i].Reason = fmt.Sprintf("%s (its ID %q was already taken)", rs[i].Reason, m.ID)
				m.ID = envelope.NewID()
				rs[i].Message = &m
				retry = append(retry, i)
			}
		}
		pending = retry
	}
	return ids, nil
}
