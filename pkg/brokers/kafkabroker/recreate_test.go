package kafkabroker

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// Tests of an ingest topic deleted and created again under running
// sources.

// logCount passes log records on to another handler and counts them by
// message.
type logCount struct {
	slog.Handler
	mu *sync.Mutex
	n  map[string]int
}

func newLogCount(t testing.TB) (*logCount, *slog.Logger) {
	h := &logCount{Handler: testLog(t).Handler(), mu: &sync.Mutex{}, n: map[string]int{}}
	return h, slog.New(h)
}

func (h *logCount) Handle(ctx context.Context, r slog.Record) error {
	h.mu.Lock()
	h.n[r.Message]++
	h.mu.Unlock()
	return h.Handler.Handle(ctx, r)
}

func (h *logCount) WithAttrs(as []slog.Attr) slog.Handler {
	return &logCount{Handler: h.Handler.WithAttrs(as), mu: h.mu, n: h.n}
}

func (h *logCount) WithGroup(name string) slog.Handler {
	return &logCount{Handler: h.Handler.WithGroup(name), mu: h.mu, n: h.n}
}

// count is the number of records logged whose message starts with prefix.
func (h *logCount) count(prefix string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for m, c := range h.n {
		if strings.HasPrefix(m, prefix) {
			n += c
		}
	}
	return n
}

// readAll reads n records from the consumers, acknowledging each, and
// returns their bodies; it fails the test if they do not all come within d.
func readAll(t *testing.T, n int, d time.Duration, cs ...*consumer) map[string]int {
	t.Helper()
	bodies := map[string]int{}
	deadline := time.After(d)
	for i := 0; i < n; i++ {
		var g got
		select {
		case g = <-cs[0].recs:
		case g = <-cs[len(cs)-1].recs:
		case <-deadline:
			t.Fatalf("%d of %d records read within %v; read: %v", i, n, d, bodies)
		}
		bodies[string(g.in.Body)]++
		_ = g.ack(context.Background(), nil)
	}
	return bodies
}

// F2: while the topic is missing, the group does not rebalance over and
// over (kafka-go's partition watcher ended every generation that began
// without the topic at once: thousands a second, each logged twice), and
// Ready says why nothing is read; once it is created again, it is read.
func TestSourceTopicMissingDoesNotChurn(t *testing.T) {
	const topic, parts = "missing", 8
	k := testenv.Kafka(t, testenv.WithTopic(topic, parts))
	logs, log := newLogCount(t)
	sa := newSourceLog(t, k, SourceParams{Topic: topic, Group: "g"}, log)
	sb := newSourceLog(t, k, SourceParams{Topic: topic, Group: "g"}, log)
	a, b := startConsumer(t, "A", sa), startConsumer(t, "B", sb)
	produce(t, k.Brokers, records(topic, 0, parts, parts)...)
	readAll(t, parts, 30*time.Second, a, b)

	// From the deletion on, a span of time in which nothing may happen
	// but one rebalance: generations are counted by their log line.
	before := logs.count("kafka partitions assigned")
	if err := k.Cluster.DeleteTopic(topic); err != nil {
		t.Fatalf("delete topic: %v", err)
	}
	const window = 3 * time.Second
	end := time.Now().Add(window)
	for time.Now().Before(end) {
		if n := logs.count("kafka partitions assigned") - before; n > 6 {
			t.Fatalf("%d generations within %v while the topic is missing", n, window-time.Until(end))
		}
		select {
		case g := <-a.recs:
			t.Fatalf("A read %q while the topic is missing", g.in.Body)
		case g := <-b.recs:
			t.Fatalf("B read %q while the topic is missing", g.in.Body)
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Logf("%d generations in %v after the deletion", logs.count("kafka partitions assigned")-before, window)
	testenv.Eventually(t, 5*time.Second, func() bool {
		return sa.Ready() != nil && sb.Ready() != nil
	}, "Ready to fail while the topic is missing: %v, %v", sa.Ready(), sb.Ready())
	for _, s := range []*Source{sa, sb} {
		if err := s.Ready(); !strings.Contains(err.Error(), "does not exist") {
			t.Errorf("Ready while the topic is missing: %v", err)
		}
	}
	if n := logs.count("kafka: topic " + topic + " does not exist"); n != 2 {
		t.Errorf("the topic's absence logged %d times by two members, want 2", n)
	}

	k.CreateTopic(t, topic, parts)
	produce(t, k.Brokers, records(topic, 0, parts, parts)...)
	if got := readAll(t, parts, 15*time.Second, a, b); len(got) != parts {
		t.Errorf("after the topic was created again: %v", got)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		return sa.Ready() == nil && sb.Ready() == nil
	}, "Ready once the topic is read again: %v, %v", sa.Ready(), sb.Ready())
}

// F1: the topic created again between the leader's reading of the topic's
// partitions (to assign them) and the start of the generation: the
// generation has no partitions, and kafka-go's partition watcher, which
// compares against what it read itself after the assignment, saw nothing
// change, so the group stayed without partitions for good, ready. The
// SyncGroup request that carries the empty assignment is held until the
// topic is created again, which makes the race happen every time.
func TestSourceTopicCreatedAgainWhileAssigning(t *testing.T) {
	const topic, parts = "racing", 8
	k := testenv.Kafka(t, testenv.WithTopic(topic, parts))
	// "last": the topic created again has no commits, and is read from its
	// oldest record all the same.
	s := newSource(t, k, SourceParams{Topic: topic, Group: "g", StartOffset: "last"})
	c := startConsumer(t, "A", s)
	testenv.Eventually(t, 10*time.Second, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.gen == nil || len(s.gen.parts) != parts {
			return false
		}
		for _, p := range s.gen.parts {
			p.mu.Lock()
			started := p.cp != nil
			p.mu.Unlock()
			if !started {
				return false
			}
		}
		return true
	}, "partitions assigned and their start offsets looked up")
	produce(t, k.Brokers, records(topic, 0, parts, parts)...)
	readAll(t, parts, 30*time.Second, c)

	created := make(chan error, 1)
	k.Cluster.ControlKey(kmsg.SyncGroup.Int16(), func(r kmsg.Request) (kmsg.Response, error, bool) {
		req := r.(*kmsg.SyncGroupRequest)
		if len(req.GroupAssignment) == 0 {
			return nil, nil, false // a follower's
		}
		for _, a := range req.GroupAssignment {
			var m kmsg.ConsumerMemberAssignment
			if err := m.ReadFrom(a.MemberAssignment); err != nil {
				t.Errorf("assignment of %s: %v", a.MemberID, err)
				return nil, nil, false
			}
			for _, tp := range m.Topics {
				if tp.Topic == topic && len(tp.Partitions) > 0 {
					return nil, nil, false // assigned before the deletion
				}
			}
		}
		k.Cluster.DropControl()
		k.Cluster.SleepControl(func() { created <- k.Cluster.CreateTopic(topic, parts, nil) })
		return nil, nil, false
	})
	if err := k.Cluster.DeleteTopic(topic); err != nil {
		t.Fatalf("delete topic: %v", err)
	}
	select {
	case err := <-created:
		if err != nil {
			t.Fatalf("create topic: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no generation was assigned without the topic")
	}
	produce(t, k.Brokers, records(topic, 0, parts, parts)...)
	if got := readAll(t, parts, 15*time.Second, c); len(got) != parts {
		t.Errorf("after the topic was created again: %v", got)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return s.Ready() == nil }, "Ready: %v", s.Ready())
}

// F3: offsets of a topic created again are committed, though lower than
// the last commit of the old one (a "commit only if higher" rule kept them
// uncommitted until they passed it, and a restart re-read them).
func TestSourceTopicCreatedAgainCommits(t *testing.T) {
	const topic = "recommit"
	k := testenv.Kafka(t, testenv.WithTopic(topic, 1))
	produce(t, k.Brokers, records(topic, 0, 5, 1)...)
	s := newSource(t, k, SourceParams{Topic: topic, Group: "g"})
	for i := 0; i < 5; i++ {
		_ = readOne(t, s, 15*time.Second).ack(context.Background(), nil)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return committed(t, k, "g", topic, 0) == 5 }, "commit of 5")

	// No gap: the group sees no change of the topic's partitions.
	if err := k.Cluster.DeleteTopic(topic); err != nil {
		t.Fatalf("delete topic: %v", err)
	}
	k.CreateTopic(t, topic, 1)
	produce(t, k.Brokers, records(topic, 0, 3, 1)...)
	for want := int64(0); want < 3; want++ {
		g := readOne(t, s, 15*time.Second)
		if _, off := offsetOf(t, g.in); off != want {
			t.Fatalf("after the topic was created again: offset %d, want %d", off, want)
		}
		_ = g.ack(context.Background(), nil)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return committed(t, k, "g", topic, 0) == 3 },
		"commit of 3 on the topic created again (committed: %d)", committed(t, k, "g", topic, 0))
	if err := s.Close(ctxT(t, 10*time.Second)); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if c := committed(t, k, "g", topic, 0); c != 3 {
		t.Fatalf("committed %d after Close, want 3", c)
	}
	// A new member reads on from there: nothing again.
	s2 := newSource(t, k, SourceParams{Topic: topic, Group: "g"})
	produce(t, k.Brokers, kafka.Message{Topic: topic, Value: []byte("after")})
	g := readOne(t, s2, 15*time.Second)
	if _, off := offsetOf(t, g.in); off != 3 || string(g.in.Body) != "after" {
		t.Fatalf("restart read offset %d (%q), want 3 (\"after\")", off, g.in.Body)
	}
}
