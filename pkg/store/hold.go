package store

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// HoldBand is the width of a sink's hold band in a due set (see Keys): a
// message held for the sink with band index k has the score
// HoldBand*(1+k) + its due time. It is 2^42 ms, about 139 years: due times
// are below it until 2109 (envelope.Parse refuses later ones), and 2047
// bands fit below 2^53, where a float64 score stops being exact.
const HoldBand int64 = envelope.MaxDueMs

// MaxBands is how many sinks can have a hold band.
const MaxBands = 2047

// Held reports whether a due-set score is in a hold band, and then the due
// time it stands for.
func Held(score float64) (bool, time.Time) {
	if score < float64(HoldBand) {
		return false, time.Time{}
	}
	return true, time.UnixMilli(int64(score) % HoldBand)
}

// Unavailable is a message of a lease whose sink could not take it.
type Unavailable struct {
	ID    string
	Band  int       // the sink's hold band index
	DueAt time.Time // its due time, kept as its place in the band
}

// Hold puts messages of a lease back, held for their sinks, without
// counting the attempt (the sink was down, not the message at fault):
// Settle with Hold alone.
func (s *Store) Hold(ctx context.Context, l *Lease, us []Unavailable) (int, error) {
	r, err := s.settleOne(ctx, Settlement{Lease: l, Hold: us})
	return r.PutBack, err
}

func heldScore(band int, due time.Time) int64 {
	return bandBase(band) + max(0, min(ms(due), HoldBand-1))
}

// bandBase is the lowest score of hold band index band.
func bandBase(band int) int64 { return HoldBand * int64(1+band) }

// releaseScript moves held messages of a sink back to their due times,
// highest priority first and earliest first within one.
// (lua/release.lua has its KEYS, ARGV and reply.)
var releaseScript = loadScript("release")

// Release moves up to max messages held for the sink with band index band
// back to their due times in a shard, highest priority first and earliest
// first within one, and returns how many.
func (s *Store) Release(ctx context.Context, shard, band, max int) (int, error) {
	n, err := s.run(ctx, "release", releaseScript, shard, band, max).Int()
	if err != nil {
		return 0, fmt.Errorf("store.release shard %d: %w", shard, err)
	}
	return n, nil
}

// ReleaseAll moves every held message of the sink with band index band
// back to its due time, in every shard, at most max per script call, and
// returns how many. One pipeline of a ZCOUNT of the band per due set (in
// layout 2, a ZCARD of each of the band's held sets) finds the shards that
// hold any first: the gate releases every sink that can take messages each
// scheduler.max_sleep, and a sink with nothing held, the common case, then
// costs one round trip and no script.
//
// A shard whose look failed (its Redis node down, on a Cluster) is left
// for the next call; the others are released, and the first error is
// returned.
func (s *Store) ReleaseAll(ctx context.Context, band, max int) (int, error) {
	lo := bandBase(band)
	from, to := strconv.FormatInt(lo, 10), "("+strconv.FormatInt(lo+HoldBand, 10)
	counts := make([][]*redis.IntCmd, s.shards)
	pipe := s.rdb.Pipeline()
	for sh := range s.shards {
		// Held messages counted in both layouts' keys: a migrate by another
		// process changes a shard's layout without a word to this Store.
		// Release then runs in the layout the shard is in.
		for _, key := range s.keys.HeldSets(sh, band) {
			// one key per command: a command of several keys is refused
			// (TRYAGAIN) while Redis Cluster moves their slot, where one
			// of a single key is redirected (ASK)
			counts[sh] = append(counts[sh], pipe.ZCard(ctx, key))
		}
		for _, key := range s.keys.DueSets(sh) {
			counts[sh] = append(counts[sh], pipe.ZCount(ctx, key, from, to))
		}
	}
	_, _ = pipe.Exec(ctx) // each command's error is read below
	total := 0
	var first error
	for sh, cs := range counts {
		var held int64
		for _, c := range cs {
			if err := c.Err(); err != nil {
				first = cmp.Or(first, fmt.Errorf("store.release shard %d: looking for held messages: %w", sh, err))
				held = 0
				break
			}
			held += c.Val()
		}
		for held > 0 {
			n, err := s.Release(ctx, sh, band, max)
			total += n
			if err != nil {
				first = cmp.Or(first, err)
				break
			}
			if n < max {
				break
			}
		}
	}
	return total, first
}

// heldCountScript counts a shard's messages held in each hold band given.
// (lua/heldcount.lua has its KEYS, ARGV and reply.)
var heldCountScript = loadScript("heldcount")

// HeldBySink counts, per sink (name -> hold band index, from SinkStates),
// the messages held in its band: due, and waiting because the sink is
// paused or down. A sink that takes messages holds none. One script per
// shard, in one pipeline; each count is a ZCOUNT per due set.
func (s *Store) HeldBySink(ctx context.Context, bands map[string]int) (map[string]int64, error) {
	out := make(map[string]int64, len(bands))
	if len(bands) == 0 {
		return out, nil
	}
	names := make([]string, 0, len(bands))
	args := make([]any, 0, len(bands))
	for name, b := range bands {
		names = append(names, name)
		args = append(args, b)
		out[name] = 0
	}
	calls := make([]shardCall, s.shards)
	for i := range calls {
		calls[i] = shardCall{shard: i, args: args}
	}
	for i, cmd := range s.runEach(ctx, "held_count", heldCountScript, calls) {
		res, err := cmd.Int64Slice()
		if err != nil {
			return nil, fmt.Errorf("store.held_by_sink shard %d: %w", i, err)
		}
		if len(res) != len(names) {
			return nil, fmt.Errorf("store.held_by_sink shard %d: unexpected reply of %d items", i, len(res))
		}
		for j, n := range res {
			out[names[j]] += n
		}
	}
	return out, nil
}
