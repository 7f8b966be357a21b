package daemon

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// A walk of a changed max_rate that meets Redis out of reach (a failover)
// tries again, keeping its mark alive, and resumes the sink once Redis is
// back: given up at its first error, it left the sink paused until a
// running instance found its mark stale, 30 s on (the cluster probe).
func TestAWalkMeetingAFailoverGoesOn(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	px := testenv.NewProxy(t, r.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: px.Addr, DialTimeout: time.Second, ReadTimeout: time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	st := store.New(rdb, store.Options{Prefix: "wf", Shards: 2})
	if _, err := st.SinkStates(ctx, []string{"a"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Slots(ctx, "a", 1, 1); err != nil { // slots given ahead: its clock runs
		t.Fatal(err)
	}
	rates := map[string]float64{"a": 2}
	changed, _, err := st.ChangedRates(ctx, rates)
	if err != nil || len(changed) != 1 {
		t.Fatalf("changed %v, %v", changed, err)
	}
	out := &testenv.Output{}
	log := slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	px.Down(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		walk(ctx, st, changed, rates, 0, log)
	}()
	testenv.Eventually(t, 20*time.Second, func() bool {
		return strings.Contains(out.String(), "retrying")
	}, "the walk met Redis out of reach")
	px.Up(t)
	select {
	case <-done:
	case <-time.After(reslotRetryFor):
		t.Fatal("the walk did not end once Redis was back")
	}
	states, err := st.SinkStates(ctx, []string{"a"})
	if err != nil {
		t.Fatal(err)
	}
	marked := r.Client().HExists(ctx, st.Keys().Sinks(), "reslot:a").Val()
	if states["a"].Paused || marked {
		t.Fatalf("after the walk: %+v, mark %v; want the sink resumed and the mark gone\n%s", states["a"], marked, out)
	}
}

// A start that cannot record the sinks' max_rate (Redis failing over as it
// starts) tries again beside the scheduler, and records it once Redis
// answers: it logged and left the old rate in force until the next start.
func TestMaxRateRecordedOnceRedisAnswers(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := testenv.Redis(t)
	px := testenv.NewProxy(t, r.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: px.Addr, DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	st := store.New(rdb, store.Options{Prefix: "mr", Shards: 2})
	out := &testenv.Output{}
	log := slog.New(slog.NewTextHandler(out, nil))
	px.Down(t)
	run := applyMaxRates(ctx, st, map[string]float64{"a": 5}, 0, log)
	if !strings.Contains(out.String(), "cannot record the sinks' max_rate") {
		t.Fatalf("no WARN that the rate is not recorded yet:\n%s", out)
	}
	done := make(chan struct{})
	go func() { defer close(done); run(ctx) }()
	px.Up(t)
	testenv.Eventually(t, 30*time.Second, func() bool {
		return r.Client().HGet(context.Background(), st.Keys().Sinks(), "rate:a").Val() == "5"
	}, "the rate not recorded once Redis answered:\n%s", out)
	cancel()
	<-done
}
