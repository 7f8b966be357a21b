package admin

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/lifecycle"
	"github.com/delaybridge/delaybridge/pkg/metrics"
	"github.com/delaybridge/delaybridge/pkg/ops"
	"github.com/delaybridge/delaybridge/pkg/scheduler"
	"github.com/delaybridge/delaybridge/pkg/sinks"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// countingSink counts every publish per ID and confirms it.
type countingSink struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *countingSink) Publish(_ context.Context, msgs []sinks.Outgoing) []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range msgs {
		c.n[m.ID]++
	}
	return make([]error, len(msgs))
}

func (c *countingSink) Close() error { return nil }

func (c *countingSink) counts() (delivered int, twice []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, n := range c.n {
		delivered++
		if n > 1 {
			twice = append(twice, fmt.Sprintf("%s x%d", id, n))
		}
	}
	return delivered, twice
}

func (c *countingSink) has(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id] > 0
}

// Reschedules and fire-nows racing the messages' own firing, through the
// API, the real scheduler and a real Redis, never lose a message and never
// publish one twice: a change is refused while the message is in flight
// (409), and after it was delivered the message is gone (404).
func TestRescheduleRacesFiring(t *testing.T) {
	rs := testenv.Redis(t)
	st := store.New(rs.Client(), store.Options{Prefix: "race", Shards: 8})
	sink := &countingSink{n: map[string]int{}}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	sched := scheduler.New(scheduler.Params{
		Store: st, Sinks: map[string]sinks.Sink{"out": sink},
		BatchSize: 32, Lease: 30 * time.Second, LeaseMargin: 6 * time.Second, MaxSleep: 50 * time.Millisecond, PublishTimeout: 5 * time.Second,
		MaxAttempts: 5, RepeatInterval: time.Second, Backoff: lifecycle.Backoff{Min: 100 * time.Millisecond, Max: time.Second, Multiplier: 2},
		DrainTimeout: 5 * time.Second, Metrics: metrics.New(), Logger: log,
	})
	srv := New(Params{Ops: ops.New(ops.Params{Store: st, Notify: sched.Notify, Limits: envelope.Limits{MaxDelay: time.Hour}, Logger: log}), Logger: log})
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)

	const n = 2000
	now := time.Now()
	ids := make([]string, n)
	var msgs []*envelope.Message
	for i := range n {
		ids[i] = fmt.Sprintf("race-%04d", i)
		msgs = append(msgs, &envelope.Message{ID: ids[i], DueAt: now.Add(time.Duration(rand.IntN(2000)) * time.Millisecond).Truncate(time.Millisecond),
			Sink: "out", Destination: "d", Body: []byte(ids[i])})
	}
	if _, err := st.Park(context.Background(), msgs); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	var schedDone sync.WaitGroup
	schedDone.Go(func() { _ = sched.Run(ctx) })
	t.Cleanup(func() { cancel(); schedDone.Wait() })

	// Racers: reschedule a few ms ahead, into the past, fire now, or
	// compare-and-set against a stale due time, on messages not yet seen
	// delivered.
	var (
		stop     atomic.Bool
		outcomes sync.Map // "op status" -> *atomic.Int64
		racers   sync.WaitGroup
	)
	count := func(k string) {
		v, _ := outcomes.LoadOrStore(k, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	for range 6 {
		racers.Go(func() {
			for !stop.Load() {
				id := ids[rand.IntN(n)]
				if sink.has(id) && rand.IntN(20) > 0 {
					continue // mostly race the ones still parked
				}
				op, method, path, body := "", http.MethodPatch, "/v1/messages/"+id, ""
				switch rand.IntN(4) {
				case 0:
					op, body = "delay", fmt.Sprintf(`{"delay":%d}`, rand.IntN(150))
				case 1:
					op, body = "past", `{"deliver_at":"2020-01-01T00:00:00Z"}`
				case 2:
					op, method, path = "fire", http.MethodPost, path+"/fire"
				default:
					op, body = "stale", fmt.Sprintf(`{"delay":50,"if_due_at":%d}`, now.Add(-time.Hour).UnixMilli())
				}
				req, _ := http.NewRequest(method, ts.URL+path, strings.NewReader(body))
				if body != "" {
					req.Header.Set("Content-Type", "application/json")
				}
				resp, err := client.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusOK, http.StatusNoContent, http.StatusNotFound, http.StatusConflict:
				default:
					t.Errorf("%s %s: %d", op, id, resp.StatusCode)
				}
				count(fmt.Sprintf("%s %d", op, resp.StatusCode))
			}
		})
	}
	delivered := testenv.Poll(60*time.Second, func() bool {
		d, _ := sink.counts()
		return d == n
	})
	stop.Store(true)
	racers.Wait()
	if !delivered {
		d, _ := sink.counts()
		t.Fatalf("delivered %d of %d", d, n)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		s, err := st.Stats(context.Background())
		return err == nil && s.Parked == 0 && s.Dead == 0
	}, "messages left in Redis after every one was delivered")
	if d, twice := sink.counts(); d != n || len(twice) > 0 {
		t.Fatalf("delivered %d of %d; published more than once: %v", d, n, twice)
	}
	var summary []string
	outcomes.Range(func(k, v any) bool {
		summary = append(summary, fmt.Sprintf("%s: %d", k, v.(*atomic.Int64).Load()))
		return true
	})
	t.Logf("every one of %d messages delivered once; racing requests: %s", n, strings.Join(summary, ", "))
}
