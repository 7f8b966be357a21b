package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Slot is a message of a lease given the publish slot At.
type Slot struct {
	ID string
	At time.Time
}

// Defer puts messages of a lease back until their publish slots (score
// slot + slotMark; Claim reports the slot, Claimed.Slot): Settle with Defer
// alone.
func (s *Store) Defer(ctx context.Context, l *Lease, slots []Slot) (int, error) {
	r, err := s.settleOne(ctx, Settlement{Lease: l, Defer: slots})
	return r.PutBack, err
}

// slotsScript allots publish slots of one sink, shared by every instance:
// a generic cell rate algorithm whose state is the next free slot.
// (lua/slots.lua has its KEYS, ARGV and reply.)
var slotsScript = loadScript("slots")

// Slots allots n publish slots of sink at maxRate messages per second,
// shared by every instance through Redis, and returns their times in order
// (Redis's clock). A slot at or before the returned now may be used at
// once. One slot's worth of burst is allowed.
func (s *Store) Slots(ctx context.Context, sink string, n int, maxRate float64) (now time.Time, slots []time.Time, err error) {
	if n <= 0 || maxRate <= 0 {
		return time.Time{}, nil, errors.New("store.slots: n and maxRate must be positive")
	}
	interval := int64(1e6 / maxRate)
	res, err := s.runDeployment(ctx, "slots", slotsScript, []string{s.keys.Rate(sink)}, n, max(interval, 1)).Int64Slice()
	if err != nil {
		return time.Time{}, nil, fmt.Errorf("store.slots %s: %w", sink, err)
	}
	if len(res) != 2 {
		return time.Time{}, nil, fmt.Errorf("store.slots %s: unexpected reply of %d items", sink, len(res))
	}
	slots = make([]time.Time, n)
	for i := range slots {
		slots[i] = time.UnixMicro(res[1] + int64(i)*max(interval, 1))
	}
	return time.UnixMicro(res[0]), slots, nil
}
