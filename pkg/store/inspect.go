package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// State of a known message.
const (
	StateScheduled = "scheduled" // waiting for its due time (or its next attempt)
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
	Held        bool              // scheduled, and held because its sink is down or paused
	DeadAt      time.Time         // dead: when it died
	Reason      string            // dead: why; scheduled after a failure: the last error
	Shard       int
	EncodedSize int
}

// inspectScript reads everything known about one message.
//
//	KEYS[1] -> pool, KEYS[3] -> meta, KEYS[4] -> dead, the due sets
//	ARGV[1] -> message ID
//	returns -> {now, due score or false, dead score or false, meta or false, message or false}
var inspectScript = newScript(`
local id = ARGV[1]
local score = duescore(id)
return {servertime(), score, redis.call('ZSCORE', KEYS[4], id),
        redis.call('HGET', KEYS[3], id), redis.call('HGET', KEYS[1], id)}
`)

// Inspect returns what is known of a message, or ErrNotFound.
func (s *Store) Inspect(ctx context.Context, id string) (*Info, error) {
	shard := s.ShardOf(id)
	res, err := s.run(ctx, "inspect", inspectScript, shard, id).Slice()
	if err != nil {
		return nil, fmt.Errorf("store.inspect shard %d: %w", shard, err)
	}
	if len(res) != 5 {
		return nil, fmt.Errorf("store.inspect shard %d: unexpected reply of %d items", shard, len(res))
	}
	blob, ok := toString(res[4])
	if !ok {
		return nil, ErrNotFound
	}
	now := toInt64(res[0])
	info := &Info{ID: id, Shard: shard, EncodedSize: len(blob)}
	info.Message, info.Err = s.decode(id, blob)
	var deadAt int64
	if m, ok := toString(res[3]); ok {
		info.Attempts, deadAt, info.Reason = parseMeta(m)
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
			info.Held, info.NextAt = true, due
			break
		}
		if score != math.Trunc(score) && score > float64(now) { // a lease (.5) not yet expired
			info.State = StateInflight
			info.Attempts++ // the one under way
		}
	default:
		return nil, ErrNotFound // a pool entry in neither set: being removed
	}
	return info, nil
}

// cancelScript forgets a message, whatever its state.
//
//	KEYS[1] -> pool, KEYS[3] -> meta, KEYS[4] -> dead, the due sets
//	ARGV[1] -> message ID
//	returns -> 1 if it was known, 0 if not
var cancelScript = newFiringScript(`
local id = ARGV[1]
local blob = redis.call('HGET', KEYS[1], id)
if not blob then return 0 end
unschedule(id)
redis.call('ZREM', KEYS[4], id)
forget(id, blob)
return 1
`)

// Cancel deletes a parked or dead message. It returns ErrNotFound for an
// unknown ID. A message already in flight may still be published once: the
// publish was under way when it was cancelled.
func (s *Store) Cancel(ctx context.Context, id string) error {
	shard := s.ShardOf(id)
	n, err := s.run(ctx, "cancel", cancelScript, shard, id).Int()
	if err != nil {
		return fmt.Errorf("store.cancel shard %d: %w", shard, err)
	}
	if n == 0 {
		return ErrNotFound
	}
	return nil
}

// reviveScript schedules a dead message again, due now, with its attempt
// count reset.
//
//	KEYS[1] -> pool, KEYS[3] -> meta, KEYS[4] -> dead, the due sets
//	ARGV[1] -> message ID
//	returns -> 1 if it was dead and is scheduled now, 0 if it was not dead
var reviveScript = newFiringScript(`
local id = ARGV[1]
if not redis.call('ZSCORE', KEYS[4], id) then return 0 end
redis.call('ZREM', KEYS[4], id)
local _, _, p = meta(redis.call('HGET', KEYS[3], id))
redis.call('HDEL', KEYS[3], id)
if redis.call('HEXISTS', KEYS[1], id) == 0 then return 0 end
redis.call('ZADD', zkey(p), servertime(), id)
return 1
`)

// RetryDead schedules a dead message again, due now. It returns ErrNotFound
// when the ID is not a dead message.
func (s *Store) RetryDead(ctx context.Context, id string) error {
	shard := s.ShardOf(id)
	n, err := s.run(ctx, "revive", reviveScript, shard, id).Int()
	if err != nil {
		return fmt.Errorf("store.retry_dead shard %d: %w", shard, err)
	}
	if n == 0 {
		return ErrNotFound
	}
	return nil
}

// deleteDeadScript deletes a message only if it is dead.
//
//	KEYS[1] -> pool, KEYS[3] -> meta, KEYS[4] -> dead
//	ARGV[1] -> message ID
//	returns -> 1 if it was dead and is deleted, 0 if it was not dead
var deleteDeadScript = newFiringScript(`
local id = ARGV[1]
if redis.call('ZREM', KEYS[4], id) == 0 then return 0 end
forget(id, redis.call('HGET', KEYS[1], id))
return 1
`)

// DeleteDead deletes a dead message. It returns ErrNotFound when the ID is
// not a dead message; a parked or in-flight message is left alone.
func (s *Store) DeleteDead(ctx context.Context, id string) error {
	shard := s.ShardOf(id)
	n, err := s.run(ctx, "delete_dead", deleteDeadScript, shard, id).Int()
	if err != nil {
		return fmt.Errorf("store.delete_dead shard %d: %w", shard, err)
	}
	if n == 0 {
		return ErrNotFound
	}
	return nil
}

// listDeadScript reads the newest dead messages of a shard.
//
//	KEYS[1] -> pool, KEYS[3] -> meta, KEYS[4] -> dead
//	ARGV[1] -> at most this many
//	returns -> {id1, meta1, message1, id2, ...}, newest first
var listDeadScript = newScript(`
local ids = redis.call('ZREVRANGE', KEYS[4], 0, tonumber(ARGV[1]) - 1)
local out = {}
for _, id in ipairs(ids) do
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGET', KEYS[3], id)
  out[#out + 1] = redis.call('HGET', KEYS[1], id)
end
return out
`)

// ListDead returns up to limit dead messages, newest first.
func (s *Store) ListDead(ctx context.Context, limit int) ([]*Info, error) {
	if limit <= 0 {
		limit = 100
	}
	calls := make([]shardCall, s.shards)
	for i := range calls {
		calls[i] = shardCall{shard: i, args: []any{limit}}
	}
	var out []*Info
	for c, cmd := range s.runEach(ctx, "list_dead", listDeadScript, calls) {
		res, err := cmd.Slice()
		if err != nil {
			return nil, fmt.Errorf("store.list_dead shard %d: %w", c, err)
		}
		for i := 0; i+2 < len(res); i += 3 {
			id, _ := toString(res[i])
			info := &Info{ID: id, State: StateDead, Shard: c}
			if m, ok := toString(res[i+1]); ok {
				var deadAt int64
				info.Attempts, deadAt, info.Reason = parseMeta(m)
				info.DeadAt = time.UnixMilli(deadAt)
			}
			if blob, ok := toString(res[i+2]); ok {
				info.EncodedSize = len(blob)
				info.Message, info.Err = s.decode(id, blob)
			}
			out = append(out, info)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].DeadAt.After(out[j].DeadAt) })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// purgeDeadScript deletes up to ARGV[1] dead messages of a shard.
//
//	KEYS[1] -> pool, KEYS[3] -> meta, KEYS[4] -> dead
//	ARGV[1] -> at most this many
//	returns -> how many were deleted
var purgeDeadScript = newFiringScript(`
local ids = redis.call('ZRANGE', KEYS[4], 0, tonumber(ARGV[1]) - 1)
for _, id in ipairs(ids) do forget(id, redis.call('HGET', KEYS[1], id)) end
if #ids > 0 then redis.call('ZREM', KEYS[4], unpack(ids)) end
return #ids
`)

// PurgeDead deletes every dead message and returns how many.
func (s *Store) PurgeDead(ctx context.Context) (int, error) {
	total := 0
	for shard := 0; shard < s.shards; shard++ {
		for {
			n, err := s.run(ctx, "purge_dead", purgeDeadScript, shard, 1000).Int()
			if err != nil {
				return total, fmt.Errorf("store.purge_dead shard %d: %w", shard, err)
			}
			total += n
			if n < 1000 {
				break
			}
		}
	}
	return total, nil
}

// ShardStats counts one shard.
type ShardStats struct {
	Shard  int   `json:"shard"`
	Parked int64 `json:"parked"` // scheduled and in flight
	Due    int64 `json:"due"`    // parked with a score <= now
	Dead   int64 `json:"dead"`
	// OldestDue is the lowest score of the shard when it is due (zero otherwise).
	OldestDue time.Time `json:"-"`
}

// DueIn counts parked messages by when their score comes due, relative to
// the Redis server's time: each message is in exactly one bucket. An in-flight
// message counts by its lease expiry, when it is retried if its publish is not
// confirmed.
type DueIn struct {
	Overdue int64 `json:"overdue"` // score <= now
	Minute  int64 `json:"minute"`  // now < score <= now+1m
	Hour    int64 `json:"hour"`    // now+1m < score <= now+1h
	Day     int64 `json:"day"`     // now+1h < score <= now+24h
	Later   int64 `json:"later"`   // score > now+24h
}

// Forecast counts parked messages by the window they come due within, from
// the Redis server's time: each count includes the messages already due,
// and the shorter windows' (what fires within 5 minutes includes what fires
// within 1). Later is what comes due after 24 hours. Held messages (their
// sink down or paused) count by their due times.
type Forecast struct {
	Minute      int64 `json:"1m"`
	FiveMinutes int64 `json:"5m"`
	Hour        int64 `json:"1h"`
	Day         int64 `json:"24h"`
	Later       int64 `json:"later"`
}

// bucketBounds are the upper bounds of the due-time buckets after the
// overdue one, as offsets from now; the last bucket has none.
var bucketBounds = []time.Duration{time.Minute, 5 * time.Minute, time.Hour, 24 * time.Hour}

// Stats counts every shard.
type Stats struct {
	Now    time.Time
	Parked int64
	Due    int64
	Dead   int64
	Held   int64 // parked and held for a sink that is down or paused
	Shards []ShardStats
	// OldestDue is the lowest due time over all shards that is <= now, zero
	// when nothing is due (held messages included).
	OldestDue time.Time
	// DueIn is the parked messages of all shards by due-time bucket; its
	// Overdue equals Due.
	DueIn DueIn
	// Forecast is the same by window.
	Forecast Forecast
}

// statsScript counts one shard.
//
//	KEYS[1..16] -> the shard's keys
//	ARGV[1] -> now (Unix ms, Redis time, the same for every shard)
//	ARGV[2..5] -> upper bounds of the buckets after overdue (1m, 5m, 1h, 24h)
//	ARGV[6] -> how many hold bands are in use
//	returns -> {parked, due, dead, oldest due or -1, held, then the six
//	           buckets: overdue, 1m, 5m, 1h, 24h, later}
var statsScript = newScript(`
local now = tonumber(ARGV[1])
local out = {0, 0, redis.call('ZCARD', KEYS[4]), -1, 0, 0, 0, 0, 0, 0, 0}
local bands = tonumber(ARGV[6])
for p = 0, maxprio() do
  local key = zkey(p)
  local n = redis.call('ZCARD', key)
  if n > 0 then
    out[1] = out[1] + n
    for b = 0, bands do
      local base = 0
      if b > 0 then base = HOLDBAND * b end
      local top = base + HOLDBAND
      if b > 0 then out[5] = out[5] + redis.call('ZCOUNT', key, base, '(' .. top) end
      local due = redis.call('ZCOUNT', key, base, base + now)
      if b == 0 then due = due + redis.call('ZCOUNT', key, '-inf', '(0') end
      out[2] = out[2] + due
      out[6] = out[6] + due
      if due > 0 then
        local first = redis.call('ZRANGEBYSCORE', key, base, base + now, 'WITHSCORES', 'LIMIT', 0, 1)
        local score = tonumber(first[2]) - base
        if out[4] == -1 or score < out[4] then out[4] = score end
      end
      local lo = base + now
      for i = 2, 5 do
        local hi = base + tonumber(ARGV[i])
        out[5 + i] = out[5 + i] + redis.call('ZCOUNT', key, '(' .. lo, hi)
        lo = hi
      end
      out[11] = out[11] + redis.call('ZCOUNT', key, '(' .. lo, '(' .. top)
    end
  end
end
return out
`)

// Stats counts parked, due and dead messages per shard, one script per
// shard in one pipeline. The pipeline is not a transaction: under load the
// counts of different shards are read a few microseconds apart.
func (s *Store) Stats(ctx context.Context) (*Stats, error) {
	now, err := s.rdb.Time(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("store.stats: %w", err)
	}
	bands, err := s.rdb.HGet(ctx, s.keys.Sinks(), "bands").Int()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("store.stats: %w", err)
	}
	nowMs := now.UnixMilli()
	args := []any{nowMs}
	for _, b := range bucketBounds {
		args = append(args, nowMs+b.Milliseconds())
	}
	args = append(args, bands)
	calls := make([]shardCall, s.shards)
	for i := range calls {
		calls[i] = shardCall{shard: i, args: args}
	}
	st := &Stats{Now: now, Shards: make([]ShardStats, s.shards)}
	for i, cmd := range s.runEach(ctx, "stats", statsScript, calls) {
		res, err := cmd.Int64Slice()
		if err != nil {
			return nil, fmt.Errorf("store.stats shard %d: %w", i, err)
		}
		if len(res) != 11 {
			return nil, fmt.Errorf("store.stats shard %d: unexpected reply of %d items", i, len(res))
		}
		ss := ShardStats{Shard: i, Parked: res[0], Due: res[1], Dead: res[2]}
		if res[3] >= 0 {
			ss.OldestDue = time.UnixMilli(res[3])
			if st.OldestDue.IsZero() || ss.OldestDue.Before(st.OldestDue) {
				st.OldestDue = ss.OldestDue
			}
		}
		st.Parked += ss.Parked
		st.Due += ss.Due
		st.Dead += ss.Dead
		st.Held += res[4]
		st.Shards[i] = ss
		b := res[5:]
		st.DueIn.Overdue += b[0]
		st.DueIn.Minute += b[1]
		st.DueIn.Hour += b[2] + b[3]
		st.DueIn.Day += b[4]
		st.DueIn.Later += b[5]
		st.Forecast.Minute += b[0] + b[1]
		st.Forecast.FiveMinutes += b[0] + b[1] + b[2]
		st.Forecast.Hour += b[0] + b[1] + b[2] + b[3]
		st.Forecast.Day += b[0] + b[1] + b[2] + b[3] + b[4]
		st.Forecast.Later += b[5]
	}
	return st, nil
}
