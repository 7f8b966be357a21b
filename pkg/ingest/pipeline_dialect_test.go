package ingest_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/brokers/kafkabroker"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/destination"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ingest"
	"github.com/delaybridge/delaybridge/pkg/metrics"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// recordSource is a Source of Kafka-like records; it counts acks and nacks
// in read order.
type recordSource struct {
	in chan *envelope.Incoming

	mu    sync.Mutex
	acked int
	nacks int

	ackErr error // what every ack answers (nil: taken)
}

func (s *recordSource) Read(ctx context.Context) (*envelope.Incoming, ingest.AckFunc, error) {
	select {
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	case m := <-s.in:
		return m, func(_ context.Context, err error) error {
			s.mu.Lock()
			defer s.mu.Unlock()
			if err != nil {
				s.nacks++
			} else {
				s.acked++
			}
			return s.ackErr
		}, nil
	}
}

func (s *recordSource) Close(context.Context) error { return nil }

func (s *recordSource) settled() (acked, nacks int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.acked, s.nacks
}

// A kafka-scheduler tombstone cancels the parked message of its key; one
// for a key that is not parked is acknowledged without a dead message,
// counted as tombstone_unknown, and blocks nothing behind it. An
// x-delay-cancel of an unknown ID stays a rejection.
func TestTombstones(t *testing.T) {
	r := testenv.Redis(t)
	st := store.New(r.Client(), store.Options{Prefix: "tomb", Shards: 4})
	src := &recordSource{in: make(chan *envelope.Incoming, 10)}
	m := metrics.New()
	pl := ingest.NewPipeline(ingest.PipelineParams{
		Name:   "sched",
		Source: src,
		Route: &envelope.Route{Ingest: "sched", Sink: "s", Destination: "d", AllowOverride: true,
			Sinks:    destination.Sinks{"s": kafkabroker.Destinations}.Lookup,
			Dialects: []envelope.Dialect{envelope.DialectDelaybridge, envelope.DialectKafkaScheduler}},
		Limits:       envelope.Limits{MaxDelay: 24 * time.Hour, MaxIDBytes: 256},
		Store:        st,
		MaxInFlight:  config.DefaultMaxInFlight,
		DrainTimeout: 5 * time.Second,
		Metrics:      m,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- pl.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	epoch := strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)
	record := func(key string) *envelope.Incoming {
		return &envelope.Incoming{Source: "schedules", Key: []byte(key), Body: []byte("v"),
			Headers: envelope.Headers{{Key: "scheduler-epoch", Value: epoch}, {Key: "scheduler-target-topic", Value: "t"}}}
	}
	tombstone := func(key string) *envelope.Incoming {
		return &envelope.Incoming{Source: "schedules", Key: []byte(key), Tombstone: true}
	}
	src.in <- record("a")
	src.in <- tombstone("a")
	src.in <- tombstone("never-parked")
	src.in <- record("b")
	src.in <- &envelope.Incoming{Headers: envelope.Headers{{Key: "x-delay-cancel", Value: "nobody"}, {Key: "x-message-id", Value: "c"}}}
	testenv.Eventually(t, 10*time.Second, func() bool { a, n := src.settled(); return a+n == 5 })
	if a, n := src.settled(); a != 5 || n != 0 {
		t.Fatalf("acked %d, nacked %d", a, n)
	}
	bg := context.Background()
	if _, err := st.Inspect(bg, "a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a not cancelled by its tombstone: %v", err)
	}
	if info, err := st.Inspect(bg, "b"); err != nil || info.State != store.StateScheduled {
		t.Fatalf("the record after an unknown tombstone: %+v %v", info, err)
	}
	if _, err := st.Inspect(bg, "never-parked"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("an unknown tombstone left something: %v", err)
	}
	if info, err := st.Inspect(bg, "c"); err != nil || info.State != store.StateDead {
		t.Fatalf("x-delay-cancel of an unknown ID is no longer dead: %+v %v", info, err)
	}
	for result, want := range map[string]float64{"parked": 2, "cancelled": 1, "tombstone_unknown": 1, "rejected": 1} {
		var c dto.Metric
		if err := m.IngestMessages.WithLabelValues("sched", result).Write(&c); err != nil {
			t.Fatal(err)
		}
		if got := c.GetCounter().GetValue(); got != want {
			t.Errorf("ingest_messages_total{result=%q} = %v, want %v", result, got, want)
		}
	}
}

// A publisher that sends many bad messages makes one WARN line per reason
// per log.repeat_interval, not one per message: the first is logged, the
// others are counted and summed up once the interval ends.
func TestRejectionsAreLoggedOncePerReasonPerInterval(t *testing.T) {
	src := &recordSource{in: make(chan *envelope.Incoming, 100)}
	out := logRepeats(t, src, "soon")
	if n := strings.Count(out, `msg="message rejected, kept as dead"`); n != 1 {
		t.Fatalf("%d lines for 50 rejections of one reason, want 1 and a summary:\n%s", n, out)
	}
	if !strings.Contains(out, `not_logged=49`) {
		t.Fatalf("the summary does not count the 49 not logged:\n%s", out)
	}
}

// The acks a closed connection fails (every message it delivered, at once)
// are logged once per interval, the others counted, as rejections are: one
// close logged a line per message.
func TestFailedAcksAreLoggedOncePerInterval(t *testing.T) {
	src := &recordSource{in: make(chan *envelope.Incoming, 100), ackErr: errors.New("channel/connection is not open")}
	out := logRepeats(t, src, "1h")
	if c := strings.Count(out, `msg="cannot acknowledge the message to the broker; it may be delivered again"`); c != 1 {
		t.Fatalf("%d lines for 50 acks the broker did not take, want 1 and a summary:\n%s", c, out)
	}
	if !strings.Contains(out, `not_logged=49`) || !strings.Contains(out, "channel/connection is not open") {
		t.Fatalf("the summary does not count the 49 not logged, or the lines do not say why:\n%s", out)
	}
}

// logRepeats runs a pipeline on src with log.repeat_interval an hour (every
// line but the first of a key is counted, whatever the machine's speed),
// reads 50 messages with x-delay delay, and returns its log once it
// stopped, which logs the summary of the repeats.
func logRepeats(t *testing.T, src *recordSource, delay string) string {
	t.Helper()
	r := testenv.Redis(t)
	var logs lockedBuffer
	pl := ingest.NewPipeline(ingest.PipelineParams{
		Name:   "in",
		Source: src,
		Route: &envelope.Route{Ingest: "in", Sink: "s", Destination: "d",
			Sinks: destination.Sinks{"s": kafkabroker.Destinations}.Lookup},
		Limits:         envelope.Limits{MaxDelay: 24 * time.Hour, MaxIDBytes: 256},
		Store:          store.New(r.Client(), store.Options{Prefix: "rep", Shards: 4}),
		MaxInFlight:    config.DefaultMaxInFlight,
		DrainTimeout:   5 * time.Second,
		RepeatInterval: time.Hour,
		Metrics:        metrics.New(),
		Logger:         slog.New(slog.NewTextHandler(&logs, nil)),
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- pl.Run(ctx) }()
	defer func() { cancel(); <-done }()
	const n = 50
	for i := range n {
		src.in <- &envelope.Incoming{Body: []byte("x"), Headers: envelope.Headers{{Key: "x-delay", Value: delay}, {Key: "x-message-id", Value: fmt.Sprintf("m-%d", i)}}}
	}
	testenv.Eventually(t, 10*time.Second, func() bool { a, _ := src.settled(); return a == n })
	cancel()
	err := <-done
	done <- nil // for the deferred wait
	if err != nil {
		t.Fatalf("the pipeline: %v", err)
	}
	return logs.String()
}

// lockedBuffer is what a logger writes while the test reads it.
type lockedBuffer = testenv.Output
