package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
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

// reslotScript moves the messages of one sink that wait for a max_rate
// slot back to their due times. (lua/reslot.lua has its KEYS, ARGV and
// reply.)
var reslotScript = loadScript("reslot")

// reslotBatch is how many entries of a shard's slot sets one reslot call
// looks at: about 5 ms of Redis's time (10 µs an entry).
var reslotBatch = 500

// rateField is the field of the sinks hash that records the max_rate a
// sink's slots are given at.
func rateField(sink string) string { return "rate:" + sink }

// formatRate is a max_rate as the sinks hash records it; "" for none.
func formatRate(rate float64) string {
	if rate <= 0 {
		return ""
	}
	return strconv.FormatFloat(rate, 'g', -1, 64)
}

// ChangedRates compares each sink's max_rate (0 for none) with the one its
// publish slots were given at, recorded in the sinks hash by Reslot, and
// returns the sinks whose messages may wait for slots of another rate (a
// slot clock is running: some slot was given in the last second or lies
// ahead). It deletes their slot clocks, so that the next slots are given
// from now at the new rate, and the caller then calls Reslot for each,
// which moves the messages waiting for an old slot back to their due
// times. A sink whose clock has stopped needs nothing: its rate is
// recorded here. A sink with no record (a store of an earlier release)
// counts as changed.
func (s *Store) ChangedRates(ctx context.Context, rates map[string]float64) ([]string, error) {
	if len(rates) == 0 {
		return nil, nil
	}
	names := slices.Sorted(maps.Keys(rates))
	fields := make([]string, len(names))
	for i, n := range names {
		fields[i] = rateField(n)
	}
	rec, err := s.rdb.HMGet(ctx, s.keys.Sinks(), fields...).Result()
	if err != nil {
		return nil, fmt.Errorf("store.changed_rates: %w", err)
	}
	var changed []string
	for i, name := range names {
		was, recorded := rec[i].(string)
		if recorded && was == formatRate(rates[name]) {
			continue
		}
		n, err := s.rdb.Del(ctx, s.keys.Rate(name)).Result()
		if err != nil {
			return changed, fmt.Errorf("store.changed_rates %s: %w", name, err)
		}
		if n == 0 {
			// No clock: no slot lies ahead (a slot that passed while no
			// instance claimed is given anew anyway: staleSlot). Recorded
			// at once.
			if err := s.recordRate(ctx, name, rates[name]); err != nil {
				return changed, err
			}
			continue
		}
		changed = append(changed, name)
	}
	return changed, nil
}

// recordRate records the max_rate a sink's slots are given at.
func (s *Store) recordRate(ctx context.Context, sink string, rate float64) error {
	var err error
	if v := formatRate(rate); v != "" {
		err = s.rdb.HSet(ctx, s.keys.Sinks(), rateField(sink), v).Err()
	} else {
		err = s.rdb.HDel(ctx, s.keys.Sinks(), rateField(sink)).Err()
	}
	if err != nil {
		return fmt.Errorf("store.record_rate %s: %w", sink, err)
	}
	return nil
}

// Reslot moves every message of sink that waits for a max_rate slot back
// to its due time, so that it takes a new slot at rate (0: none) when it
// is claimed again, and then records rate as the sink's (ChangedRates).
// It walks each shard's slot sets in calls of reslotBatch entries; a
// shard still in layout 1 keeps its waiting messages in its due sets,
// which it does not walk (layout1 counts those shards: `migrate up`
// converts them).
func (s *Store) Reslot(ctx context.Context, sink string, rate float64) (moved, layout1 int, err error) {
	for shard := range s.shards {
		if s.layouts[shard].Load() == Layout1 {
			layout1++
			continue
		}
		p, rank := MaxPriority, int64(0)
		for p >= 0 {
			res, err := s.run(ctx, "reslot", reslotScript, shard, sink, p, rank, reslotBatch).Int64Slice()
			if err != nil {
				return moved, layout1, fmt.Errorf("store.reslot %s: shard %d: %w", sink, shard, err)
			}
			if len(res) != 3 {
				return moved, layout1, fmt.Errorf("store.reslot %s: shard %d: unexpected reply of %d items", sink, shard, len(res))
			}
			moved += int(res[0])
			p, rank = int(res[1]), res[2]
		}
	}
	if layout1 == 0 {
		err = s.recordRate(ctx, sink, rate)
	}
	return moved, layout1, err
}
