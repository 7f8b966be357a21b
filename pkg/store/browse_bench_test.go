package store_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// BenchmarkBrowse measures a page of 100 with 2M messages parked (16
// shards, due times spread over a day, two sinks, groups of 50): the first
// page, a page from a cursor in the middle, and filtered pages (by sink,
// which scans within its bound; by group, which reads the group index).
// DELAYBRIDGE_BENCH_PARKED changes the count. Parking takes ~30 s:
//
//	go test -run '^$' -bench BenchmarkBrowse -benchtime 200x ./pkg/store/
func BenchmarkBrowse(b *testing.B) {
	n := 2_000_000
	if v := os.Getenv("DELAYBRIDGE_BENCH_PARKED"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			b.Fatal(err)
		}
	}
	r := testenv.Redis(b, testenv.WithArgs("--appendonly", "no"))
	s := store.New(r.Client(), store.Options{Prefix: "bench", Shards: 16})
	ctx := context.Background()
	start := time.Now()
	parkMany(b, s, n)
	mem, _ := r.Client().Info(ctx, "memory").Result()
	b.Logf("parked %d in %v (%s)", n, time.Since(start).Round(time.Millisecond), memLine(mem))

	first, err := s.Browse(ctx, store.BrowseQuery{Limit: 100})
	if err != nil || len(first.Messages) != 100 {
		b.Fatalf("first page: %d %v", len(first.Messages), err)
	}
	// A cursor half way: page through with limit 1000 up to it.
	mid := store.BrowseQuery{Limit: 1000}
	for range n / 2 / 1000 {
		p, err := s.Browse(ctx, mid)
		if err != nil {
			b.Fatal(err)
		}
		mid.Cursor = p.Next
	}
	cases := []struct {
		name string
		q    store.BrowseQuery
	}{
		{"first-page", store.BrowseQuery{Limit: 100}},
		{"middle-page", store.BrowseQuery{Limit: 100, Cursor: mid.Cursor}},
		{"sink-filter", store.BrowseQuery{Limit: 100, Sink: "b"}},
		{"group-filter", store.BrowseQuery{Limit: 100, Group: "g-777"}},
		{"range-filter", store.BrowseQuery{Limit: 100, DueAfter: time.Now().Add(12 * time.Hour)}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			var got int
			for b.Loop() {
				p, err := s.Browse(ctx, c.q)
				if err != nil {
					b.Fatal(err)
				}
				got = len(p.Messages)
			}
			b.ReportMetric(float64(got), "msgs/page")
		})
	}
}

// parkMany parks n messages with 100-byte bodies through Park, in batches
// of 10,000 on two connections at once.
func parkMany(tb testing.TB, s *store.Store, n int) {
	tb.Helper()
	ctx := context.Background()
	now := time.Now().Truncate(time.Millisecond)
	body := make([]byte, 100)
	const batch = 10_000
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for w := range 2 {
		wg.Go(func() {
			msgs := make([]*envelope.Message, 0, batch)
			for i := w * batch; i < n; i += 2 * batch {
				msgs = msgs[:0]
				for j := i; j < min(i+batch, n); j++ {
					m := &envelope.Message{
						ID:    fmt.Sprintf("msg-%08d", j),
						DueAt: now.Add(time.Minute + time.Duration(j*7919%86_400_000)*time.Millisecond),
						Sink:  []string{"a", "b"}[j%2], Destination: "orders.expired", Ingest: "in",
						IngestedAt: now, Body: body, Group: fmt.Sprintf("g-%d", j/50),
					}
					msgs = append(msgs, m)
				}
				if _, err := s.Park(ctx, msgs); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		tb.Fatal(err)
	}
}

func memLine(info string) string {
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "used_memory_human:"); ok {
			return "redis uses " + v
		}
	}
	return ""
}
