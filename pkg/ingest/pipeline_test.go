package ingest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/brokers/natsbroker"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/destination"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ingest"
	"github.com/delaybridge/delaybridge/pkg/metrics"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// chanSource is a Source fed by a channel; it records how each message was
// settled.
type chanSource struct {
	in chan *envelope.Incoming

	mu      sync.Mutex
	settled map[string]error // by x-message-id; nil error = acked
	onAck   func(id string)  // called when a message is acked, before recording
	onRead  func(m *envelope.Incoming)
}

func newChanSource() *chanSource {
	return &chanSource{in: make(chan *envelope.Incoming, 100), settled: map[string]error{}}
}

func (s *chanSource) Read(ctx context.Context) (*envelope.Incoming, ingest.AckFunc, error) {
	select {
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	case m := <-s.in:
		if s.onRead != nil {
			s.onRead(m)
		}
		id, _ := m.Headers.Get("x-message-id")
		return m, func(_ context.Context, err error) error {
			if err == nil && s.onAck != nil {
				s.onAck(id)
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			if _, twice := s.settled[id]; twice {
				panic("settled twice: " + id)
			}
			s.settled[id] = err
			return nil
		}, nil
	}
}

func (s *chanSource) Close(context.Context) error { return nil }

func (s *chanSource) send(id string, headers ...string) {
	h := envelope.Headers{{Key: "x-message-id", Value: id}}
	for i := 0; i+1 < len(headers); i += 2 {
		h = append(h, envelope.Header{Key: headers[i], Value: headers[i+1]})
	}
	s.in <- &envelope.Incoming{Headers: h, Body: []byte("body-" + id)}
}

func (s *chanSource) result(id string) (err error, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	err, ok = s.settled[id]
	return err, ok
}

type pipelineEnv struct {
	redis *testenv.RedisServer
	store *store.Store
	src   *chanSource
	pl    *ingest.Pipeline
	m     *metrics.Metrics
	stop  context.CancelFunc
	done  chan error

	// Set by a setup function, before the pipeline starts.
	source        ingest.Source                                // instead of src
	open          func(context.Context) (ingest.Source, error) // instead of a source: Open
	waiting       func(error) bool
	handBackAfter time.Duration
	capacity      store.Gate
}

func startPipeline(t *testing.T, drain time.Duration) *pipelineEnv {
	return startPipelineWith(t, drain, nil)
}

// startPipelineWith wraps the store (when wrap is non-nil) and may set up
// the source before the pipeline starts.
func startPipelineWith(t *testing.T, drain time.Duration, setup func(e *pipelineEnv) ingest.Store) *pipelineEnv {
	t.Helper()
	r := testenv.Redis(t, testenv.WithAppendFsync("always"))
	e := &pipelineEnv{redis: r, store: store.New(r.Client(), store.Options{Prefix: "p", Shards: 4}), src: newChanSource(), m: metrics.New()}
	var st ingest.Store = e.store
	if setup != nil {
		st = setup(e)
	}
	var src ingest.Source = e.src
	if e.source != nil {
		src = e.source
	}
	if e.open != nil {
		src = nil
	}
	e.pl = ingest.NewPipeline(ingest.PipelineParams{
		Name:    "test",
		Source:  src,
		Open:    e.open,
		Waiting: e.waiting,
		Route: &envelope.Route{Ingest: "test", Sink: "s", Destination: "d",
			Sinks: destination.Sinks{"s": natsbroker.Destinations}.Lookup},
		Limits:        envelope.Limits{MaxDelay: 24 * time.Hour, MaxPayloadBytes: 1 << 20, MaxHeaderBytes: 64 << 10, MaxIDBytes: 256},
		Store:         st,
		MaxInFlight:   config.DefaultMaxInFlight,
		DrainTimeout:  drain,
		HandBackAfter: e.handBackAfter,
		Capacity:      e.capacity,
		Metrics:       e.m,
	})
	ctx, cancel := context.WithCancel(context.Background())
	e.stop = cancel
	e.done = make(chan error, 1)
	go func() { e.done <- e.pl.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-e.done })
	return e
}

// A source the pipeline opens itself (Open) is tried again, with back-off,
// while its error is one to wait out (its broker does not answer), Ready
// saying why; once open it is read as any. Another error ends Run with it.
func TestPipelineOpensItsSourceWhenItsBrokerAnswers(t *testing.T) {
	errDown := errors.New("the broker does not answer")
	var up atomic.Bool
	var tries atomic.Int32
	e := startPipelineWith(t, 5*time.Second, func(e *pipelineEnv) ingest.Store {
		e.open = func(context.Context) (ingest.Source, error) {
			tries.Add(1)
			if !up.Load() {
				return nil, errDown
			}
			return e.src, nil
		}
		e.waiting = func(err error) bool { return errors.Is(err, errDown) }
		return e.store
	})
	testenv.Eventually(t, 10*time.Second, func() bool { return tries.Load() >= 2 }, "Open not tried again")
	if err := e.pl.Ready(); err == nil || !strings.Contains(err.Error(), "the broker does not answer") || e.pl.Source() != nil {
		t.Errorf("Ready while the broker does not answer: %v (source %v), want the reason", err, e.pl.Source())
	}
	up.Store(true)
	e.src.send("m1", "x-delay", "1h")
	testenv.Eventually(t, 30*time.Second, func() bool { _, ok := e.src.result("m1"); return ok }, "m1 not read once the source opened")
	if err, _ := e.src.result("m1"); err != nil {
		t.Errorf("m1 settled with %v, want parked and acked", err)
	}
	if err := e.pl.Ready(); err != nil {
		t.Errorf("Ready once open: %v", err)
	}

	refused := errors.New("the broker refuses the credentials")
	e2 := startPipelineWith(t, 5*time.Second, func(e *pipelineEnv) ingest.Store {
		e.open = func(context.Context) (ingest.Source, error) { return nil, refused }
		e.waiting = func(err error) bool { return errors.Is(err, errDown) }
		return e.store
	})
	select {
	case err := <-e2.done:
		if !errors.Is(err, refused) {
			t.Errorf("Run with a broker that refuses: %v, want its error", err)
		}
		e2.done <- err // for the cleanup
	case <-time.After(10 * time.Second):
		t.Error("Run goes on with a broker that refuses")
	}
}

func TestAckOnlyAfterPark(t *testing.T) {
	e := startPipeline(t, 5*time.Second)
	var notParked []string
	var mu sync.Mutex
	e.src.onAck = func(id string) {
		// At the moment of the ack the message must already be in Redis.
		if _, err := e.store.Inspect(context.Background(), id); err != nil {
			mu.Lock()
			notParked = append(notParked, id)
			mu.Unlock()
		}
	}
	for i := 0; i < 300; i++ {
		e.src.send(fmt.Sprintf("m%d", i), "x-delay", "1h")
	}
	testenv.Eventually(t, 10*time.Second, func() bool { // batches finish in any order
		e.src.mu.Lock()
		defer e.src.mu.Unlock()
		return len(e.src.settled) == 300
	})
	for i := 0; i < 300; i++ {
		if err, ok := e.src.result(fmt.Sprintf("m%d", i)); !ok || err != nil {
			t.Fatalf("m%d settled %v %v", i, ok, err)
		}
	}
	if len(notParked) > 0 {
		t.Fatalf("acked before parked: %v", notParked)
	}
}

func TestRejectedAndCancelsAreSettled(t *testing.T) {
	e := startPipeline(t, 5*time.Second)
	e.src.send("keep", "x-delay", "1h")
	e.src.send("bad", "x-delay", "never")
	e.src.send("c1", "x-delay-cancel", "keep")
	e.src.send("c2", "x-delay-cancel", "nobody")
	testenv.Eventually(t, 10*time.Second, func() bool { _, ok := e.src.result("c2"); return ok })
	for _, id := range []string{"keep", "bad", "c1", "c2"} {
		if err, ok := e.src.result(id); !ok || err != nil {
			t.Fatalf("%s settled %v %v", id, ok, err)
		}
	}
	ctx := context.Background()
	if _, err := e.store.Inspect(ctx, "keep"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("keep not cancelled: %v", err)
	}
	if info, err := e.store.Inspect(ctx, "bad"); err != nil || info.State != store.StateDead || !strings.Contains(info.Reason, "never") {
		t.Fatalf("bad: %+v %v", info, err)
	}
	if info, err := e.store.Inspect(ctx, "c2"); err != nil || info.State != store.StateDead || !strings.Contains(info.Reason, "nobody") {
		t.Fatalf("cancel of an unknown ID: %+v %v", info, err)
	}
	if _, err := e.store.Inspect(ctx, "c1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a cancel message was parked: %v", err)
	}
}

// A cancel that comes while its message is being published cannot stop it:
// the control message is acknowledged and counted cancel_late, and the
// message is neither cancelled nor kept as dead (the contract's "Cancel
// means never published").
func TestCancelOfAMessageInFlightIsLate(t *testing.T) {
	e := startPipeline(t, 5*time.Second)
	ctx := context.Background()
	e.src.send("busy", "x-delay", "0")
	testenv.Eventually(t, 10*time.Second, func() bool { _, ok := e.src.result("busy"); return ok })
	c, err := e.store.Claim(ctx, e.store.ShardOf("busy"), 10, time.Minute, nil)
	if err != nil || len(c.Messages) != 1 {
		t.Fatalf("claim: %+v %v", c, err)
	}
	e.src.send("c1", "x-delay-cancel", "busy")
	testenv.Eventually(t, 10*time.Second, func() bool { _, ok := e.src.result("c1"); return ok })
	if err, _ := e.src.result("c1"); err != nil {
		t.Fatalf("the late cancel was not acknowledged: %v", err)
	}
	if info, err := e.store.Inspect(ctx, "busy"); err != nil || info.State != store.StateInflight {
		t.Fatalf("busy after a late cancel: %+v %v, want in flight", info, err)
	}
	if _, err := e.store.Inspect(ctx, "c1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the late cancel was kept: %v", err)
	}
	if n := testutil.ToFloat64(e.m.IngestMessages.WithLabelValues("test", "cancel_late")); n != 1 {
		t.Fatalf("cancel_late %v, want 1", n)
	}
}

// While Redis is down nothing is acknowledged, Ready says why, and once it
// is back every message is parked and acknowledged.
func TestRedisOutagePausesIngest(t *testing.T) {
	e := startPipeline(t, 5*time.Second)
	e.src.send("before", "x-delay", "1h")
	testenv.Eventually(t, 10*time.Second, func() bool { _, ok := e.src.result("before"); return ok })

	e.redis.Kill()
	for i := 0; i < 20; i++ {
		e.src.send(fmt.Sprintf("during%d", i), "x-delay", "1h")
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return e.pl.Ready() != nil }, "Ready does not report the outage")
	if err := e.pl.Ready(); !strings.Contains(err.Error(), "paused") {
		t.Fatalf("Ready = %v", err)
	}
	if e.pl.Paused() == nil {
		t.Fatal("Paused = nil while Redis is down")
	}
	for i := 0; i < 20; i++ {
		if _, ok := e.src.result(fmt.Sprintf("during%d", i)); ok {
			t.Fatalf("during%d settled while redis is down", i)
		}
	}
	e.redis.Start()
	testenv.Eventually(t, 20*time.Second, func() bool {
		e.src.mu.Lock()
		defer e.src.mu.Unlock()
		return len(e.src.settled) == 21
	}, "not resumed after redis came back")
	for i := 0; i < 20; i++ {
		id := fmt.Sprintf("during%d", i)
		if err, _ := e.src.result(id); err != nil {
			t.Fatalf("%s settled with %v", id, err)
		}
		if _, err := e.store.Inspect(context.Background(), id); err != nil {
			t.Fatalf("%s acked but not parked: %v", id, err)
		}
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return e.pl.Ready() == nil })
	if err := e.pl.Paused(); err != nil {
		t.Fatalf("Paused = %v after Redis came back", err)
	}
}

// releasingSource is a chanSource that can hand its work back
// (ingest.Releaser): while released, Read waits for Resume.
type releasingSource struct {
	*chanSource
	mu       sync.Mutex
	resumed  chan struct{} // closed while not released
	releases int
	resumes  int
}

func newReleasingSource(c *chanSource) *releasingSource {
	r := &releasingSource{chanSource: c, resumed: make(chan struct{})}
	close(r.resumed)
	return r
}

func (r *releasingSource) Read(ctx context.Context) (*envelope.Incoming, ingest.AckFunc, error) {
	r.mu.Lock()
	resumed := r.resumed
	r.mu.Unlock()
	select {
	case <-resumed:
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
	return r.chanSource.Read(ctx)
}

func (r *releasingSource) Release(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.resumed:
		r.resumed = make(chan struct{})
		r.releases++
	default:
	}
	return nil
}

func (r *releasingSource) Resume(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.resumed:
	default:
		close(r.resumed)
		r.resumes++
	}
	return nil
}

func (r *releasingSource) counts() (releases, resumes int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.releases, r.resumes
}

// An instance that cannot reach Redis hands its work back: after
// HandBackAfter it returns what it holds to the broker (a nack, for another
// instance to park), releases its source, and takes its share again once
// Redis answers. Nothing is acknowledged unparked.
func TestCutInstanceHandsItsWorkBack(t *testing.T) {
	var rel *releasingSource
	e := startPipelineWith(t, 5*time.Second, func(e *pipelineEnv) ingest.Store {
		rel = newReleasingSource(e.src)
		e.source = rel
		e.handBackAfter = 300 * time.Millisecond
		return e.store
	})
	e.src.send("before", "x-delay", "1h")
	testenv.Eventually(t, 10*time.Second, func() bool { _, ok := e.src.result("before"); return ok })

	e.redis.Kill()
	const n = 20
	for i := 0; i < n; i++ {
		e.src.send(fmt.Sprintf("during%d", i), "x-delay", "1h")
	}
	testenv.Eventually(t, 15*time.Second, func() bool { r, _ := rel.counts(); return r == 1 }, "the source was not released")
	if err := e.pl.Ready(); err == nil || !strings.Contains(err.Error(), "handed back") {
		t.Fatalf("Ready = %v; want it to say the work is handed back", err)
	}
	// Everything read while Redis was away goes back to the broker, none of
	// it acknowledged; what was not read yet stays with the broker.
	testenv.Eventually(t, 10*time.Second, func() bool {
		e.src.mu.Lock()
		defer e.src.mu.Unlock()
		return len(e.src.settled)+len(e.src.in) == n+1
	}, "what the pipeline held was not returned")
	e.src.mu.Lock()
	for id, err := range e.src.settled {
		if id != "before" && err == nil {
			e.src.mu.Unlock()
			t.Fatalf("%s acknowledged while Redis was unreachable", id)
		}
	}
	nacked := len(e.src.settled) - 1
	e.src.mu.Unlock()
	if nacked == 0 {
		t.Fatal("nothing was handed back")
	}

	e.redis.Start()
	testenv.Eventually(t, 20*time.Second, func() bool { _, r := rel.counts(); return r == 1 }, "not resumed after Redis came back")
	testenv.Eventually(t, 5*time.Second, func() bool { return e.pl.Ready() == nil })
	e.src.send("after", "x-delay", "1h")
	testenv.Eventually(t, 10*time.Second, func() bool { err, ok := e.src.result("after"); return ok && err == nil }, "not parked after the resume")
	if _, err := e.store.Inspect(context.Background(), "after"); err != nil {
		t.Fatalf("after acknowledged but not parked: %v", err)
	}
}

// Stopping while Redis is down returns the unparked messages to the broker
// (nack) once the drain timeout has passed, and Run returns.
func TestShutdownWithRedisDownNacks(t *testing.T) {
	e := startPipeline(t, 300*time.Millisecond)
	e.redis.Kill()
	e.src.send("stuck", "x-delay", "1h")
	testenv.Eventually(t, 10*time.Second, func() bool { return e.pl.Ready() != nil })
	e.stop()
	select {
	case err := <-e.done:
		if err != nil {
			t.Fatalf("Run = %v", err)
		}
		e.done <- nil // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the drain timeout")
	}
	if err, ok := e.src.result("stuck"); !ok || err == nil {
		t.Fatalf("stuck settled %v with %v; want a nack", ok, err)
	}
}

// slowStore makes a park take a millisecond per message, widening the
// window in which a cancel that did not wait for the (large) batches before
// it would run first. (A delay injected into a fake, not a wait.)
type slowStore struct{ ingest.Store }

func (s slowStore) Park(ctx context.Context, msgs []*envelope.Message) ([]store.ParkResult, error) {
	time.Sleep(time.Duration(len(msgs)) * time.Millisecond)
	return s.Store.Park(ctx, msgs)
}

// Batches are parked concurrently, but a cancel always sees the parks that
// came before it, in whichever batch they were.
func TestCancelSeesEveryEarlierPark(t *testing.T) {
	e := startPipelineWith(t, 5*time.Second, func(e *pipelineEnv) ingest.Store { return slowStore{e.store} })
	const n = 400
	for i := 0; i < n; i++ {
		e.src.send(fmt.Sprintf("p%d", i), "x-delay", "1h")
	}
	for i := n - 1; i >= 0; i-- { // the latest parks first: they are the ones still in flight
		e.src.send(fmt.Sprintf("c%d", i), "x-delay-cancel", fmt.Sprintf("p%d", i))
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		e.src.mu.Lock()
		defer e.src.mu.Unlock()
		return len(e.src.settled) == 2*n
	})
	st, err := e.store.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Parked != 0 || st.Dead != 0 {
		t.Fatalf("parked %d, dead %d: a cancel missed the park before it", st.Parked, st.Dead)
	}
}

// timingOutStore is a Redis that does not answer: each park fails after
// `after` with a timeout, as a client does against an address that drops
// its packets. (A delay injected into a fake, not a wait.)
type timingOutStore struct {
	ingest.Store
	after    time.Duration
	attempts atomic.Int32
}

func (s *timingOutStore) Park(ctx context.Context, _ []*envelope.Message) ([]store.ParkResult, error) {
	s.attempts.Add(1)
	select {
	case <-time.After(s.after):
	case <-ctx.Done():
	}
	return nil, fmt.Errorf("store.park: read tcp: i/o timeout: %w", context.DeadlineExceeded)
}

// The cut is counted from the start of the first park that failed: when
// each attempt fails only after a timeout longer than HandBackAfter, the
// first failure hands the work back (b6c57c1; before, it took a second
// failure, and a loaded instance held its batch for a whole cut).
func TestHandBackAfterOneSlowFailure(t *testing.T) {
	var (
		rel *releasingSource
		st  *timingOutStore
	)
	e := startPipelineWith(t, 5*time.Second, func(e *pipelineEnv) ingest.Store {
		rel = newReleasingSource(e.src)
		e.source = rel
		e.handBackAfter = 200 * time.Millisecond
		st = &timingOutStore{Store: e.store, after: 600 * time.Millisecond}
		return st
	})
	e.src.send("m", "x-delay", "1h")
	testenv.Eventually(t, 10*time.Second, func() bool { r, _ := rel.counts(); return r == 1 }, "the source was not released")
	if n := st.attempts.Load(); n != 1 {
		t.Fatalf("released after %d park attempts; want after the first, which took longer than HandBackAfter", n)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { err, ok := e.src.result("m"); return ok && err != nil }, "m not returned to the broker")
}

// A message whose ID is another ingest's message is not dropped as a
// duplicate, nor replaces it (x-delay-replace): it is kept as dead
// (id_taken, under an ID of its own) and counted, and the other's message
// is untouched.
func TestIDTakenIsDeadNotDropped(t *testing.T) {
	e := startPipeline(t, 5*time.Second)
	ctx := context.Background()
	theirs := &envelope.Message{ID: "order-9", DueAt: time.Now().Add(time.Hour).Truncate(time.Millisecond), Ingest: "other",
		Sink: "s", Destination: "d", Body: []byte("theirs")}
	if _, err := e.store.Park(ctx, []*envelope.Message{theirs}); err != nil {
		t.Fatal(err)
	}
	e.src.send("order-9", "x-delay", "1m", "x-delay-replace", "true")
	testenv.Eventually(t, 10*time.Second, func() bool {
		return testutil.ToFloat64(e.m.IngestRejected.WithLabelValues("test", "id_taken")) == 1
	}, "the squatting message was not rejected as id_taken")
	if err, ok := e.src.result("order-9"); !ok || err != nil {
		t.Fatalf("the squatting message was not acknowledged: %v %v", ok, err)
	}
	info, err := e.store.Inspect(ctx, "order-9")
	if err != nil || string(info.Message.Body) != "theirs" || info.State != store.StateScheduled {
		t.Fatalf("order-9 after the squat: %+v %v", info, err)
	}
	page, err := e.store.Browse(ctx, store.BrowseQuery{State: store.StateDead})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range page.Messages {
		if strings.Contains(d.Reason, "id_taken") && strings.Contains(d.Reason, `"order-9"`) {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d dead messages name id_taken and order-9, want 1: %+v", n, page.Messages)
	}
}

// fullWhile is a store.Gate that refuses every park while full is set.
func fullWhile(full *atomic.Bool) store.Gate {
	return func(_ context.Context, n int) (int, func(), error) {
		if full.Load() {
			return 0, nil, fmt.Errorf("%w: limits.max_parked_messages reached", store.ErrFull)
		}
		return n, func() {}, nil
	}
}

// While the store is full (limits.max_parked_messages, max_redis_memory),
// the messages to park wait in the room, unacknowledged, and reading goes
// on: a cancel behind them goes through at once, whether its message
// waits in the room (it is never parked) or is parked already, and so
// does a group cancel; once there is room, what waits is parked in order.
func TestCancelsGoThroughWhileFull(t *testing.T) {
	var full atomic.Bool
	full.Store(true)
	e := startPipelineWith(t, 5*time.Second, func(e *pipelineEnv) ingest.Store {
		e.capacity = fullWhile(&full)
		return e.store
	})
	ctx := context.Background()
	parked := &envelope.Message{ID: "parked", DueAt: time.Now().Add(time.Hour).Truncate(time.Millisecond), Ingest: "test", Sink: "s", Destination: "d", Body: []byte("b")}
	if _, err := e.store.Park(ctx, []*envelope.Message{parked}); err != nil {
		t.Fatal(err)
	}
	e.src.send("waits", "x-delay", "1h")
	e.src.send("cancelled-waiting", "x-delay", "1h")
	e.src.send("grouped", "x-delay", "1h", "x-delay-group", "g1")
	e.src.send("c1", "x-delay-cancel", "cancelled-waiting")
	e.src.send("c2", "x-delay-cancel", "parked")
	e.src.send("c3", "x-delay-cancel-group", "g1")
	testenv.Eventually(t, 10*time.Second, func() bool {
		_, ok := e.src.result("c3")
		return ok
	}, "the cancels behind the waiting messages were not handled")
	for _, id := range []string{"c1", "c2", "c3", "cancelled-waiting", "grouped"} {
		if err, ok := e.src.result(id); !ok || err != nil {
			t.Errorf("%s: settled %v %v, want acknowledged", id, ok, err)
		}
	}
	if _, ok := e.src.result("waits"); ok {
		t.Fatal("a message waiting for room was acknowledged before it was parked")
	}
	if e.pl.Ready() == nil {
		t.Error("Ready says nothing while messages wait for room")
	}
	for _, id := range []string{"parked", "cancelled-waiting", "grouped", "waits"} {
		if _, err := e.store.Inspect(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s is in the store: %v", id, err)
		}
	}
	full.Store(false)
	testenv.Eventually(t, 10*time.Second, func() bool {
		err, ok := e.src.result("waits")
		return ok && err == nil
	}, "the waiting message was not parked once there was room")
	if info, err := e.store.Inspect(ctx, "waits"); err != nil || info.State != store.StateScheduled {
		t.Fatalf("waits: %+v %v", info, err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return e.pl.Ready() == nil }, "still not ready once the room emptied")
}

// confirmingSource is a chanSource whose broker answers no ack
// (ingest.AckConfirmer), and whose acks of the IDs in lost fail, as on a
// channel that closed under them.
type confirmingSource struct {
	*chanSource
	lost map[string]bool
}

func (s confirmingSource) Read(ctx context.Context) (*envelope.Incoming, ingest.AckFunc, error) {
	in, ack, err := s.chanSource.Read(ctx)
	if err != nil {
		return nil, nil, err
	}
	id, _ := in.Headers.Get("x-message-id")
	return in, func(ctx context.Context, handleErr error) error {
		if s.lost[id] {
			return errors.New("delivery of a closed channel")
		}
		return ack(ctx, handleErr)
	}, nil
}

func (confirmingSource) AckMark() uint64                           { return 0 }
func (confirmingSource) ConfirmAcks(context.Context, uint64) error { return nil }

// forgetting records the messages whose re-read marks the pipeline has
// the store forget.
type forgetting struct {
	ingest.Store
	mu     sync.Mutex
	forgot []string
}

func (f *forgetting) AcksConfirmed(ctx context.Context, msgs []*envelope.Message) error {
	f.mu.Lock()
	for _, m := range msgs {
		f.forgot = append(f.forgot, m.ID)
	}
	f.mu.Unlock()
	return f.Store.AcksConfirmed(ctx, msgs)
}

// A message whose ack did not go out keeps its re-read mark: the broker
// delivers it again, and that is a re-read, not a new message.
func TestAFailedAckKeepsTheReReadMark(t *testing.T) {
	var f *forgetting
	e := startPipelineWith(t, 5*time.Second, func(e *pipelineEnv) ingest.Store {
		e.source = confirmingSource{chanSource: e.src, lost: map[string]bool{"lost": true}}
		f = &forgetting{Store: e.store}
		return f
	})
	for _, id := range []string{"ok1", "lost", "ok2"} {
		e.src.send(id, "x-delay", "1h")
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return slices.Contains(f.forgot, "ok1") && slices.Contains(f.forgot, "ok2")
	}, "the marks of the acked messages not forgotten")
	f.mu.Lock()
	defer f.mu.Unlock()
	if slices.Contains(f.forgot, "lost") {
		t.Errorf("the mark of the message whose ack failed was forgotten: %v", f.forgot)
	}
}

// A cancel header takes every waiting copy of its ID out of the room (a
// broker's redelivery waits beside the first delivery), and cancels a
// copy parked already too (the broker gave it again to another instance,
// which parked it): none of them is published.
func TestCancelTakesEveryCopyOfAWaitingMessage(t *testing.T) {
	var full atomic.Bool
	full.Store(true)
	src := &copiesSource{in: make(chan *envelope.Incoming, 10)}
	e := startPipelineWith(t, 5*time.Second, func(e *pipelineEnv) ingest.Store {
		e.source = src
		e.capacity = fullWhile(&full)
		return e.store
	})
	ctx := context.Background()
	// The copy another instance parked.
	elsewhere := &envelope.Message{ID: "t", DueAt: time.Now().Add(time.Hour).Truncate(time.Millisecond), Ingest: "test", Sink: "s", Destination: "d", Body: []byte("b")}
	if _, err := e.store.Park(ctx, []*envelope.Message{elsewhere}); err != nil {
		t.Fatal(err)
	}
	msg := func(kv ...string) *envelope.Incoming {
		var h envelope.Headers
		for i := 0; i+1 < len(kv); i += 2 {
			h = append(h, envelope.Header{Key: kv[i], Value: kv[i+1]})
		}
		return &envelope.Incoming{Headers: h, Body: []byte("b")}
	}
	src.in <- msg("x-message-id", "t", "x-delay", "1h")
	src.in <- msg("x-message-id", "t", "x-delay", "1h") // redelivered, beside it
	src.in <- msg("x-message-id", "c", "x-delay-cancel", "t")
	testenv.Eventually(t, 10*time.Second, func() bool { return len(src.acked()) == 3 }, "the cancel and the two copies it took were not acknowledged")
	if _, err := e.store.Inspect(ctx, "t"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the copy parked elsewhere: Inspect %v, want cancelled", err)
	}
	full.Store(false)
	src.in <- msg("x-message-id", "after", "x-delay", "1h")
	testenv.Eventually(t, 10*time.Second, func() bool { return len(src.acked()) == 4 }, "the room did not park again")
	if _, err := e.store.Inspect(ctx, "t"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a waiting copy was parked after the cancel: Inspect %v", err)
	}
	if n := testutil.ToFloat64(e.m.IngestMessages.WithLabelValues("test", "cancelled")); n != 1 {
		t.Fatalf("cancelled %v, want 1", n)
	}
}

// copiesSource is a Source fed by a channel whose messages may share an
// ID; it records the acknowledged ones in order.
type copiesSource struct {
	in   chan *envelope.Incoming
	mu   sync.Mutex
	acks []string
}

func (s *copiesSource) Read(ctx context.Context) (*envelope.Incoming, ingest.AckFunc, error) {
	select {
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	case m := <-s.in:
		id, _ := m.Headers.Get("x-message-id")
		return m, func(_ context.Context, err error) error {
			if err == nil {
				s.mu.Lock()
				s.acks = append(s.acks, id)
				s.mu.Unlock()
			}
			return nil
		}, nil
	}
}

func (s *copiesSource) Close(context.Context) error { return nil }

func (s *copiesSource) acked() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.acks)
}

// progressSource is a chanSource whose broker delivers again what is not
// settled in time (ingest.Progresser): it counts the in-progress calls per
// ID, and those of the IDs in failing answer an error.
type progressSource struct {
	*chanSource
	failing  map[string]bool
	mu       sync.Mutex
	progress map[string]int
}

func (s *progressSource) ProgressEvery() time.Duration { return 50 * time.Millisecond }

func (s *progressSource) Read(ctx context.Context) (*envelope.Incoming, ingest.AckFunc, error) {
	in, ack, err := s.chanSource.Read(ctx)
	if err != nil {
		return nil, nil, err
	}
	id, _ := in.Headers.Get("x-message-id")
	return in, func(ctx context.Context, err error) error {
		if !errors.Is(err, ingest.ErrInProgress) {
			return ack(ctx, err)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.progress[id]++
		if s.failing[id] {
			return errors.New("already acknowledged")
		}
		return nil
	}, nil
}

func (s *progressSource) told(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.progress[id]
}

// The messages waiting for room are said to be in progress, each of them,
// again and again, whatever the broker answered for another one; a message
// parked at once is not; and each is settled once, when it is parked.
func TestWaitingMessagesAreKeptInProgress(t *testing.T) {
	var full atomic.Bool
	src := &progressSource{chanSource: newChanSource(), failing: map[string]bool{"a": true}, progress: map[string]int{}}
	startPipelineWith(t, 5*time.Second, func(e *pipelineEnv) ingest.Store {
		e.source = src
		e.capacity = fullWhile(&full)
		return e.store
	})
	src.send("first", "x-delay", "1h")
	testenv.Eventually(t, 10*time.Second, func() bool { _, ok := src.result("first"); return ok }, "the first message was not parked")
	full.Store(true)
	src.send("a", "x-delay", "1h")
	src.send("b", "x-delay", "1h")
	testenv.Eventually(t, 10*time.Second, func() bool { return src.told("a") >= 3 && src.told("b") >= 3 },
		"the waiting messages were not kept in progress (a %d, b %d times)", src.told("a"), src.told("b"))
	for _, id := range []string{"a", "b"} {
		if _, ok := src.result(id); ok {
			t.Errorf("%s settled while it waits", id)
		}
	}
	full.Store(false)
	testenv.Eventually(t, 10*time.Second, func() bool {
		ea, oka := src.result("a")
		eb, okb := src.result("b")
		return oka && okb && ea == nil && eb == nil
	}, "the waiting messages were not parked and acknowledged once there was room")
	if n := src.told("first"); n != 0 {
		t.Errorf("a message parked at once was said to be in progress %d times", n)
	}
}

// While the store's limits cannot be read (Redis out of reach), the
// messages that wait for room are no longer said to be in progress: the
// broker delivers them again after its time, to the instances that reach
// Redis. Said to be in progress, they stayed with this one for as long as
// Redis did not answer it.
func TestWaitingMessagesAreLeftToTheBrokerWhileRedisIsAway(t *testing.T) {
	const (
		open = iota
		full
		away
	)
	var state atomic.Int64
	var askedAway atomic.Int64
	src := &progressSource{chanSource: newChanSource(), progress: map[string]int{}}
	startPipelineWith(t, 5*time.Second, func(e *pipelineEnv) ingest.Store {
		e.source = src
		e.capacity = func(_ context.Context, n int) (int, func(), error) {
			switch state.Load() {
			case full:
				return 0, nil, fmt.Errorf("%w: limits.max_parked_messages reached", store.ErrFull)
			case away:
				askedAway.Add(1)
				return 0, nil, errors.New("store.stats: dial tcp: i/o timeout")
			}
			return n, func() {}, nil
		}
		return e.store
	})
	state.Store(full)
	src.send("a", "x-delay", "1h")
	testenv.Eventually(t, 10*time.Second, func() bool { return src.told("a") >= 2 }, "the waiting message was not kept in progress")
	state.Store(away)
	testenv.Eventually(t, 10*time.Second, func() bool { return askedAway.Load() >= 1 }, "the room did not ask for room again")
	told := src.told("a") // at most one more may be under way as the room asked
	testenv.Eventually(t, 10*time.Second, func() bool { return askedAway.Load() >= 5 }, "the room did not ask for room again")
	if n := src.told("a"); n > told+1 {
		t.Fatalf("said to be in progress %d more times while the store's limits could not be read", n-told)
	}
	state.Store(open)
	testenv.Eventually(t, 10*time.Second, func() bool { err, ok := src.result("a"); return ok && err == nil }, "not parked once Redis answered")
}
