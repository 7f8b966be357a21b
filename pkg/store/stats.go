package store

import (
	"context"
	"fmt"
	"time"
)

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
	Series int64 // live recurring series (limits.max_series)
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
// (lua/stats.lua has its KEYS, ARGV and reply.)
var statsScript = loadScript("stats")

// Stats counts parked, due and dead messages per shard, one script per
// shard in one pipeline: one round trip, as under a drain each waits behind
// the claims' scripts. Each shard is counted at Redis's time when its script
// runs; the pipeline is not a transaction, and under load the shards are
// counted a few microseconds apart (Stats.Now is the last of those times).
func (s *Store) Stats(ctx context.Context) (*Stats, error) {
	args := make([]any, 0, len(bucketBounds))
	for _, b := range bucketBounds {
		args = append(args, b.Milliseconds())
	}
	calls := make([]shardCall, s.shards)
	for i := range calls {
		calls[i] = shardCall{shard: i, args: args}
	}
	st := &Stats{Shards: make([]ShardStats, s.shards)}
	for i, cmd := range s.runEach(ctx, "stats", statsScript, calls) {
		res, err := cmd.Int64Slice()
		if err != nil {
			return nil, fmt.Errorf("store.stats shard %d: %w", i, err)
		}
		if len(res) != 13 {
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
		st.Series += res[11]
		if now := time.UnixMilli(res[12]); now.After(st.Now) {
			st.Now = now
		}
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
