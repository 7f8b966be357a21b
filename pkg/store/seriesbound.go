package store

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// noBound is the quota the series scripts read as no bound
// (lua/lib/series.lua, overseries).
const noBound = -1

// seriesQuotas are the quotas of limits.max_series and
// ingest[].max_series each shard's script applies to a new series, so
// that the bounds hold for the whole store and not shard by shard: the
// room a bound leaves (the bound less the live series of every shard) goes
// to the new series of the call in their order, and a shard may hold the
// bound less what the others hold and are given. Calls on other shards at
// the same time can pass a bound by what they add together, as Capacity's
// limits can.
type seriesQuotas struct {
	store   map[int]int64            // shard -> quota; nil: no bound
	sources map[int]map[string]int64 // shard -> source -> quota; absent: no bound
}

// seriesQuotasFor reads what msgs need (one pipeline: each shard's count
// of live series and its tally of the sources', and whether each
// recurring message is a series already), only when one of them recurs
// under a bound.
func (s *Store) seriesQuotasFor(ctx context.Context, msgs []*envelope.Message) (*seriesQuotas, error) {
	var recurring []*envelope.Message
	srcs := map[string]bool{}
	for _, m := range msgs {
		if m.Recur == nil || (s.maxSeries <= 0 && s.sourceSeries[m.Ingest] <= 0) {
			continue
		}
		recurring = append(recurring, m)
		if s.sourceSeries[m.Ingest] > 0 {
			srcs[m.Ingest] = true
		}
	}
	q := &seriesQuotas{}
	if len(recurring) == 0 {
		return q, nil
	}
	var fields []string
	var names []string
	for src := range srcs {
		names = append(names, src)
		fields = append(fields, "s:"+src)
	}
	pipe := s.rdb.Pipeline()
	cards := make([]*redis.IntCmd, s.shards)
	tallies := make([]*redis.SliceCmd, s.shards)
	for sh := range s.shards {
		cards[sh] = pipe.SCard(ctx, s.keys.Series(sh))
		if len(fields) > 0 {
			tallies[sh] = pipe.HMGet(ctx, s.keys.Tally(sh), fields...)
		}
	}
	member := make([]*redis.BoolCmd, len(recurring))
	for i, m := range recurring {
		member[i] = pipe.SIsMember(ctx, s.keys.Series(s.ShardOf(m.ID)), m.ID)
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return nil, fmt.Errorf("store: count the live recurring series: %w", err)
	}

	count := make([]int64, s.shards)
	var total int64
	for sh, c := range cards {
		count[sh] = c.Val()
		total += count[sh]
	}
	srcCount := map[string][]int64{}
	srcTotal := map[string]int64{}
	for sh, t := range tallies {
		if t == nil {
			continue
		}
		for i, v := range t.Val() {
			src := names[i]
			if srcCount[src] == nil {
				srcCount[src] = make([]int64, s.shards)
			}
			if str, ok := v.(string); ok {
				n, _ := strconv.ParseInt(str, 10, 64)
				srcCount[src][sh] = n
				srcTotal[src] += n
			}
		}
	}

	// The room each bound leaves goes to the call's new series in their
	// order; a shard may then hold the bound less what the other shards
	// hold and what the call gives them. (Its own count is left out: two
	// calls on one shard at once both count what the first adds.)
	room := s.maxSeries - total
	srcRoom := map[string]int64{}
	for src := range srcs {
		srcRoom[src] = s.sourceSeries[src] - srcTotal[src]
	}
	given := make([]int64, s.shards)
	var givenAll int64
	srcGiven := map[string][]int64{}
	srcGivenAll := map[string]int64{}
	seen := map[string]bool{}
	for i, m := range recurring {
		if member[i].Val() || seen[m.ID] {
			continue // a series already, or one more message of it in this call
		}
		seen[m.ID] = true
		bounded := srcs[m.Ingest]
		if (s.maxSeries > 0 && room <= 0) || (bounded && srcRoom[m.Ingest] <= 0) {
			continue
		}
		sh := s.ShardOf(m.ID)
		room--
		given[sh]++
		givenAll++
		if bounded {
			srcRoom[m.Ingest]--
			if srcGiven[m.Ingest] == nil {
				srcGiven[m.Ingest] = make([]int64, s.shards)
			}
			srcGiven[m.Ingest][sh]++
			srcGivenAll[m.Ingest]++
		}
	}
	if s.maxSeries > 0 {
		q.store = map[int]int64{}
		for sh := range s.shards {
			q.store[sh] = max(0, s.maxSeries-(total-count[sh])-(givenAll-given[sh]))
		}
	}
	q.sources = map[int]map[string]int64{}
	for sh := range s.shards {
		q.sources[sh] = map[string]int64{}
		for src := range srcs {
			var g int64
			if srcGiven[src] != nil {
				g = srcGiven[src][sh]
			}
			q.sources[sh][src] = max(0, s.sourceSeries[src]-(srcTotal[src]-srcCount[src][sh])-(srcGivenAll[src]-g))
		}
	}
	return q, nil
}

// storeQuota is shard's quota of limits.max_series: the most live series it
// may hold, or noBound.
func (q *seriesQuotas) storeQuota(shard int) int64 {
	if q.store == nil {
		return noBound
	}
	return q.store[shard]
}

// sourceQuota is shard's quota of src's ingest[].max_series, or noBound.
func (q *seriesQuotas) sourceQuota(shard int, src string) int64 {
	if v, ok := q.sources[shard][src]; ok {
		return v
	}
	return noBound
}
