package metrics_test

import (
	"context"
	"errors"
	"testing"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/metrics"
	"github.com/delaybridge/delaybridge/pkg/store"
)

func TestStateCollector(t *testing.T) {
	r := testenv.Redis(t)
	st := store.New(r.Client(), store.Options{Prefix: "t", Shards: 2, MaxDead: 10})
	m := metrics.New()
	m.Registry.MustRegister(metrics.NewStateCollector(metrics.State{
		Store:          st,
		MaxRedisMemory: 1 << 30,
		Ingests: []metrics.Component{
			{Name: "in", Paused: func() error { return errors.New("redis: connection refused") }},
			{Name: "full", Paused: func() error {
				_, _, err := store.NewCapacity(st, 0, 1, nil).For("full")(context.Background(), 1)
				return err
			}},
			{Name: "calm", Paused: func() error { return nil }},
		},
		Sinks: []metrics.Component{{Name: "down", Ready: func() error { return errors.New("down") }}, {Name: "up"}},
	}))
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		for _, mt := range f.GetMetric() {
			key := f.GetName()
			for _, l := range mt.GetLabel() {
				key += " " + l.GetValue()
			}
			got[key] = mt.GetGauge().GetValue()
		}
	}
	for key, want := range map[string]float64{
		"delaybridge_connection_up redis redis":                 1,
		"delaybridge_connection_up ingest in":                   1,
		"delaybridge_connection_up sink down":                   0,
		"delaybridge_connection_up sink up":                     1,
		"delaybridge_ingest_paused in redis":                    1,
		"delaybridge_ingest_paused in max_parked":               0,
		"delaybridge_ingest_paused full max_redis_memory":       1, // a limit of 1 byte
		"delaybridge_ingest_paused full max_parked":             0,
		"delaybridge_ingest_paused full redis":                  0,
		"delaybridge_ingest_paused calm max_parked":             0,
		"delaybridge_ingest_paused calm redis":                  0,
		"delaybridge_parked_messages 0":                         0,
		"delaybridge_parked_messages 1":                         0,
		"delaybridge_redis_memory_limit_bytes max_redis_memory": 1 << 30,
	} {
		if v, ok := got[key]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", key, v, ok, want)
		}
	}
	if got["delaybridge_redis_memory_used_bytes"] <= 0 {
		t.Errorf("redis memory used: %v", got["delaybridge_redis_memory_used_bytes"])
	}
}
