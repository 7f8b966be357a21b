package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// HoldBand is the width of a sink's hold band in a due set (see Keys): a
// message held for the sink with band index k has the score
// HoldBand*(1+k) + its due time. It is 2^42 ms, about 139 years: due times
// are below it until 2109 (envelope.Parse refuses later ones), and 2047
// bands fit below 2^53, where a float64 score stops being exact.
const HoldBand int64 = 1 << 42

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

// SinkState is what Redis records of a sink for every instance.
type SinkState struct {
	Band   int  // index of the sink's hold band
	Paused bool // POST /v1/sinks/{name}/pause, kept until resumed
}

// bandsScript gives every named sink a hold band index (once: an index
// never changes) and returns every sink's state.
//
//	KEYS[1] -> the sinks hash (Keys.Sinks)
//	ARGV    -> sink names
//	returns -> the hash's fields and values, flat
var bandsScript = redis.NewScript(`
for _, name in ipairs(ARGV) do
  if redis.call('HEXISTS', KEYS[1], 'index:' .. name) == 0 then
    local n = redis.call('HINCRBY', KEYS[1], 'bands', 1) - 1
    redis.call('HSET', KEYS[1], 'index:' .. name, n)
  end
end
return redis.call('HGETALL', KEYS[1])
`)

// SinkStates registers the named sinks (a hold band each, kept in Redis
// for every instance) and returns the state of every sink Redis knows.
func (s *Store) SinkStates(ctx context.Context, names []string) (map[string]SinkState, error) {
	args := make([]any, len(names))
	for i, n := range names {
		args[i] = n
	}
	res, err := bandsScript.Run(ctx, s.rdb, []string{s.keys.Sinks()}, args...).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("store.sink_states: %w", err)
	}
	out := map[string]SinkState{}
	for i := 0; i+1 < len(res); i += 2 {
		field, value := res[i], res[i+1]
		switch {
		case strings.HasPrefix(field, "index:"):
			name := strings.TrimPrefix(field, "index:")
			st := out[name]
			st.Band, _ = strconv.Atoi(value)
			out[name] = st
		case strings.HasPrefix(field, "paused:"):
			name := strings.TrimPrefix(field, "paused:")
			st := out[name]
			st.Paused = value == "1"
			out[name] = st
		}
	}
	for name, st := range out {
		if st.Band >= MaxBands {
			return nil, fmt.Errorf("store.sink_states: sink %q has hold band %d, over the %d there is room for", name, st.Band, MaxBands)
		}
	}
	return out, nil
}

// SetPaused pauses or resumes a sink for every instance, kept across
// restarts.
func (s *Store) SetPaused(ctx context.Context, sink string, paused bool) error {
	var err error
	if paused {
		err = s.rdb.HSet(ctx, s.keys.Sinks(), "paused:"+sink, "1").Err()
	} else {
		err = s.rdb.HDel(ctx, s.keys.Sinks(), "paused:"+sink).Err()
	}
	if err != nil {
		return fmt.Errorf("store.set_paused %s: %w", sink, err)
	}
	return nil
}

// putBackScript puts messages of a lease back at the scores given, their
// attempt not counted: Hold parks them in their sink's hold band, Defer at
// their publish slot.
//
//	KEYS[1..16] -> the shard's keys
//	ARGV[1] -> the lease's expiry (Lease.ExpiryMs)
//	ARGV[2..] -> pairs: message ID, score
//	returns -> how many were put back (those still held under the lease)
var putBackScript = newFiringScript(`
local expiry = tonumber(ARGV[1])
local top = maxprio()
local n = 0
for i = 2, #ARGV, 2 do
  local ok, p = claimedby(ARGV[i], expiry, top)
  if ok then
    redis.call('ZADD', zkey(p), ARGV[i + 1], ARGV[i])
    n = n + 1
  end
end
return n
`)

// putBack runs putBackScript for pairs (ID, score) of lease l.
func (s *Store) putBack(ctx context.Context, op string, l *Lease, pairs []any) (int, error) {
	n, err := s.run(ctx, op, putBackScript, l.Shard, append([]any{l.ExpiryMs}, pairs...)...).Int()
	if err != nil {
		return 0, fmt.Errorf("store.%s shard %d: %w", op, l.Shard, err)
	}
	return n, nil
}

// Unavailable is a message of a lease whose sink could not take it.
type Unavailable struct {
	ID    string
	Band  int       // the sink's hold band index
	DueAt time.Time // its due time, kept as its place in the band
}

// Hold puts messages of a lease back, held for their sinks, without
// counting the attempt: the sink was down, not the message at fault.
func (s *Store) Hold(ctx context.Context, l *Lease, us []Unavailable) (int, error) {
	if len(us) == 0 {
		return 0, nil
	}
	pairs := make([]any, 0, 2*len(us))
	for _, u := range us {
		pairs = append(pairs, u.ID, heldScore(u.Band, u.DueAt))
	}
	return s.putBack(ctx, "hold", l, pairs)
}

func heldScore(band int, due time.Time) int64 {
	return HoldBand*int64(1+band) + max(0, min(ms(due), HoldBand-1))
}

// releaseScript moves held messages of a sink back to their due times,
// earliest first.
//
//	KEYS[1..16] -> the shard's keys
//	ARGV[1] -> the sink's band index
//	ARGV[2] -> at most this many
//	returns -> how many were moved
var releaseScript = newFiringScript(`
local base = HOLDBAND * (1 + tonumber(ARGV[1]))
local left = tonumber(ARGV[2])
for p = maxprio(), 0, -1 do
  if left == 0 then break end
  local key = zkey(p)
  local ids = redis.call('ZRANGEBYSCORE', key, base, '(' .. (base + HOLDBAND), 'WITHSCORES', 'LIMIT', 0, left)
  for i = 1, #ids, 2 do
    redis.call('ZADD', key, tonumber(ids[i + 1]) - base, ids[i])
    left = left - 1
  end
end
return tonumber(ARGV[2]) - left
`)

// Release moves up to max messages held for the sink with band index band
// back to their due times in a shard, earliest first, and returns how many.
func (s *Store) Release(ctx context.Context, shard, band, max int) (int, error) {
	n, err := s.run(ctx, "release", releaseScript, shard, band, max).Int()
	if err != nil {
		return 0, fmt.Errorf("store.release shard %d: %w", shard, err)
	}
	return n, nil
}

// Slot is a message of a lease given the publish slot At.
type Slot struct {
	ID string
	At time.Time
}

// Defer puts messages of a lease back until their publish slots: each
// waits at score slot + .25, which Claim reports as Slotted.
func (s *Store) Defer(ctx context.Context, l *Lease, slots []Slot) (int, error) {
	if len(slots) == 0 {
		return 0, nil
	}
	pairs := make([]any, 0, 2*len(slots))
	for _, sl := range slots {
		pairs = append(pairs, sl.ID, strconv.FormatInt(ms(sl.At), 10)+".25")
	}
	return s.putBack(ctx, "defer", l, pairs)
}

// slotsScript allots publish slots of one sink, shared by every instance:
// a generic cell rate algorithm whose state is the next free slot.
//
//	KEYS[1] -> the sink's rate key (Keys.Rate)
//	ARGV[1] -> slots wanted
//	ARGV[2] -> interval between slots in µs (1e6 / max_rate)
//	returns -> {now µs, first slot µs}: slot i (from 0) is first + i*interval
var slotsScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local n, interval = tonumber(ARGV[1]), tonumber(ARGV[2])
local first = tonumber(redis.call('GET', KEYS[1]) or '0')
if first < now - interval then first = now - interval end
redis.call('SET', KEYS[1], first + n * interval, 'PX', math.max(1000, math.ceil((first + n * interval - now) / 1000) + 1000))
return {now, first}
`)

// Slots allots n publish slots of sink at maxRate messages per second,
// shared by every instance through Redis, and returns their times in order
// (Redis's clock). A slot at or before the returned now may be used at
// once. One slot's worth of burst is allowed.
func (s *Store) Slots(ctx context.Context, sink string, n int, maxRate float64) (now time.Time, slots []time.Time, err error) {
	if n <= 0 || maxRate <= 0 {
		return time.Time{}, nil, errors.New("store.slots: n and maxRate must be positive")
	}
	interval := int64(1e6 / maxRate)
	res, err := slotsScript.Run(ctx, s.rdb, []string{s.keys.Rate(sink)}, n, max(interval, 1)).Int64Slice()
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
