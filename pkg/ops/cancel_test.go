package ops_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ops"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// A cancel that meets a message in flight while this instance publishes
// it (Params.Settled) answers as things stand once that publish is
// written: a one-shot message delivered is unknown (404); an occurrence of
// a series is the series' last, so the cancel took (204: nothing more of
// it is published). Without Settled (another instance publishes) both are
// 409, and the series' says that it ends with the occurrence.
func TestCancelMeetsAPublishOfThisInstance(t *testing.T) {
	ctx := context.Background()
	st := store.New(testenv.Redis(t).Client(), store.Options{Prefix: "o", Shards: 1})
	due := time.Now().Add(-time.Millisecond).Truncate(time.Millisecond)
	message := func(id string, recur bool) *envelope.Message {
		m := &envelope.Message{ID: id, DueAt: due, Sink: "s", Destination: "d", IngestedAt: time.Now(), Body: []byte("x")}
		if recur {
			m.Recur = &envelope.Recurrence{Every: time.Minute, Anchor: due, N: 1}
		}
		return m
	}
	for _, c := range []struct {
		id      string
		recur   bool
		settled bool
		want    error // nil: 204
		words   string
	}{
		{"once", false, true, ops.ErrNotFound, "no message"},
		{"series", true, true, nil, ""},
		{"once-elsewhere", false, false, ops.ErrConflict, "being published"},
		{"series-elsewhere", true, false, ops.ErrConflict, "its series ends"},
	} {
		m := message(c.id, c.recur)
		if _, err := st.Park(ctx, []*envelope.Message{m}); err != nil {
			t.Fatal(err)
		}
		lease, err := st.Claim(ctx, 0, 10, time.Minute, nil)
		if err != nil || len(lease.Messages) != 1 {
			t.Fatalf("%s: claim %+v %v", c.id, lease, err)
		}
		// The publish confirmed: the scheduler acks it, a series' with
		// its next occurrence.
		ack := func() {
			d := store.Done{ID: c.id}
			if c.recur {
				next := *m
				next.DueAt, next.Recur = due.Add(time.Minute), &envelope.Recurrence{Every: time.Minute, Anchor: due, N: 2}
				d.Next = &next
			}
			if _, err := st.Ack(ctx, lease, []store.Done{d}); err != nil {
				t.Fatal(err)
			}
		}
		p := ops.Params{Store: st}
		if c.settled {
			p.Settled = func(context.Context, string) { ack() }
		}
		err = ops.New(p).Cancel(ctx, c.id)
		switch {
		case c.want == nil && err != nil:
			t.Errorf("%s: cancel: %v, want nil (204)", c.id, err)
		case c.want != nil && (!errors.Is(err, c.want) || !strings.Contains(err.Error(), c.words)):
			t.Errorf("%s: cancel: %v, want %v saying %q", c.id, err, c.want, c.words)
		}
		if !c.settled {
			ack()
		}
		if _, err := st.Inspect(ctx, c.id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s: after its publish: %v, want not found (nothing more of it)", c.id, err)
		}
	}
}

// A change that meets an occurrence of a series in flight, and waits for
// this instance's publish of it, does not act on the next occurrence its
// ack parks under the same ID: the request named the one in flight. Fire
// and reschedule answer 409, and the next occurrence keeps its time.
func TestChangeOfASeriesInFlightLeavesTheNextOccurrence(t *testing.T) {
	ctx := context.Background()
	st := store.New(testenv.Redis(t).Client(), store.Options{Prefix: "o", Shards: 1})
	due := time.Now().Add(-time.Millisecond).Truncate(time.Millisecond)
	m := &envelope.Message{ID: "s", DueAt: due, Sink: "s", Destination: "d", IngestedAt: time.Now(), Body: []byte("x"),
		Recur: &envelope.Recurrence{Every: time.Hour, Anchor: due, N: 1}}
	nextDue := due.Add(time.Hour)
	for _, change := range []struct {
		name string
		do   func(*ops.Service) error
	}{
		{"fire", func(s *ops.Service) error { return s.Fire(ctx, "s") }},
		{"reschedule", func(s *ops.Service) error {
			_, err := s.Reschedule(ctx, "s", ops.RescheduleRequest{Delay: ops.Scalar(`"1s"`)})
			return err
		}},
	} {
		if _, err := st.Park(ctx, []*envelope.Message{m}); err != nil {
			t.Fatal(err)
		}
		lease, err := st.Claim(ctx, 0, 10, time.Minute, nil)
		if err != nil || len(lease.Messages) != 1 {
			t.Fatalf("claim %+v %v", lease, err)
		}
		settled := func(context.Context, string) {
			next := *m
			next.DueAt, next.Recur = nextDue, &envelope.Recurrence{Every: time.Hour, Anchor: due, N: 2}
			if _, err := st.Ack(ctx, lease, []store.Done{{ID: "s", Next: &next}}); err != nil {
				t.Fatal(err)
			}
		}
		err = change.do(ops.New(ops.Params{Store: st, Settled: settled}))
		if !errors.Is(err, ops.ErrConflict) {
			t.Errorf("%s of an occurrence in flight: %v, want a conflict", change.name, err)
		}
		info, err := st.Inspect(ctx, "s")
		if err != nil || !info.Message.DueAt.Equal(nextDue) {
			t.Errorf("%s: the next occurrence %+v %v, want it due at %v", change.name, info, err, nextDue)
		}
		if err := st.Cancel(ctx, "s"); err != nil {
			t.Fatal(err)
		}
	}
}

// A POST that meets Redis at its maxmemory (a limit of Redis's own, past
// the daemon's) is told to come back, as at the daemon's limits: 503 with
// Retry-After and the reason, not a 500 with Redis's words.
func TestPostAtRedisMaxmemory(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t, testenv.WithArgs("--maxmemory", "2mb", "--maxmemory-policy", "noeviction"))
	st := store.New(r.Client(), store.Options{Prefix: "o", Shards: 1})
	body := strings.Repeat("x", 1000)
	o := ops.New(ops.Params{Store: st, Limits: envelope.Limits{MaxDelay: 24 * time.Hour}})
	for i := range 100_000 {
		_, err := o.Post(ctx, &ops.PostRequest{Sink: "s", Destination: "d", Body: &body, Delay: ops.Text("1h")})
		if err == nil {
			continue
		}
		var e *ops.Error
		if !errors.As(err, &e) || !errors.Is(err, ops.ErrUnavailable) || e.RetryAfter == 0 || !strings.Contains(e.Reason, "maxmemory") {
			t.Fatalf("POST %d at maxmemory: %#v, want ErrUnavailable with RetryAfter", i, err)
		}
		return
	}
	t.Fatal("never reached maxmemory")
}
