package scheduler

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/pkg/lifecycle"
	"github.com/delaybridge/delaybridge/pkg/metrics"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// probingSink is a sink whose destination "stuck" never answers (each
// publish there times out) and whose broker answers a probe unless down.
// It counts every message handed to it, the way the broker would see them.
type probingSink struct {
	mu     sync.Mutex
	handed map[string]int // ID -> publishes
	probes int
	down   bool // the probe fails: the broker does not answer either
}

var _ sinks.Prober = (*probingSink)(nil)

var errNoPubAck = fmt.Errorf("nats sink s: no PubAck within the publish timeout: %w", context.DeadlineExceeded)

func (s *probingSink) Publish(_ context.Context, msgs []sinks.Outgoing) []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		s.handed[m.ID]++
		if m.Destination == "stuck" {
			errs[i] = errNoPubAck
		}
	}
	return errs
}

func (s *probingSink) Probe(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.probes++
	if s.down {
		return fmt.Errorf("nats: no answer from the server: %w", context.DeadlineExceeded)
	}
	return nil
}

func (s *probingSink) Close() error { return nil }

func (s *probingSink) count(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.handed[id]
}

// startProbing is start with a probingSink as sink "s".
func startProbing(t *testing.T, p Params, sk *probingSink, setup func(*harness)) *harness {
	t.Helper()
	h := &harness{clock: newFakeClock(), sink: &fakeSink{}}
	h.store = newFakeStore(h.clock)
	if setup != nil {
		setup(h)
	}
	sk.handed = map[string]int{}
	p.Store = h.store
	p.Sinks = map[string]sinks.Sink{"s": sk}
	p.Clock = h.clock
	p.Metrics = metrics.New()
	p.Rand = func() float64 { return 0.5 } // no jitter
	withDefaults(&p)
	h.sched = New(p)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = h.sched.Run(ctx); close(done) }()
	h.stop = func() { cancel(); <-done }
	t.Cleanup(h.stop)
	return h
}

// TestSilentDestinationAloneCounts is the counting rule of a destination
// that never answers when nothing else of its sink is published (at low
// traffic, or in the first minutes after start): its
// timeouts are not corroborated by other confirmations, so the sink is
// asked whether its broker answers; it does, so the timeouts are the
// destination's: the first two in a row are postponed without counting,
// from the third each counts, and the message is dead after max_attempts
// with the reason, published max_attempts + 2 times, and the sink is
// never blocked for it. A timeout taken for the sink being down would hold
// the message, block its sink and publish it again without counting, for
// ever.
func TestSilentDestinationAloneCounts(t *testing.T) {
	const maxAttempts = 3
	sk := &probingSink{}
	h := startProbing(t, Params{MaxAttempts: maxAttempts, MaxSleep: time.Hour,
		Backoff: lifecycle.Backoff{Min: time.Second, Max: time.Second, Multiplier: 1}}, sk, func(h *harness) {
		h.store.park("stuck", h.clock.Now(), "s")
		h.store.msgs["stuck"].Destination = "stuck"
	})
	postponed, retried := 0, 0
	for done := false; !done; {
		select {
		case p := <-h.store.postponed:
			postponed++
			if p.ID != "stuck" || !strings.Contains(p.Reason, "did not answer") || !strings.Contains(p.Reason, fmt.Sprintf("%d times in a row", postponed)) {
				t.Fatalf("postponed %+v", p)
			}
		case r := <-h.store.retried:
			retried++
			if r.ID != "stuck" || !strings.Contains(r.Reason, "did not answer") {
				t.Fatalf("retried %+v", r)
			}
		case d := <-h.store.dead:
			if d.ID != "stuck" || !strings.Contains(d.Reason, fmt.Sprintf("publish failed %d times", maxAttempts)) ||
				!strings.Contains(d.Reason, fmt.Sprintf(`destination "stuck" of sink s did not answer`)) ||
				!strings.Contains(d.Reason, fmt.Sprintf("%d times in a row", maxAttempts+stallAttempts-1)) {
				t.Fatalf("dead %+v", d)
			}
			done = true
			continue
		case u := <-h.store.holds:
			t.Fatalf("held %+v after %d publishes: the destination's timeout was taken for its sink being down", u, sk.count("stuck"))
		case <-time.After(5 * time.Second):
			t.Fatalf("the silent message did not end dead: published %d times, %d postponed, %d retried", sk.count("stuck"), postponed, retried)
		}
		sleepsUntil(t, h, time.Second)
		h.clock.Advance(time.Second)
	}
	if postponed != stallAttempts-1 || retried != maxAttempts-1 {
		t.Errorf("%d postponed (uncounted), %d retried; want %d and %d", postponed, retried, stallAttempts-1, maxAttempts-1)
	}
	if n := sk.count("stuck"); n != maxAttempts+stallAttempts-1 {
		t.Errorf("published %d times, want max_attempts + %d = %d", n, stallAttempts-1, maxAttempts+stallAttempts-1)
	}
	if blocked := h.sched.gate.blocked(h.clock.Now()); len(blocked) > 0 {
		t.Errorf("sinks blocked: %v", blocked)
	}
	// Each timeout asked once: nothing else of the sink was confirmed
	// while it waited.
	sk.mu.Lock()
	defer sk.mu.Unlock()
	if want := maxAttempts + stallAttempts - 1; sk.probes != want {
		t.Errorf("%d probes, want one per timeout, %d", sk.probes, want)
	}
}

// Messages of one publish that time out together at one destination are
// one timeout in a row, not one each: a batch of five is postponed whole
// the first time, none of them counted (counting each, the third of the
// batch was already an attempt).
func TestABatchOfTimeoutsIsOneInARow(t *testing.T) {
	sk := &probingSink{}
	h := startProbing(t, Params{MaxAttempts: 3, MaxSleep: time.Hour,
		Backoff: lifecycle.Backoff{Min: time.Second, Max: time.Second, Multiplier: 1}}, sk, func(h *harness) {
		for i := range 5 {
			id := fmt.Sprintf("stuck-%d", i)
			h.store.park(id, h.clock.Now(), "s")
			h.store.msgs[id].Destination = "stuck"
		}
	})
	for i := range 5 {
		select {
		case p := <-h.store.postponed:
			if !strings.Contains(p.Reason, "1 times in a row") {
				t.Fatalf("postponed %+v, want the first timeout in a row", p)
			}
		case r := <-h.store.retried:
			t.Fatalf("%+v counted as an attempt after %d of the batch were postponed: each message of the batch was taken for one more timeout in a row", r, i)
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of the batch of 5 postponed", i)
		}
	}
}

// TestSilentSinkHolds: a publish that times out while nothing else of its
// sink was confirmed, and whose broker does not answer a probe either, is
// the sink's: held, its sink blocked, no attempt counted.
func TestSilentSinkHolds(t *testing.T) {
	sk := &probingSink{down: true}
	h := startProbing(t, Params{MaxAttempts: 1, MaxSleep: time.Hour}, sk, func(h *harness) {
		h.store.park("stuck", h.clock.Now(), "s")
		h.store.msgs["stuck"].Destination = "stuck"
	})
	select {
	case u := <-h.store.holds:
		if u.ID != "stuck" {
			t.Fatalf("held %+v", u)
		}
	case p := <-h.store.postponed:
		t.Fatalf("postponed %+v: a sink that does not answer a probe is down", p)
	case r := <-h.store.retried:
		t.Fatalf("retried %+v: an attempt counted while the sink was down", r)
	case d := <-h.store.dead:
		t.Fatalf("dead %+v while the sink was down", d)
	case <-time.After(5 * time.Second):
		t.Fatal("the message was not held")
	}
	if _, ok := h.sched.gate.blocked(h.clock.Now())["s"]; !ok {
		t.Error("the sink is not blocked")
	}
}

// TestGraceIgnoresTimedOutPublishes: a publish that waited out the publish
// timeout for a destination that never answers says nothing of its sink's
// usual pace; before, one such publish with a message confirmed beside it
// raised the grace of every publish of the sink to its maximum (1 s), so a
// shard waited that long for the next slow publish before going on.
func TestGraceIgnoresTimedOutPublishes(t *testing.T) {
	p := newPace()
	p.observe("s", time.Millisecond, []error{nil})
	p.observe("s", 10*time.Second, []error{nil, errNoPubAck})
	if g := p.grace("s"); g != graceMin {
		t.Fatalf("grace %v after a publish that timed out, want %v (8 x 1 ms, at least graceMin)", g, graceMin)
	}
	p.observe("s", 10*time.Second, []error{nil, errors.New("unroutable")})
	if g := p.grace("s"); g != graceMax {
		t.Fatalf("grace %v after a slow confirmed publish, want %v", g, graceMax)
	}
}

// A sink whose broker stopped answering after it confirmed a message (a
// server paused, a network cut): a publish begun after that confirmation
// and timed out is not corroborated by it. The sink is asked, does not
// answer, and is held as down, not the destination blamed and the sink
// sent more into the stall.
func TestTimeoutAfterTheLastConfirmationAsksTheSink(t *testing.T) {
	sk := &probingSink{}
	h := startProbing(t, Params{MaxAttempts: 3, MaxSleep: time.Hour}, sk, func(h *harness) {
		h.store.park("ok", h.clock.Now(), "s")
	})
	if id := recv(t, h.store.acked, "the confirmed message"); id != "ok" {
		t.Fatalf("acked %s", id)
	}
	sk.mu.Lock()
	sk.down = true
	sk.mu.Unlock()
	h.clock.Advance(time.Second)
	h.store.park("later", h.clock.Now(), "s")
	h.store.mu.Lock()
	h.store.msgs["later"].Destination = "stuck" // times out, as every publish to a broker that stopped
	h.store.mu.Unlock()
	h.sched.Notify("later", h.clock.Now())
	select {
	case u := <-h.store.holds:
		if u.ID != "later" {
			t.Fatalf("held %+v", u)
		}
	case p := <-h.store.postponed:
		t.Fatalf("postponed %+v: a confirmation from before the publish was taken for the sink answering", p)
	case <-time.After(5 * time.Second):
		t.Fatal("no outcome for the timed-out publish")
	}
	sk.mu.Lock()
	defer sk.mu.Unlock()
	if sk.probes != 1 {
		t.Errorf("%d probes, want 1", sk.probes)
	}
}
