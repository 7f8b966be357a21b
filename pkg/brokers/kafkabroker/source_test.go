package kafkabroker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ingest"
)

// testLog returns a logger writing to t until the test ends.
func testLog(t testing.TB) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(func() { w.mu.Lock(); w.done = true; w.mu.Unlock() })
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testWriter struct {
	t    testing.TB
	mu   sync.Mutex
	done bool
}

func (w *testWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(b), "\n"))
	}
	return len(b), nil
}

func hdrs(kv ...string) envelope.Headers {
	var h envelope.Headers
	for i := 0; i < len(kv); i += 2 {
		h = append(h, envelope.Header{Key: kv[i], Value: kv[i+1]})
	}
	return h
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// newSource starts a Source on k and closes it at the end of the test (if
// the test did not).
func newSource(t testing.TB, k *testenv.KafkaCluster, cfg SourceParams) *Source {
	t.Helper()
	return newSourceLog(t, k, cfg, testLog(t))
}

// newSourceLog is newSource logging to log.
func newSourceLog(t testing.TB, k *testenv.KafkaCluster, cfg SourceParams, log *slog.Logger) *Source {
	t.Helper()
	cfg.Brokers = k.Brokers
	if cfg.SessionTimeout == 0 {
		cfg.SessionTimeout = 2 * time.Second
	}
	if cfg.CommitInterval == 0 {
		cfg.CommitInterval = 20 * time.Millisecond
	}
	if cfg.Name == "" {
		cfg.Name = "test"
	}
	s, err := NewSource(ctxT(t, 10*time.Second), withDefaults(cfg), log)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	s.drain = 200 * time.Millisecond
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// produce writes records, each to the partition in its Partition field.
func produce(t testing.TB, brokers []string, msgs ...kafka.Message) {
	t.Helper()
	w := &kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond,
		BatchSize:    len(msgs),
		Balancer:     kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return m.Partition }),
		Transport:    &kafka.Transport{},
	}
	defer w.Close()
	if err := w.WriteMessages(ctxT(t, 20*time.Second), msgs...); err != nil {
		t.Fatalf("produce %d records: %v", len(msgs), err)
	}
}

// records makes n records spread over partitions, bodies "m<i>".
func records(topic string, from, n, partitions int) []kafka.Message {
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = kafka.Message{Topic: topic, Partition: (from + i) % partitions, Value: []byte(fmt.Sprintf("m%d", from+i))}
	}
	return msgs
}

type got struct {
	in  *envelope.Incoming
	ack ingest.AckFunc
}

func readOne(t testing.TB, s *Source, d time.Duration) got {
	t.Helper()
	in, ack, err := s.Read(ctxT(t, d))
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	return got{in, ack}
}

// committed returns the group's committed offset of topic/partition (-1: none).
func committed(t testing.TB, k *testenv.KafkaCluster, group, topic string, partition int) int64 {
	t.Helper()
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	c := &kafka.Client{Addr: kafka.TCP(k.Brokers...), Timeout: 5 * time.Second, Transport: tr}
	res, err := c.OffsetFetch(ctxT(t, 5*time.Second), &kafka.OffsetFetchRequest{
		GroupID: group, Topics: map[string][]int{topic: {partition}},
	})
	if err != nil {
		t.Fatalf("offset fetch: %v", err)
	}
	for _, p := range res.Topics[topic] {
		if p.Partition == partition {
			return p.CommittedOffset
		}
	}
	t.Fatalf("offset fetch: no partition %d", partition)
	return 0
}

func offsetOf(t testing.TB, in *envelope.Incoming) (string, int64) {
	t.Helper()
	i := strings.LastIndexByte(in.Origin.PositionID(), '/')
	var off int64
	if _, err := fmt.Sscan(in.Origin.PositionID()[i+1:], &off); err != nil {
		t.Fatalf("position %q: %v", in.Origin.PositionID(), err)
	}
	return in.Origin.PositionID()[:i], off
}

func TestSourceCheckpointer(t *testing.T) {
	c := newCheckpointer(10)
	if c.committable() != 10 {
		t.Fatalf("empty: %d", c.committable())
	}
	for _, o := range []int64{10, 11, 13, 14, 20} { // gaps: compaction
		c.add(o)
	}
	steps := []struct {
		finish int64
		known  bool
		want   int64
	}{
		{11, true, 10}, {13, true, 10}, {10, true, 14}, {10, false, 14}, {12, false, 14},
		{20, true, 14}, {14, true, 21},
	}
	for _, s := range steps {
		if k := c.finish(s.finish); k != s.known {
			t.Fatalf("finish(%d) = %v", s.finish, k)
		}
		if c.committable() != s.want {
			t.Fatalf("after finish(%d): committable %d, want %d", s.finish, c.committable(), s.want)
		}
	}
	if c.pending() != 0 {
		t.Fatalf("pending %d", c.pending())
	}
}

func TestSourceRoundTrip(t *testing.T) {
	const topic = "rt"
	k := testenv.Kafka(t, testenv.WithTopic(topic, 1))
	ts := time.Date(2026, 5, 1, 12, 0, 0, 123e6, time.UTC)
	hs := []kafka.Header{
		{Key: "x-delay", Value: []byte("5s")},
		{Key: "dup", Value: []byte("1")},
		{Key: "bin", Value: []byte{0, 0xff, 'a'}},
		{Key: "dup", Value: []byte("2")},
		{Key: "empty", Value: nil}, // null
	}
	produce(t, k.Brokers,
		kafka.Message{Topic: topic, Key: []byte("k1"), Value: []byte("body-1"), Headers: hs, Time: ts},
		kafka.Message{Topic: topic, Value: []byte("no key")},
	)
	// Send, the `delaybridge send` path.
	if _, err := Send(ctxT(t, 10*time.Second), SourceParams{Brokers: k.Brokers, Topic: topic}, ingest.Publication{Key: []byte("k3"),
		Headers: envelope.Headers{{Key: "x-delay", Value: "1m"}, {Key: "a", Value: "b"}}, Body: []byte("sent")}); err != nil {
		t.Fatalf("Send: %v", err)
	}

	s := newSource(t, k, SourceParams{Topic: topic, Group: "g"})
	testenv.Eventually(t, 10*time.Second, func() bool { return s.Ready() == nil }, "Ready: %v", s.Ready())

	g := readOne(t, s, 15*time.Second)
	in := g.in
	if in.Origin.PositionID() != "rt/0/0" || string(in.Body) != "body-1" || string(in.Key) != "k1" {
		t.Fatalf("first record: %+v", in)
	}
	if !in.PublishedAt.Equal(ts) {
		t.Errorf("PublishedAt %v, want %v", in.PublishedAt, ts)
	}
	want := hdrs("x-delay", "5s", "dup", "1", "bin", "\x00\xffa", "dup", "2", "empty", "")
	want[4].Null = true // a null header value, as sent
	if fmt.Sprint(in.Headers) != fmt.Sprint(want) {
		t.Errorf("headers %q, want %q", in.Headers, want)
	}
	if v, _ := in.Headers.Get("X-Delay"); v != "5s" {
		t.Errorf("case-insensitive lookup: %q", v)
	}
	if err := g.ack(context.Background(), nil); err != nil {
		t.Fatal(err)
	}

	g = readOne(t, s, 5*time.Second)
	if g.in.Origin.PositionID() != "rt/0/1" || g.in.Key != nil || string(g.in.Body) != "no key" || len(g.in.Headers) != 0 {
		t.Fatalf("second record: %+v (key nil: %v)", g.in, g.in.Key == nil)
	}
	if g.in.PublishedAt.IsZero() || time.Since(g.in.PublishedAt) > time.Minute {
		t.Errorf("second record: PublishedAt %v, want the produce time", g.in.PublishedAt)
	}
	_ = g.ack(context.Background(), nil)

	g = readOne(t, s, 5*time.Second)
	if g.in.Origin.PositionID() != "rt/0/2" || string(g.in.Key) != "k3" || string(g.in.Body) != "sent" ||
		fmt.Sprint(g.in.Headers) != fmt.Sprint(hdrs("x-delay", "1m", "a", "b")) {
		t.Fatalf("sent record: %+v", g.in)
	}
	_ = g.ack(context.Background(), nil)
	testenv.Eventually(t, 5*time.Second, func() bool { return committed(t, k, "g", topic, 0) == 3 }, "commit of 3")
	if err := s.Close(ctxT(t, 10*time.Second)); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, _, err := s.Read(context.Background()); !errors.Is(err, ingest.ErrClosed) {
		t.Fatalf("Read after Close: %v", err)
	}
}

// A topic deleted and created again while the ingest reads it: the offset
// the ingest holds is past the new partition's end, and it reads the new
// records from the first, instead of asking for that offset for ever.
func TestSourceTopicCreatedAgain(t *testing.T) {
	const topic = "again"
	k := testenv.Kafka(t, testenv.WithTopic(topic, 1))
	for i := range 3 {
		produce(t, k.Brokers, kafka.Message{Topic: topic, Value: []byte(fmt.Sprint("old-", i))})
	}
	s := newSource(t, k, SourceParams{Topic: topic, Group: "g"})
	for i := range 3 {
		g := readOne(t, s, 15*time.Second)
		if string(g.in.Body) != fmt.Sprint("old-", i) {
			t.Fatalf("record %d: %q", i, g.in.Body)
		}
		_ = g.ack(context.Background(), nil)
	}
	admin := &kafka.Client{Addr: kafka.TCP(k.Brokers...), Timeout: 10 * time.Second}
	if res, err := admin.DeleteTopics(ctxT(t, 10*time.Second), &kafka.DeleteTopicsRequest{Topics: []string{topic}}); err != nil || res.Errors[topic] != nil {
		t.Fatalf("delete topic: %v %v", err, res)
	}
	if res, err := admin.CreateTopics(ctxT(t, 10*time.Second), &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: 1, ReplicationFactor: 1}}}); err != nil || res.Errors[topic] != nil {
		t.Fatalf("create topic: %v %v", err, res)
	}
	produce(t, k.Brokers, kafka.Message{Topic: topic, Value: []byte("new-0")}, kafka.Message{Topic: topic, Value: []byte("new-1")})
	for i := range 2 {
		g := readOne(t, s, 30*time.Second)
		if string(g.in.Body) != fmt.Sprint("new-", i) {
			t.Fatalf("after the topic was created again, record %d: %q", i, g.in.Body)
		}
		_ = g.ack(context.Background(), nil)
	}
}

func TestSourceNewFails(t *testing.T) {
	k := testenv.Kafka(t, testenv.WithBrokers(1))
	_, err := NewSource(ctxT(t, 10*time.Second), withDefaults(SourceParams{Brokers: k.Brokers, Topic: "nope", Group: "g"}), testLog(t))
	if err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("unknown topic: %v", err)
	}
	port := testenv.FreePort(t)
	start := time.Now()
	_, err = NewSource(ctxT(t, 10*time.Second), withDefaults(SourceParams{Brokers: []string{fmt.Sprintf("127.0.0.1:%d", port)}, Topic: "t", Group: "g"}), testLog(t))
	if err == nil {
		t.Fatal("no broker: no error")
	}
	t.Logf("no broker: %v (after %v)", err, time.Since(start))
	if _, err := NewSource(context.Background(), withDefaults(SourceParams{Brokers: k.Brokers, Topic: "t"}), testLog(t)); err == nil {
		t.Fatal("no group: no error")
	}
}

// Offsets 0, 1 and 3 are acknowledged, 2 is not: only 2 is committed (every
// record below it is finished), and the group's next reader starts at 2.
func TestSourceCommitOnlyAfterAck(t *testing.T) {
	const topic = "commit"
	k := testenv.Kafka(t, testenv.WithTopic(topic, 1))
	produce(t, k.Brokers, records(topic, 0, 5, 1)...)

	s := newSource(t, k, SourceParams{Topic: topic, Group: "g"})
	var gs []got
	for i := 0; i < 4; i++ {
		gs = append(gs, readOne(t, s, 15*time.Second))
		if _, off := offsetOf(t, gs[i].in); off != int64(i) {
			t.Fatalf("read %d: offset %d", i, off)
		}
	}
	for _, i := range []int{0, 1, 3} {
		_ = gs[i].ack(context.Background(), nil)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return committed(t, k, "g", topic, 0) == 2 }, "commit of 2")
	if err := s.Close(ctxT(t, 10*time.Second)); err != nil {
		t.Fatalf("Close: %v", err)
	}
	// A late acknowledgement after Close changes nothing.
	_ = gs[2].ack(context.Background(), nil)
	if c := committed(t, k, "g", topic, 0); c != 2 {
		t.Fatalf("committed %d after Close, want 2", c)
	}

	s2 := newSource(t, k, SourceParams{Topic: topic, Group: "g"})
	for want := int64(2); want < 5; want++ {
		g := readOne(t, s2, 15*time.Second)
		if _, off := offsetOf(t, g.in); off != want {
			t.Fatalf("second source: offset %d, want %d", off, want)
		}
		_ = g.ack(context.Background(), nil)
	}
	if err := s2.Close(ctxT(t, 10*time.Second)); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if c := committed(t, k, "g", topic, 0); c != 5 {
		t.Fatalf("committed %d after the second Close, want 5", c)
	}
}

// A nack leaves the record unfinished and re-reads the partition from it.
func TestSourceNackRereads(t *testing.T) {
	const topic = "nack"
	k := testenv.Kafka(t, testenv.WithTopic(topic, 1))
	produce(t, k.Brokers, records(topic, 0, 3, 1)...)
	s := newSource(t, k, SourceParams{Topic: topic, Group: "g"})
	var gs []got
	for i := 0; i < 3; i++ {
		gs = append(gs, readOne(t, s, 15*time.Second))
	}
	_ = gs[0].ack(context.Background(), nil)
	_ = gs[1].ack(context.Background(), errors.New("redis is down"))
	_ = gs[2].ack(context.Background(), nil)
	for want := int64(1); want < 3; want++ {
		g := readOne(t, s, 10*time.Second)
		if _, off := offsetOf(t, g.in); off != want {
			t.Fatalf("after nack: offset %d, want %d", off, want)
		}
		_ = g.ack(context.Background(), nil)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return committed(t, k, "g", topic, 0) == 3 }, "commit of 3")
}

// With MaxInFlightPerPartition 3, a fourth record is not fetched until one of
// the three is acknowledged.
func TestSourceInFlightCapPausesFetching(t *testing.T) {
	const topic = "cap"
	k := testenv.Kafka(t, testenv.WithTopic(topic, 1))
	produce(t, k.Brokers, records(topic, 0, 20, 1)...)
	s := newSource(t, k, SourceParams{Topic: topic, Group: "g", MaxInFlightPerPartition: 3})
	var gs []got
	for i := 0; i < 3; i++ {
		gs = append(gs, readOne(t, s, 15*time.Second))
	}
	// The fetcher is parked at the cap: nothing more is queued.
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	_, _, err := s.Read(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Read at the cap: %v, want a timeout", err)
	}
	s.mu.Lock()
	p := s.gen.parts[0]
	s.mu.Unlock()
	p.mu.Lock()
	unsettled, pending := p.unacked, p.cp.pending()
	p.mu.Unlock()
	if unsettled != 3 || pending != 3 || len(s.recs) != 0 {
		t.Fatalf("at the cap: unsettled %d, pending %d, queued %d", unsettled, pending, len(s.recs))
	}
	// Acknowledging one (not the first) frees one slot.
	_ = gs[1].ack(context.Background(), nil)
	g := readOne(t, s, 5*time.Second)
	if _, off := offsetOf(t, g.in); off != 3 {
		t.Fatalf("after one ack: offset %d, want 3", off)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, _, err = s.Read(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Read at the cap again: %v, want a timeout", err)
	}
}

// consumer reads s in the background and hands every record to the test.
type consumer struct {
	name string
	s    *Source
	recs chan got
}

func startConsumer(t *testing.T, name string, s *Source) *consumer {
	c := &consumer{name: name, s: s, recs: make(chan got, 1000)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			in, ack, err := s.Read(ctx)
			if err != nil {
				return
			}
			c.recs <- got{in, ack}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

// ackLog records which positions were acknowledged with nil, by whom.
type ackLog struct {
	mu  sync.Mutex
	pos map[string][]string
}

func (a *ackLog) ack(t testing.TB, who string, g got) {
	a.mu.Lock()
	a.pos[g.in.Origin.PositionID()] = append(a.pos[g.in.Origin.PositionID()], who)
	a.mu.Unlock()
	_ = g.ack(context.Background(), nil)
}

func (a *ackLog) missing(topic string, ends map[int]int64) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var miss []string
	for p, end := range ends {
		for o := int64(0); o < end; o++ {
			id := fmt.Sprintf("%s/%d/%d", topic, p, o)
			if len(a.pos[id]) == 0 {
				miss = append(miss, id)
			}
		}
	}
	sort.Strings(miss)
	return miss
}

// A rebalance skips nothing, and does not commit a revoked partition's
// unfinished records: A holds offset 5 of every partition unacknowledged
// when B joins; whichever partitions B gets, it reads them from offset 5 (or
// earlier), and A's late acknowledgements of those records are ignored.
func TestSourceRebalanceNoSkipNoRevokedCommit(t *testing.T) {
	const topic, parts, n = "rebal", 4, 200
	k := testenv.Kafka(t, testenv.WithTopic(topic, parts))
	produce(t, k.Brokers, records(topic, 0, n, parts)...)
	log := &ackLog{pos: map[string][]string{}}

	sa := newSource(t, k, SourceParams{Topic: topic, Group: "g", MaxInFlightPerPartition: 100})
	a := startConsumer(t, "A", sa)
	var held []got
	for len(held) < parts {
		var g got
		select {
		case g = <-a.recs:
		case <-time.After(20 * time.Second):
			t.Fatalf("A: only %d held records", len(held))
		}
		if _, off := offsetOf(t, g.in); off == 5 {
			held = append(held, g)
			continue
		}
		log.ack(t, "A", g)
	}
	// Every partition's commit stops at the held offset 5.
	testenv.Eventually(t, 10*time.Second, func() bool {
		for p := 0; p < parts; p++ {
			if committed(t, k, "g", topic, p) != 5 {
				return false
			}
		}
		return true
	}, "commits at 5")
	sa.mu.Lock()
	gen1 := sa.gen
	sa.mu.Unlock()
	if gen1 == nil || len(gen1.parts) != parts {
		t.Fatalf("A's generation: %+v", gen1)
	}

	b := startConsumer(t, "B", newSource(t, k, SourceParams{Topic: topic, Group: "g", MaxInFlightPerPartition: 100}))
	bFirst := map[string]int64{} // B's lowest offset per partition
	deadline := time.After(30 * time.Second)
	var lateAcked bool
	for len(log.missing(topic, map[int]int64{0: n / parts, 1: n / parts, 2: n / parts, 3: n / parts})) > 0 {
		select {
		case g := <-a.recs:
			log.ack(t, "A", g)
		case g := <-b.recs:
			tp, off := offsetOf(t, g.in)
			if first, ok := bFirst[tp]; !ok || off < first {
				bFirst[tp] = off
			}
			if !lateAcked {
				// B has partitions now: A's generation is over. A's late
				// acknowledgements must not count.
				lateAcked = true
				for _, h := range held {
					_ = h.ack(context.Background(), nil)
				}
				// Ignored: A's first generation's partitions stay revoked
				// with offset 5 unfinished.
				for _, p := range gen1.parts {
					p.mu.Lock()
					revoked, c := p.revoked, p.cp.committable()
					p.mu.Unlock()
					if !revoked || c != 5 {
						t.Errorf("partition %d after a late ack: revoked %v, committable %d", p.id, revoked, c)
					}
				}
			}
			log.ack(t, "B", g)
		case <-deadline:
			t.Fatalf("missing after 30s: %v", log.missing(topic, map[int]int64{0: 50, 1: 50, 2: 50, 3: 50}))
		}
	}
	if len(bFirst) == 0 {
		t.Fatal("B got no partition")
	}
	for tp, first := range bFirst {
		if first > 5 {
			t.Errorf("B started %s at %d: the revoked, unfinished offset 5 was skipped", tp, first)
		}
	}
	t.Logf("B's partitions and first offsets: %v", bFirst)
	// Held records A acknowledged after revocation were re-read by someone.
	for _, h := range held {
		log.mu.Lock()
		who := log.pos[h.in.Origin.PositionID()]
		log.mu.Unlock()
		if len(who) == 0 {
			t.Errorf("%s: acknowledged only after revocation, never re-read", h.in.Origin.PositionID())
		}
	}
	// Everything finished is committed eventually (duplicates re-read
	// after the rebalance are still arriving: acknowledge them too).
	testenv.Eventually(t, 10*time.Second, func() bool {
		for drained := false; !drained; {
			select {
			case g := <-a.recs:
				log.ack(t, "A", g)
			case g := <-b.recs:
				log.ack(t, "B", g)
			default:
				drained = true
			}
		}
		for p := 0; p < parts; p++ {
			if committed(t, k, "g", topic, p) != n/parts {
				return false
			}
		}
		return true
	}, "final commits")
}

// Brokers going away and coming back lose and skip nothing; Ready reports
// the outage.
func TestSourceBrokerRestart(t *testing.T) {
	const topic, parts = "restart", 2
	k := testenv.Kafka(t, testenv.WithTopic(topic, parts))
	produce(t, k.Brokers, records(topic, 0, 100, parts)...)
	s := newSource(t, k, SourceParams{Topic: topic, Group: "g"})
	c := startConsumer(t, "A", s)
	log := &ackLog{pos: map[string][]string{}}
	for i := 0; i < 60; i++ {
		select {
		case g := <-c.recs:
			log.ack(t, "A", g)
		case <-time.After(20 * time.Second):
			t.Fatalf("only %d records before the restart", i)
		}
	}
	start := time.Now()
	k.Close()
	testenv.Eventually(t, 20*time.Second, func() bool {
		// Keep consuming what is queued meanwhile.
		for {
			select {
			case g := <-c.recs:
				log.ack(t, "A", g)
				continue
			default:
			}
			break
		}
		return s.Ready() != nil
	}, "Ready to fail while the brokers are down")
	t.Logf("Ready while down (after %v): %v", time.Since(start), s.Ready())
	k.Restart()
	produce(t, k.Brokers, records(topic, 100, 100, parts)...)
	deadline := time.After(60 * time.Second)
	ends := map[int]int64{0: 100, 1: 100}
	for len(log.missing(topic, ends)) > 0 {
		select {
		case g := <-c.recs:
			log.ack(t, "A", g)
		case <-deadline:
			t.Fatalf("missing 60s after the restart: %v", log.missing(topic, ends))
		}
	}
	t.Logf("all 200 records acknowledged %v after the brokers went down", time.Since(start))
	testenv.Eventually(t, 20*time.Second, func() bool { return s.Ready() == nil }, "Ready after the restart: %v", s.Ready())
	dups := 0
	log.mu.Lock()
	for _, who := range log.pos {
		dups += len(who) - 1
	}
	log.mu.Unlock()
	t.Logf("duplicates: %d", dups)
}

// TestSourceNullAndEmpty: a null value, key and header value stay null,
// empty ones stay empty (kafka-go's Reader reads both as nil; the source
// reads records with the protocol client).
func TestSourceNullAndEmpty(t *testing.T) {
	rec := &kafka.Record{Offset: 7, Key: kafka.NewBytes([]byte{}), Value: nil,
		Headers: []kafka.Header{{Key: "null"}, {Key: "empty", Value: []byte{}}, {Key: "bin", Value: []byte{0, 0xff}}}}
	in, err := incoming("t", 3, rec)
	if err != nil {
		t.Fatal(err)
	}
	if in.Origin.PositionID() != "t/3/7" || in.Key == nil || len(in.Key) != 0 || !in.PublishedAt.IsZero() || in.Body != nil || !in.Tombstone {
		t.Fatalf("%+v", in)
	}
	if h := in.Headers; !h[0].Null || h[1].Null || h[1].Value != "" || h[2].Value != "\x00\xff" {
		t.Fatalf("headers %q", in.Headers)
	}
	rec = &kafka.Record{Offset: 8, Key: nil, Value: kafka.NewBytes([]byte{}), Time: time.UnixMilli(-1)}
	if in, err = incoming("t", 3, rec); err != nil || in.Key != nil || in.Body == nil || len(in.Body) != 0 || in.Tombstone || !in.PublishedAt.IsZero() {
		t.Fatalf("empty value, null key, timestamp -1: %+v %v", in, err)
	}
}

// withDefaults fills the zero fields of p with the configuration's defaults.
func withDefaults(p SourceParams) SourceParams {
	config.Default(&p.StartOffset, DefaultStartOffset)
	config.Default(&p.SessionTimeout, DefaultSessionTimeout)
	config.Default(&p.MaxInFlightPerPartition, DefaultMaxInFlightPerPartition)
	config.Default(&p.CommitInterval, DefaultCommitInterval)
	return p
}

// TestSourceReadyWhileFetchesGoUnanswered: a leader that takes fetches
// and answers none (a stopped or cut-off broker) makes Ready fail within
// fetchUnanswered and keep failing while it stays silent, past the first
// request's timeout (the error of one timed-out fetch once lasted 5 s, and
// Ready passed for the 6 s until the next one timed out); an answer makes
// it pass again.
func TestSourceReadyWhileFetchesGoUnanswered(t *testing.T) {
	t.Parallel()
	const topic = "silent"
	k := testenv.Kafka(t, testenv.WithTopic(topic, 1))
	produce(t, k.Brokers, records(topic, 0, 10, 1)...)
	s := newSource(t, k, SourceParams{Topic: topic, Group: "g"})
	c := startConsumer(t, "A", s)
	for i := 0; i < 10; i++ {
		select {
		case <-c.recs:
		case <-time.After(20 * time.Second):
			t.Fatalf("only %d records before the broker went silent", i)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return s.Ready() == nil }, "Ready before: %v", s.Ready())

	silent := make(chan struct{})
	var once sync.Once
	speak := func() { once.Do(func() { close(silent) }) }
	t.Cleanup(speak)
	k.Cluster.ControlKey(kmsg.Fetch.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		k.Cluster.KeepControl()
		select {
		case <-silent:
		default:
			k.Cluster.SleepControl(func() { <-silent })
		}
		return nil, nil, false
	})
	start := time.Now()
	testenv.Eventually(t, fetchUnanswered+5*time.Second, func() bool { return s.Ready() != nil }, "Ready to fail while fetches go unanswered")
	t.Logf("not ready after %v: %v", time.Since(start).Round(100*time.Millisecond), s.Ready())
	// Past the first fetch's timeout (10 s and fetchMaxWait) and the 5 s
	// an error used to last.
	for until := start.Add(18 * time.Second); time.Now().Before(until); {
		if err := s.Ready(); err == nil {
			t.Fatalf("Ready passed %v after the broker went silent", time.Since(start).Round(100*time.Millisecond))
		}
		select {
		case <-time.After(200 * time.Millisecond):
		case <-c.recs:
			t.Fatal("a record read while the broker is silent")
		}
	}
	speak()
	produce(t, k.Brokers, records(topic, 10, 1, 1)...)
	testenv.Eventually(t, 20*time.Second, func() bool { return s.Ready() == nil }, "Ready once the broker answers: %v", s.Ready())
}
