package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
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

// reslotBetween, set by a test, runs between two reslot calls of a shard;
// walkEnding just before a walk's end.
var reslotBetween, walkEnding func()

// rateField is the field of the sinks hash that records the max_rate every
// instance gives a sink's slots at (SinkState.MaxRate), and reslotField
// the one that marks a change whose walk (Reslot) has not ended:
// "resume:<Unix ms>" when the change paused the sink, "keep:<Unix ms>"
// when it was paused already; the time is when the walker last said it
// was alive.
func rateField(sink string) string   { return "rate:" + sink }
func reslotField(sink string) string { return "reslot:" + sink }

// pausedField is the sinks hash's field of a sink paused for every
// instance ("1").
func pausedField(sink string) string { return "paused:" + sink }

// ReslotStale is how long a walk's mark may go without a word from its
// walker before another instance takes the walk over (the walker
// stopped): a start (ChangedRates) or a running one (TakeOverWalks).
const ReslotStale = 30 * time.Second

// formatRate is a max_rate as the sinks hash records it; "0" for none.
func formatRate(rate float64) string {
	return strconv.FormatFloat(max(rate, 0), 'g', -1, 64)
}

// ChangedRates records each sink's max_rate (0 for none) in the sinks
// hash, where every instance of this build reads it at its next refresh
// and gives slots at it (SinkState.MaxRate): the last instance to start
// sets the rate for all. For a sink whose recorded rate this call changed
// while its slot clock ran (slots were given ahead), it stops the clock,
// so that the next slots are given from now, pauses the sink for every
// instance (a paused sink gets no slots: its due messages are held) and
// marks the change; the caller then calls Reslot for it once every
// instance applied the pause (within scheduler.max_sleep), which moves
// the messages waiting for a slot of the old rate back to their due times
// and resumes the sink: they are released, and take slots at the new rate.
// A sink whose walk is under way has this rate recorded and is left to its
// walker, unless that went silent (ReslotStale): then this call takes the
// walk over and returns the sink. A store with a shard in layout 1 keeps its waiting messages in
// its due sets, which Reslot does not walk: there the rates are only
// recorded, the clocks left running (the next slots follow those given),
// and layout1 is true.
func (s *Store) ChangedRates(ctx context.Context, rates map[string]float64) (changed []string, layout1 bool, err error) {
	for i := range s.shards {
		layout1 = layout1 || s.layouts[i].Load() == Layout1
	}
	for _, name := range slices.Sorted(maps.Keys(rates)) {
		walk, err := s.changeRate(ctx, name, formatRate(rates[name]), layout1)
		if err != nil {
			return changed, layout1, fmt.Errorf("store.changed_rates %s: %w", name, err)
		}
		if walk {
			changed = append(changed, name)
		}
	}
	return changed, layout1, nil
}

// changeRate records want as sink's rate, in a transaction on the sinks
// hash so that of instances starting together one makes the change, and
// reports whether the sink's waiting messages are to be walked.
func (s *Store) changeRate(ctx context.Context, sink, want string, layout1 bool) (walk bool, err error) {
	key := s.keys.Sinks()
	for range 10 {
		err = s.rdb.Watch(ctx, func(tx *redis.Tx) error {
			walk = false
			v, err := tx.HMGet(ctx, key, rateField(sink), reslotField(sink), pausedField(sink)).Result()
			if err != nil {
				return err
			}
			was, _ := v[0].(string)
			mark, _ := v[1].(string)
			_, paused := v[2].(string)
			if mark == "" && was == want {
				return nil
			}
			now := time.Now()
			// A walk under way is left to its walker, or taken over once
			// that is silent; with none, a change is walked when the clock
			// runs (read apart: its key is of another slot on a Cluster;
			// it is stopped after the transaction). Layout 1 is not walked.
			stale := mark != "" && staleMark(mark, now)
			var n int64
			if mark == "" && !layout1 {
				if n, err = s.rdb.Exists(ctx, s.keys.Rate(sink)).Result(); err != nil {
					return err
				}
			}
			how := "resume"
			if paused {
				how = "keep"
			}
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.HSet(ctx, key, rateField(sink), want)
				switch {
				case stale:
					takeOver(ctx, p, key, sink, mark, now)
				case n > 0:
					p.HSet(ctx, key, reslotField(sink), how+":"+strconv.FormatInt(now.UnixMilli(), 10), pausedField(sink), "1")
				}
				return nil
			})
			walk = err == nil && (stale || n > 0)
			return err
		}, key)
		if !errors.Is(err, redis.TxFailedErr) {
			break
		}
	}
	if err != nil || !walk {
		return false, err
	}
	return true, s.rdb.Del(ctx, s.keys.Rate(sink)).Err()
}

// Reslot moves every message of sink that waits for a max_rate slot back
// to its due time, where, the sink being paused (ChangedRates), claims
// hold it; then it resumes the sink, unless it was paused before the
// change, and clears the mark: the held messages are released (by
// priority, then in due order) and take slots at the new rate. It walks
// each shard's slot sets in calls of reslotBatch entries, in (slot, ID)
// order, so that what claims take out meanwhile makes it pass over
// nothing, and says it is alive in the mark every second.
//
// It returns ErrWalkGone when the mark is gone: another instance ended the
// walk (it took it over while this one was cut off from Redis).
func (s *Store) Reslot(ctx context.Context, sink string) (moved int, err error) {
	switch n, err := s.rdb.HExists(ctx, s.keys.Sinks(), reslotField(sink)).Result(); {
	case err != nil:
		return 0, fmt.Errorf("store.reslot %s: %w", sink, err)
	case !n:
		return 0, ErrWalkGone
	}
	// Stopped again (ChangedRates did, unless it failed, and an instance
	// of the previous release may have started it since).
	if err := s.rdb.Del(ctx, s.keys.Rate(sink)).Err(); err != nil {
		return 0, fmt.Errorf("store.reslot %s: %w", sink, err)
	}
	alive := time.Now()
	for shard := range s.shards {
		p, cs, cid := MaxPriority, "", ""
		for p >= 0 {
			res, err := s.run(ctx, "reslot", reslotScript, shard, sink, p, cs, cid, reslotBatch).Slice()
			if err != nil {
				return moved, fmt.Errorf("store.reslot %s: shard %d: %w", sink, shard, err)
			}
			if len(res) != 4 {
				return moved, fmt.Errorf("store.reslot %s: shard %d: unexpected reply of %d items", sink, shard, len(res))
			}
			moved += int(toInt64(res[0]))
			p = int(toInt64(res[1]))
			cs, _ = res[2].(string)
			cid, _ = res[3].(string)
			if reslotBetween != nil && p >= 0 {
				reslotBetween()
			}
			if time.Since(alive) > time.Second {
				alive = time.Now()
				if err := s.markAlive(ctx, sink, alive); err != nil {
					return moved, err
				}
			}
		}
	}
	if walkEnding != nil {
		walkEnding()
	}
	if _, err := s.walkMark(ctx, sink, "end"); err != nil {
		return moved, fmt.Errorf("store.reslot %s: %w", sink, err)
	}
	return moved, nil
}

// walkMarkScript reads and writes a walk's mark with the pause that
// depends on it, in one step.
var walkMarkScript = loadScript("walkmark")

// walkMark runs lua/walkmark.lua's action what for sink; false when the mark
// was gone (alive, end).
func (s *Store) walkMark(ctx context.Context, sink, what string, args ...any) (bool, error) {
	n, err := s.runDeployment(ctx, "walkmark", walkMarkScript, []string{s.keys.Sinks()},
		append([]any{reslotField(sink), pausedField(sink), what}, args...)...).Int()
	return n == 1, err
}

// staleMark reports whether a walk's mark (reslotField) went without a
// word from its walker for ReslotStale.
func staleMark(mark string, now time.Time) bool {
	_, at, _ := strings.Cut(mark, ":")
	ms, _ := strconv.ParseInt(at, 10, 64)
	return now.Sub(time.UnixMilli(ms)) >= ReslotStale
}

// takeOver makes the walk of mark this instance's: the mark says it is
// alive, and the sink is paused again when the change paused it (an
// operator may have resumed it meanwhile: the walk needs it paused).
func takeOver(ctx context.Context, p redis.Pipeliner, key, sink, mark string, now time.Time) {
	how, _, _ := strings.Cut(mark, ":")
	p.HSet(ctx, key, reslotField(sink), how+":"+strconv.FormatInt(now.UnixMilli(), 10))
	if how == "resume" {
		p.HSet(ctx, key, pausedField(sink), "1")
	}
}

// TakeOverWalks takes over the walks of the given sinks whose walker went
// silent (it stopped during its wait or its walk, leaving the sink
// paused), each in a transaction, so that one instance does; the caller
// then calls Reslot for each returned. Running instances call it now and
// then: a sink is never left paused by a walk that nobody ends.
func (s *Store) TakeOverWalks(ctx context.Context, sinks []string) (taken []string, err error) {
	key := s.keys.Sinks()
	for _, sink := range sinks {
		var mine bool
		err = s.rdb.Watch(ctx, func(tx *redis.Tx) error {
			mine = false
			mark, err := tx.HGet(ctx, key, reslotField(sink)).Result()
			if errors.Is(err, redis.Nil) || (err == nil && !staleMark(mark, time.Now())) {
				return nil
			}
			if err != nil {
				return err
			}
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				takeOver(ctx, p, key, sink, mark, time.Now())
				return nil
			})
			mine = err == nil
			return err
		}, key)
		if errors.Is(err, redis.TxFailedErr) {
			err = nil // another instance took it
		}
		if err != nil {
			return taken, fmt.Errorf("store.take_over_walks %s: %w", sink, err)
		}
		if mine {
			taken = append(taken, sink)
		}
	}
	return taken, nil
}

// ReslotAlive says in sink's mark that its walk goes on (its walker waits
// for the instances to apply the pause, or walks).
func (s *Store) ReslotAlive(ctx context.Context, sink string) error {
	return s.markAlive(ctx, sink, time.Now())
}

// ErrWalkGone is Reslot's and ReslotAlive's error when the walk's mark is
// gone: another instance ended the walk.
var ErrWalkGone = errors.New("store: the walk of the changed max_rate was ended by another instance")

// markAlive says in sink's mark that its walk goes on.
func (s *Store) markAlive(ctx context.Context, sink string, now time.Time) error {
	switch alive, err := s.walkMark(ctx, sink, "alive", now.UnixMilli()); {
	case err != nil:
		return fmt.Errorf("store.reslot %s: %w", sink, err)
	case !alive:
		return ErrWalkGone
	}
	return nil
}
