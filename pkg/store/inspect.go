package store

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// State of a known message.
const (
	StateScheduled = "scheduled" // waiting for its due time (or its next attempt)
	StateHeld      = "held"      // due or not, waiting for its sink, which is paused or down
	StateInflight  = "inflight"  // claimed by an instance, being published
	StateDead      = "dead"      // given up on, kept with a reason
)

// Info describes a known message.
type Info struct {
	ID          string
	State       string
	Message     *envelope.Message // nil when Err is set
	Err         error             // the stored message could not be decoded
	Attempts    int               // publish attempts so far
	NextAt      time.Time         // scheduled: next attempt; inflight: lease expiry
	Held        bool              // State is StateHeld
	DeadAt      time.Time         // dead: when it died
	Reason      string            // dead: why; scheduled after a failure: the last error
	Shard       int
	EncodedSize int
	// SeriesEnds says a cancel met this occurrence of a series in flight:
	// the series ends with it, and no next one is parked.
	SeriesEnds bool
	// Clear is, when Err is set, the part of the message kept in clear
	// (envelope.DecodeClear: due time and route) if it could be read:
	// what is shown of a message sealed with a key not configured.
	Clear *envelope.Message
}

// inspectScript reads everything known about one message.
// (lua/inspect.lua has its KEYS, ARGV and reply.)
var inspectScript = loadScript("inspect")

// Inspect returns what is known of a message, or ErrNotFound.
func (s *Store) Inspect(ctx context.Context, id string) (*Info, error) {
	shard := s.ShardOf(id)
	res, err := s.run(ctx, "inspect", inspectScript, shard, id).Slice()
	if err != nil {
		return nil, fmt.Errorf("store.inspect shard %d: %w", shard, err)
	}
	if len(res) != 6 {
		return nil, fmt.Errorf("store.inspect shard %d: unexpected reply of %d items", shard, len(res))
	}
	blob, ok := toString(res[4])
	if !ok {
		return nil, ErrNotFound
	}
	info := &Info{ID: id, Shard: shard, EncodedSize: len(blob), SeriesEnds: toInt64(res[5]) == 1}
	s.decodeInto(info, blob)
	var deadAt int64
	if m, ok := toString(res[3]); ok {
		info.Attempts, deadAt, info.Reason = s.meta(id, m)
	}
	dueScore, inDue := toString(res[1])
	_, inDead := toString(res[2])
	switch {
	case inDead:
		info.State = StateDead
		info.DeadAt = time.UnixMilli(deadAt)
	case inDue:
		score, _ := strconv.ParseFloat(dueScore, 64)
		info.NextAt = time.UnixMilli(int64(score))
		info.State = StateScheduled
		if held, due := Held(score); held {
			info.State, info.Held, info.NextAt = StateHeld, true, due
			break
		}
		if leased(score) { // its lease ended or not (lua/lib/wire.lua's firing)
			info.State = StateInflight
			info.Attempts++ // the one under way, or that may have been sent
		}
		if claimedAhead(score) && info.Message != nil {
			// claimed ahead by an instance: scheduled, at its due time
			info.NextAt = info.Message.DueAt
		}
	default:
		return nil, ErrNotFound // a pool entry in neither set: being removed
	}
	return info, nil
}

// decodeInto decodes the stored message blob of info.ID into info: its
// Message, or the Err why not and, when it can be read, the Clear part.
func (s *Store) decodeInto(info *Info, blob string) {
	info.Message, info.Err = s.decode(info.ID, blob)
	if info.Err != nil {
		info.Clear, _ = envelope.DecodeClear(info.ID, []byte(blob))
	}
}
