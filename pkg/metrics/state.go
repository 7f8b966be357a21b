package metrics

import (
	"context"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/delaybridge/delaybridge/pkg/store"
)

// State is what the state collector reads at each scrape.
type State struct {
	Store          *store.Store
	MaxRedisMemory int64 // limits.max_redis_memory; 0 when unset
	Ingests        []Component
	Sinks          []Component
	// Persistence reports whether every Redis master has AOF and whether
	// every one takes RDB snapshots, as the daemon read them last; nil
	// when unknown (CONFIG refused, not read yet). nil func: not reported.
	Persistence func() (aof, rdb *bool)
}

// Component is an ingest or a sink as the state collector sees it.
type Component struct {
	Name string
	// Ready reports whether its connection is up (nil: it cannot tell, up).
	Ready func() error
	// Paused, of an ingest, returns an error while it waits before parking.
	Paused func() error
	// MaxParked, of an ingest, is its max_parked (0: no bound of its own).
	MaxParked int64
}

// NewStateCollector returns the collector of the gauges that describe
// state rather than events, computed at scrape time: what Redis holds (one
// pipelined round trip over all shards), how much memory Redis uses (INFO
// memory, one more round trip), whether each connection is up and whether
// each ingest is paused. Nothing is polled between scrapes. Register it
// with Metrics.Registry.
func NewStateCollector(s State) prometheus.Collector {
	return newStateCollector(s)
}

type stateCollector struct {
	s                                State
	up, parked, due, dead, oldestAge *prometheus.Desc
	paused, memUsed, memLimit        *prometheus.Desc
	forecast, held, series           *prometheus.Desc
	persistence                      *prometheus.Desc
	ingestParked, ingestSeries       *prometheus.Desc
	ingestMaxParked                  *prometheus.Desc
}

func newStateCollector(s State) *stateCollector {
	return &stateCollector{
		s: s,
		up: prometheus.NewDesc("delaybridge_connection_up",
			"1 when the connection is up, 0 when it is down.", []string{"kind", "name"}, nil),
		parked: prometheus.NewDesc("delaybridge_parked_messages",
			"Messages parked (scheduled or in flight), by shard.", []string{"shard"}, nil),
		due: prometheus.NewDesc("delaybridge_due_messages",
			"Parked messages whose due time has come: the backlog.", nil, nil),
		dead: prometheus.NewDesc("delaybridge_dead_messages",
			"Dead messages kept in Redis.", nil, nil),
		oldestAge: prometheus.NewDesc("delaybridge_oldest_due_age_seconds",
			"How long the oldest due message has been waiting (0 when nothing is due).", nil, nil),
		paused: prometheus.NewDesc("delaybridge_ingest_paused",
			"1 while an ingest waits before parking new messages (it reads on for cancels; they go through), in the series of its reason: max_parked (its own ingests[].max_parked), max_parked_messages or max_redis_memory (limits) reached, or redis (Redis refuses parks); 0 in the others.", []string{"ingest", "reason"}, nil),
		ingestParked: prometheus.NewDesc("delaybridge_ingest_parked_messages",
			"Messages of the ingest live in Redis (parked, in flight or held; not dead), which its max_parked bounds.", []string{"ingest"}, nil),
		ingestSeries: prometheus.NewDesc("delaybridge_ingest_recurring_series",
			"Live recurring series of the ingest, which its max_series bounds.", []string{"ingest"}, nil),
		ingestMaxParked: prometheus.NewDesc("delaybridge_ingest_max_parked",
			"The ingest's max_parked, for those that set one.", []string{"ingest"}, nil),
		forecast: prometheus.NewDesc("delaybridge_forecast_messages",
			"Parked messages that fire within the window from now, by window: 1m, 5m, 1h, 24h (each including the shorter ones and what is due already), later (after 24h). Held messages count by their due times.", []string{"window"}, nil),
		series: prometheus.NewDesc("delaybridge_recurring_series",
			"Live recurring series (parked or in flight, not dead) of the whole store; limits.max_series bounds them.", nil, nil),
		held: prometheus.NewDesc("delaybridge_held_messages",
			"Parked messages held because their sink is paused or down; they fire when it takes messages again.", nil, nil),
		persistence: prometheus.NewDesc("delaybridge_redis_persistence",
			"1 when every Redis master keeps what it holds on disk this way, by kind: aof (appendonly yes), rdb (a save rule); 0 when one does not. Absent when unknown (CONFIG refused). With both 0, a restart of Redis loses every parked message.", []string{"kind"}, nil),
		memUsed: prometheus.NewDesc("delaybridge_redis_memory_used_bytes",
			"Redis INFO used_memory; on a cluster, the master that uses the most.", nil, nil),
		memLimit: prometheus.NewDesc("delaybridge_redis_memory_limit_bytes",
			"Limits on Redis memory, by limit: maxmemory (Redis's own: parks are refused beyond it; on a cluster, that of the master using the most), max_redis_memory (limits.max_redis_memory: ingest pauses at it). Only the limits that are set appear.", []string{"limit"}, nil),
	}
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.up, c.parked, c.due, c.dead, c.oldestAge, c.paused, c.memUsed, c.memLimit, c.forecast, c.held, c.series, c.persistence,
		c.ingestParked, c.ingestSeries, c.ingestMaxParked} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := c.s.Store.Stats(ctx)
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, boolValue(err == nil), "redis", "redis")
	if err == nil {
		for _, sh := range st.Shards {
			ch <- prometheus.MustNewConstMetric(c.parked, prometheus.GaugeValue, float64(sh.Parked), strconv.Itoa(sh.Shard))
		}
		ch <- prometheus.MustNewConstMetric(c.due, prometheus.GaugeValue, float64(st.Due))
		ch <- prometheus.MustNewConstMetric(c.dead, prometheus.GaugeValue, float64(st.Dead))
		ch <- prometheus.MustNewConstMetric(c.series, prometheus.GaugeValue, float64(st.Series))
		age := 0.0
		if !st.OldestDue.IsZero() {
			age = max(0, st.Now.Sub(st.OldestDue).Seconds())
		}
		ch <- prometheus.MustNewConstMetric(c.oldestAge, prometheus.GaugeValue, age)
		f := st.Forecast
		for _, w := range []struct {
			window string
			n      int64
		}{{"1m", f.Minute}, {"5m", f.FiveMinutes}, {"1h", f.Hour}, {"24h", f.Day}, {"later", f.Later}} {
			ch <- prometheus.MustNewConstMetric(c.forecast, prometheus.GaugeValue, float64(w.n), w.window)
		}
		ch <- prometheus.MustNewConstMetric(c.held, prometheus.GaugeValue, float64(st.Held))
		if len(st.Uncounted) == 0 { // before the census, the counts are not known
			for _, in := range c.s.Ingests {
				src := st.Sources[in.Name]
				ch <- prometheus.MustNewConstMetric(c.ingestParked, prometheus.GaugeValue, float64(src.Live), in.Name)
				ch <- prometheus.MustNewConstMetric(c.ingestSeries, prometheus.GaugeValue, float64(src.Series), in.Name)
			}
		}
	}
	if mem, err := c.s.Store.Memory(ctx); err == nil {
		ch <- prometheus.MustNewConstMetric(c.memUsed, prometheus.GaugeValue, float64(mem.Used))
		if mem.MaxMemory > 0 {
			ch <- prometheus.MustNewConstMetric(c.memLimit, prometheus.GaugeValue, float64(mem.MaxMemory), "maxmemory")
		}
	}
	if c.s.Persistence != nil {
		aof, rdb := c.s.Persistence()
		for kind, on := range map[string]*bool{"aof": aof, "rdb": rdb} {
			if on != nil {
				ch <- prometheus.MustNewConstMetric(c.persistence, prometheus.GaugeValue, boolValue(*on), kind)
			}
		}
	}
	if limit := c.s.MaxRedisMemory; limit > 0 {
		ch <- prometheus.MustNewConstMetric(c.memLimit, prometheus.GaugeValue, float64(limit), "max_redis_memory")
	}
	for _, in := range c.s.Ingests {
		var why store.PauseReason
		if in.Paused != nil {
			why = store.PauseReasonOf(in.Paused())
		}
		for _, r := range store.PauseReasons {
			ch <- prometheus.MustNewConstMetric(c.paused, prometheus.GaugeValue, boolValue(why == r), in.Name, string(r))
		}
		if in.MaxParked > 0 {
			ch <- prometheus.MustNewConstMetric(c.ingestMaxParked, prometheus.GaugeValue, float64(in.MaxParked), in.Name)
		}
	}
	for _, in := range c.s.Ingests {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, boolValue(in.Ready == nil || in.Ready() == nil), "ingest", in.Name)
	}
	for _, sk := range c.s.Sinks {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, boolValue(sk.Ready == nil || sk.Ready() == nil), "sink", sk.Name)
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
