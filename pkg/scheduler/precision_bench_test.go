//go:build bench

package scheduler_test

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/brokers/natsbroker"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/lifecycle"
	"github.com/delaybridge/delaybridge/pkg/metrics"
	"github.com/delaybridge/delaybridge/pkg/scheduler"
	"github.com/delaybridge/delaybridge/pkg/sinks"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// TestPrecisionBreakdown runs the real scheduler on a real Redis and a real
// JetStream sink at a steady rate and reports where the time between each
// due time and its confirmation goes, stage by stage, from Params.Trace, and
// the lateness a consumer sees. It asserts nothing about timing (the
// machine is shared); it prints the breakdown for docs/performance.md:
//
//	go test -tags bench -run TestPrecisionBreakdown -v ./pkg/scheduler/ -args -rate 1000 -seconds 10 [-ahead 0] [-go-timers]
func TestPrecisionBreakdown(t *testing.T) {
	rate, seconds := *benchRate, *benchSeconds
	scheduler.UseGoTimers(*benchGoTimers)
	defer scheduler.UseGoTimers(false)
	ctx := context.Background()
	rs := testenv.Redis(t)
	st := store.New(rs.Client(), store.Options{Prefix: "p", Shards: config.DefaultShards})
	ns := testenv.NATS(t)
	nc, err := nats.Connect(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	sink, err := natsbroker.NewSink(natsbroker.SinkParams{Name: "nats", URL: ns.URL, JetStream: true}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()

	// The consumer: receive times by ID.
	n := int(rate * seconds)
	var mu sync.Mutex
	received := make(map[string]time.Time, n)
	sub, err := nc.Subscribe("out.>", func(m *nats.Msg) {
		at := time.Now()
		mu.Lock()
		received[m.Header.Get(envelope.HeaderMessageID)] = at
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	// Messages due at a steady rate from 2 s from now, in Redis time.
	redisNow, err := rs.Client().Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	start := redisNow.Add(2 * time.Second).Truncate(time.Millisecond)
	due := make(map[string]time.Time, n)
	var batch []*envelope.Message
	for i := range n {
		at := start.Add(time.Duration(float64(i) / rate * float64(time.Second))).Truncate(time.Millisecond)
		id := fmt.Sprintf("p%06d", i)
		due[id] = at
		batch = append(batch, &envelope.Message{ID: id, DueAt: at, Sink: "nats", Destination: "out.p", Body: []byte("0123456789")})
		if len(batch) == 1000 || i == n-1 {
			if _, err := st.Park(ctx, batch); err != nil {
				t.Fatal(err)
			}
			batch = batch[:0]
		}
	}

	var traces []scheduler.Trace
	var tmu sync.Mutex
	p := scheduler.Params{
		Store: st, Sinks: map[string]sinks.Sink{"nats": sink}, Metrics: metrics.New(),
		BatchSize: config.DefaultBatchSize, Lease: config.DefaultLease, LeaseMargin: config.DefaultLeaseMargin(config.DefaultLease), MaxSleep: config.DefaultMaxSleep, Ahead: *benchAhead,
		PublishTimeout: config.DefaultPublishTimeout, MaxAttempts: config.DefaultMaxAttempts, RepeatInterval: config.DefaultLogRepeatInterval, DrainTimeout: time.Second,
		Backoff: lifecycle.Backoff{Min: time.Second, Max: time.Minute, Multiplier: 2},
		Logger:  slog.New(slog.DiscardHandler),
		Trace: func(tr scheduler.Trace) {
			tmu.Lock()
			traces = append(traces, tr)
			tmu.Unlock()
		},
	}
	sched := scheduler.New(p)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = sched.Run(runCtx); close(done) }()
	testenv.Eventually(t, time.Duration(seconds+30)*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(received) == n
	}, "every message received")
	stop()
	<-done

	// Our clock to Redis's: the median of the claims' estimates.
	var offsets []time.Duration
	for _, tr := range traces {
		offsets = append(offsets, tr.Offset)
	}
	sort.Slice(offsets, func(i, j int) bool { return offsets[i] < offsets[j] })
	offset := offsets[len(offsets)/2]

	stages := map[string][]time.Duration{}
	add := func(name string, d time.Duration) { stages[name] = append(stages[name], d) }
	for _, tr := range traces {
		for _, d := range tr.Due {
			add("5 due -> confirmed (daemon)", tr.Confirmed.Add(tr.Offset).Sub(d))
			add("1 due -> claim or commit sent", tr.ClaimSent.Add(tr.Offset).Sub(d))
		}
		if tr.Committed {
			add("2 commit round trip (claimed ahead)", tr.ClaimAnswered.Sub(tr.ClaimSent))
		} else {
			add("2 claim round trip (claimed due)", tr.ClaimAnswered.Sub(tr.ClaimSent))
		}
		add("3 claim or commit answered -> publish sent", tr.PublishSent.Sub(tr.ClaimAnswered))
		add("4 publish -> PubAck", tr.Confirmed.Sub(tr.PublishSent))
		if !tr.Planned.IsZero() {
			add("0 timer: planned -> woke", tr.Woke.Add(tr.Offset).Sub(tr.Planned))
			add("0b woke -> claim or commit sent", tr.ClaimSent.Sub(tr.Woke))
		}
	}
	mu.Lock()
	for id, at := range received {
		add("6 due -> consumer received", at.Add(offset).Sub(due[id]))
	}
	mu.Unlock()
	var early int
	for _, d := range stages["6 due -> consumer received"] {
		if d < 0 {
			early++
		}
	}
	names := make([]string, 0, len(stages))
	for k := range stages {
		names = append(names, k)
	}
	sort.Strings(names)
	var b strings.Builder
	fmt.Fprintf(&b, "\n%d messages at %.0f/s over %.0f s, %d publishes; clock offset to Redis %v\n", n, rate, seconds, len(traces), offset)
	fmt.Fprintf(&b, "| stage | n | p50 | p90 | p99 | max |\n|---|---|---|---|---|---|\n")
	for _, name := range names {
		ds := stages[name]
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		q := func(p float64) time.Duration { return ds[min(len(ds)-1, int(p*float64(len(ds))))] }
		fmt.Fprintf(&b, "| %s | %d | %v | %v | %v | %v |\n", name, len(ds), q(.5).Round(10*time.Microsecond), q(.9).Round(10*time.Microsecond), q(.99).Round(10*time.Microsecond), ds[len(ds)-1].Round(10*time.Microsecond))
	}
	fmt.Fprintf(&b, "received before the due time (by the offset estimate): %d\n", early)
	t.Log(b.String())
}

var (
	benchRate     = flag.Float64("rate", 1000, "messages per second for TestPrecisionBreakdown")
	benchSeconds  = flag.Float64("seconds", 10, "seconds of messages for TestPrecisionBreakdown")
	benchGoTimers = flag.Bool("go-timers", false, "Go's timers instead of timerfds (SystemClock) for TestPrecisionBreakdown")
	benchAhead    = flag.Duration("ahead", config.DefaultFireAhead, "scheduler.fire_ahead for TestPrecisionBreakdown (0: claim when due)")
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
