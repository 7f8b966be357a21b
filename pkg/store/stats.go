package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
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
	// Sources is what each source (an ingest by name, "" the admin API)
	// holds, from the shards' tallies (Keys.Tally); Uncounted lists the
	// shards whose tally was never made (Census), which Sources leaves out.
	Sources   map[string]SourceStats
	Uncounted []int
	// Unanswered lists the shards StatsAnswering left out (their master
	// out of reach or in a failover), with the error of the last of them;
	// Stats leaves none out.
	Unanswered    []int
	UnansweredErr error
	// BandsErr says that StatsAnswering counted the held messages of the
	// hold bands as last read: the sinks hash did not answer.
	BandsErr error
}

// SourceStats is what one source holds in the store.
type SourceStats struct {
	Live   int64 // messages parked, in flight or held (not dead): ingest[].max_parked
	Series int64 // live recurring series: ingest[].max_series
	Dead   int64 // dead messages: limits.max_dead_messages deletes the oldest of the source with the most first
}

// statsScript counts one shard.
// (lua/stats.lua has its KEYS, ARGV and reply.)
var statsScript = loadScript("stats")

// Stats counts parked, due and dead messages per shard, one script per
// shard in one pipeline: one round trip, as under a drain each waits behind
// the claims' scripts. Each shard is counted at Redis's time when its script
// runs; the pipeline is not a transaction, and under load the shards are
// counted a few microseconds apart (Stats.Now is the last of those times).
func (s *Store) Stats(ctx context.Context) (*Stats, error) { return s.stats(ctx, false) }

// StatsAnswering is Stats over the shards that answer: a shard whose
// master this process cannot reach, or that refuses for a state that
// passes (a failover: Passing), is left out of every count and listed in
// Stats.Unanswered, so that an operator sees the rest while one master of
// a Redis Cluster is down. It fails when no shard answers, or for any
// other error. What bounds or alerts on the counts reads Stats, which
// counts every shard or fails.
func (s *Store) StatsAnswering(ctx context.Context) (*Stats, error) { return s.stats(ctx, true) }

func (s *Store) stats(ctx context.Context, answering bool) (*Stats, error) {
	var bandsErr error
	bands, err := s.bandsInUse(ctx)
	if last, ok := s.bandsLastRead(); err != nil && answering && ok && (Passing(err) || Unreachable(err)) && ctx.Err() == nil {
		// The sinks hash's master is the one down: the hold bands as
		// last read (bands are only added, a new one is rare).
		bands, bandsErr, err = last, fmt.Errorf("store.stats: the sinks record did not answer, hold bands as last read: %w", err), nil
	}
	if err != nil {
		return nil, fmt.Errorf("store.stats: %w", err)
	}
	args := make([]any, 0, len(bucketBounds)+1)
	for _, b := range bucketBounds {
		args = append(args, b.Milliseconds())
	}
	args = append(args, bands)
	calls := make([]shardCall, s.shards)
	for i := range calls {
		calls[i] = shardCall{shard: i, args: args}
	}
	st := &Stats{Shards: make([]ShardStats, 0, s.shards), Sources: map[string]SourceStats{}}
	for i, cmd := range s.runEach(ctx, "stats", statsScript, calls) {
		reply, err := cmd.Slice()
		if err != nil && answering && (Passing(err) || Unreachable(err)) && ctx.Err() == nil {
			st.Unanswered = append(st.Unanswered, i)
			st.UnansweredErr = fmt.Errorf("store.stats shard %d: %w", i, err)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("store.stats shard %d: %w", i, err)
		}
		res, tally, err := statsReply(reply)
		if err != nil {
			return nil, fmt.Errorf("store.stats shard %d: %w", i, err)
		}
		if !st.addTally(tally) {
			st.Uncounted = append(st.Uncounted, i)
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
		st.Shards = append(st.Shards, ss)
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
	if len(st.Unanswered) == s.shards {
		return nil, st.UnansweredErr
	}
	st.BandsErr = bandsErr
	return st, nil
}

// statsReply splits lua/stats.lua's reply into its 13 counts and the shard's
// tally (field, value pairs).
func statsReply(reply []any) ([]int64, []any, error) {
	if len(reply) < 13 || (len(reply)-13)%2 != 0 {
		return nil, nil, fmt.Errorf("unexpected reply of %d items", len(reply))
	}
	res := make([]int64, 13)
	for j := range res {
		n, ok := reply[j].(int64)
		if !ok {
			return nil, nil, fmt.Errorf("item %d of the reply is %T, not an integer", j, reply[j])
		}
		res[j] = n
	}
	return res, reply[13:], nil
}

// addTally adds one shard's tally (field, value pairs: lua/lib/tally.lua) to
// Sources, and reports whether the shard was counted (its census made).
// A count below zero (a message counted out that a build before the
// census parked, had the census missed it) counts as zero.
func (st *Stats) addTally(tally []any) bool {
	counted := false
	for j := 0; j+1 < len(tally); j += 2 {
		field, _ := tally[j].(string)
		v, _ := tally[j+1].(string)
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			continue
		}
		kind, src, ok := strings.Cut(field, ":")
		switch {
		case field == "census":
			counted = true
		case !ok:
		case kind == "p":
			ss := st.Sources[src]
			ss.Live += max(n, 0)
			st.Sources[src] = ss
		case kind == "s":
			ss := st.Sources[src]
			ss.Series += max(n, 0)
			st.Sources[src] = ss
		case kind == "d":
			ss := st.Sources[src]
			ss.Dead += max(n, 0)
			st.Sources[src] = ss
		}
	}
	return counted
}

// censusScript counts what each source holds in a shard from its messages.
// (lua/census.lua has its KEYS, ARGV and reply.)
var censusScript = loadScript("census")

// Census makes the tally of every shard that has none (Keys.Tally: what
// each source holds, for the per-ingest bounds) from the shard's messages,
// and returns how many shards it counted; again makes it anew on every
// shard (after a build that does not keep the tally wrote beside this
// one). The scripts keep a tally once it is made; a shard's census reads
// all its messages in one script, which Redis runs alone (about 6 µs a
// message: 0.65 s for 100,000 in one shard, measured by hand with a
// redis-server 7.0 on the 2-core test machine).
func (s *Store) Census(ctx context.Context, again bool) (int, error) {
	shards := make([]int, s.shards)
	for i := range shards {
		shards[i] = i
	}
	if !again {
		st, err := s.Stats(ctx)
		if err != nil {
			return 0, err
		}
		shards = st.Uncounted
	}
	for _, shard := range shards {
		if err := s.run(ctx, "census", censusScript, shard).Err(); err != nil {
			return 0, fmt.Errorf("store.census shard %d: %w", shard, err)
		}
	}
	return len(shards), nil
}
