package daemon

import (
	"context"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/delaybridge/delaybridge/pkg/ingest"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// collector computes the gauges that describe state rather than events, at
// scrape time: what Redis holds (one pipelined round trip over all shards)
// and whether each connection is up. Nothing is polled between scrapes.
type collector struct {
	d                                *Daemon
	up, parked, due, dead, oldestAge *prometheus.Desc
}

func newCollector(d *Daemon) *collector {
	return &collector{
		d: d,
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
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.up, c.parked, c.due, c.dead, c.oldestAge} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := c.d.store.Stats(ctx)
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, boolValue(err == nil), "redis", "redis")
	if err == nil {
		for _, sh := range st.Shards {
			ch <- prometheus.MustNewConstMetric(c.parked, prometheus.GaugeValue, float64(sh.Parked), strconv.Itoa(sh.Shard))
		}
		ch <- prometheus.MustNewConstMetric(c.due, prometheus.GaugeValue, float64(st.Due))
		ch <- prometheus.MustNewConstMetric(c.dead, prometheus.GaugeValue, float64(st.Dead))
		age := 0.0
		if !st.OldestDue.IsZero() {
			age = max(0, st.Now.Sub(st.OldestDue).Seconds())
		}
		ch <- prometheus.MustNewConstMetric(c.oldestAge, prometheus.GaugeValue, age)
	}
	for i, src := range c.d.sources {
		up := true
		if r, ok := src.(ingest.Ready); ok {
			up = r.Ready() == nil
		}
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, boolValue(up), "ingest", c.d.cfg.Ingest[i].Name)
	}
	for name, s := range c.d.sinks {
		up := true
		if r, ok := s.(sinks.Ready); ok {
			up = r.Ready() == nil
		}
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, boolValue(up), "sink", name)
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
