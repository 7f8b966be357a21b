package kafkabroker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

func newSink(t testing.TB, k *testenv.KafkaCluster, cfg SinkParams) *Sink {
	t.Helper()
	cfg.Brokers = k.Brokers
	if cfg.Name == "" {
		cfg.Name = "test"
	}
	s, err := NewSink(withSinkDefaults(cfg), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

var due = time.Date(2026, 12, 1, 10, 0, 0, 500e6, time.UTC)

func out(id, topic string, key, body []byte, kv ...string) sinks.Outgoing {
	m := &envelope.Message{ID: id, DueAt: due, Destination: topic, Key: key, Body: body}
	for i := 0; i < len(kv); i += 2 {
		m.Headers = append(m.Headers, envelope.Header{Key: kv[i], Value: kv[i+1]})
	}
	return sinks.Outgoing{Message: m, Attempt: 1}
}

// consume reads n records from every partition of topic (in total), failing
// after timeout; it then checks that no more arrive within a short while.
func consume(t testing.TB, k *testenv.KafkaCluster, topic string, partitions, n int) []kafka.Message {
	t.Helper()
	var (
		mu   sync.Mutex
		recs []kafka.Message
		wg   sync.WaitGroup
	)
	ctx, cancel := context.WithCancel(context.Background())
	for p := 0; p < partitions; p++ {
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: k.Brokers, Topic: topic, Partition: p, MaxWait: 100 * time.Millisecond})
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer r.Close()
			for {
				m, err := r.FetchMessage(ctx)
				if err != nil {
					return
				}
				mu.Lock()
				recs = append(recs, m)
				mu.Unlock()
			}
		}()
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(recs) }
	testenv.Eventually(t, 20*time.Second, func() bool { return count() >= n }, "%d records in %s", n, topic)
	// No extra records (duplicates) show up: wait for the readers to have
	// seen the partitions' ends.
	tr := &kafka.Transport{} // not the default one: its metadata cache may predate the topic
	defer tr.CloseIdleConnections()
	c := &kafka.Client{Addr: kafka.TCP(k.Brokers...), Transport: tr}
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for p := 0; p < partitions; p++ {
		req.Topics[topic] = append(req.Topics[topic], kafka.LastOffsetOf(p))
	}
	res, err := c.ListOffsets(ctxT(t, 5*time.Second), req)
	if err != nil {
		t.Fatalf("list offsets: %v", err)
	}
	total := int64(0)
	for _, po := range res.Topics[topic] {
		total += po.LastOffset
	}
	cancel()
	wg.Wait()
	if total != int64(n) || len(recs) != n {
		t.Fatalf("topic %s holds %d records, read %d, want %d", topic, total, len(recs), n)
	}
	return recs
}

func TestSinkPublishHeadersKeyAndLatency(t *testing.T) {
	k := testenv.Kafka(t, testenv.WithTopic("out", 3))
	s := newSink(t, k, SinkParams{})
	if err := s.Ready(); err != nil {
		t.Fatalf("Ready: %v", err)
	}
	// Warm up connections and metadata, then time a lone message.
	if errs := s.Publish(ctxT(t, 10*time.Second), []sinks.Outgoing{out("warm", "out", []byte("w"), nil)}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	m := out("id-1", "out", []byte("key-1"), []byte("body\x00\xff"),
		"content-type", "text/plain", "x-delay", "5s", "dup", "a", "dup", "b", "bin", "\x00\x01")
	m.Attempt = 2
	start := time.Now()
	errs := s.Publish(ctxT(t, 10*time.Second), []sinks.Outgoing{m})
	lat := time.Since(start)
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	t.Logf("a lone message was confirmed (acks=all) after %v", lat)
	// kafka-go holds a partial batch for its BatchTimeout (1 s unless set):
	// the writers have the configured one, which is short. Checked on the
	// writers rather than by the latency, which a busy machine stretches.
	if s.w.BatchTimeout != DefaultBatchTimeout || s.solo.BatchTimeout != DefaultBatchTimeout || DefaultBatchTimeout > 10*time.Millisecond {
		t.Errorf("batch timeouts %v and %v, want the default %v (at most 10ms): batching would hold a lone message back",
			s.w.BatchTimeout, s.solo.BatchTimeout, DefaultBatchTimeout)
	}
	// A message without a key.
	if errs := s.Publish(ctxT(t, 10*time.Second), []sinks.Outgoing{out("id-2", "out", nil, []byte("nokey"))}); errs[0] != nil {
		t.Fatal(errs[0])
	}

	recs := consume(t, k, "out", 3, 3)
	byID := map[string]kafka.Message{}
	for _, r := range recs {
		for _, h := range r.Headers {
			if h.Key == envelope.HeaderMessageID {
				byID[string(h.Value)] = r
			}
		}
	}
	r, ok := byID["id-1"]
	if !ok {
		t.Fatalf("id-1 not found in %d records", len(recs))
	}
	if string(r.Key) != "key-1" || !bytes.Equal(r.Value, []byte("body\x00\xff")) {
		t.Errorf("key %q body %q", r.Key, r.Value)
	}
	var hs []string
	for _, h := range r.Headers {
		hs = append(hs, h.Key+"="+string(h.Value))
	}
	want := []string{"content-type=text/plain", "dup=a", "dup=b", "bin=\x00\x01",
		"x-message-id=id-1", "x-delaybridge-due-at=2026-12-01T10:00:00.500Z", "x-delaybridge-attempt=2"}
	if fmt.Sprintf("%q", hs) != fmt.Sprintf("%q", want) {
		t.Errorf("headers %q, want %q", hs, want)
	}
	// murmur2 partitioning of the key, as the Java client does.
	if wantP := (kafka.Murmur2Balancer{}).Balance(kafka.Message{Key: []byte("key-1")}, 0, 1, 2); r.Partition != wantP {
		t.Errorf("partition %d, want %d", r.Partition, wantP)
	}
	if time.Since(r.Time) > time.Minute {
		t.Errorf("record time %v", r.Time)
	}
	if r2 := byID["id-2"]; r2.Key != nil || string(r2.Value) != "nokey" {
		t.Errorf("id-2: key %#v body %q", r2.Key, r2.Value)
	}
}

// One Publish with good and bad messages: each gets its own result, and the
// good ones are written once.
func TestSinkPerMessageErrors(t *testing.T) {
	k := testenv.Kafka(t, testenv.WithTopic("a", 2), testenv.WithTopic("b", 1))
	s := newSink(t, k, SinkParams{})
	msgs := []sinks.Outgoing{
		out("ok-a", "a", []byte("k"), []byte("1")),
		out("unknown", "not-yet", nil, []byte("2")),
		out("bad-name", "bad topic!", nil, []byte("3")),
		out("huge", "a", nil, bytes.Repeat([]byte("x"), DefaultMaxMessageBytes+1)),
		out("ok-b", "b", nil, []byte("5")),
		out("ok-a2", "a", nil, []byte("6")),
	}
	errs := s.Publish(ctxT(t, 20*time.Second), msgs)
	for i, err := range errs {
		t.Logf("%s: %v (permanent %v)", msgs[i].ID, err, sinks.IsPermanent(err))
	}
	check := func(i int, fails, permanent bool) {
		t.Helper()
		if (errs[i] != nil) != fails || sinks.IsPermanent(errs[i]) != permanent {
			t.Errorf("%s: %v, want failure %v, permanent %v", msgs[i].ID, errs[i], fails, permanent)
		}
	}
	check(0, false, false)
	check(1, true, false)
	check(2, true, true)
	check(3, true, true)
	check(4, false, false)
	check(5, false, false)
	if !strings.Contains(fmt.Sprint(errs[1]), "does not exist") {
		t.Errorf("unknown topic error: %v", errs[1])
	}
	consume(t, k, "a", 2, 2)
	consume(t, k, "b", 1, 1)

	// The unknown topic is created: the retry succeeds.
	k.CreateTopic(t, "not-yet", 1)
	testenv.Eventually(t, 15*time.Second, func() bool {
		return s.Publish(ctxT(t, 5*time.Second), msgs[1:2])[0] == nil
	}, "publish to the created topic")
	consume(t, k, "not-yet", 1, 1)
}

// A topic whose max.message.bytes is below a batch of several small messages
// refuses the batch: the small ones are retried alone and succeed, the one
// that is too large alone is permanent.
func TestSinkTopicMaxMessageBytes(t *testing.T) {
	k := testenv.Kafka(t)
	if err := k.Cluster.CreateTopic("small", 1, map[string]string{"max.message.bytes": "2000"}); err != nil {
		t.Fatal(err)
	}
	s := newSink(t, k, SinkParams{BatchTimeout: 20 * time.Millisecond})
	var msgs []sinks.Outgoing
	for i := 0; i < 5; i++ {
		msgs = append(msgs, out(fmt.Sprintf("s%d", i), "small", nil, bytes.Repeat([]byte("x"), 800)))
	}
	msgs = append(msgs, out("big", "small", nil, bytes.Repeat([]byte("x"), 3000)))
	errs := s.Publish(ctxT(t, 20*time.Second), msgs)
	for i := 0; i < 5; i++ {
		if errs[i] != nil {
			t.Errorf("%s: %v", msgs[i].ID, errs[i])
		}
	}
	if !sinks.IsPermanent(errs[5]) {
		t.Errorf("big: %v, want permanent", errs[5])
	}
	t.Logf("big: %v", errs[5])
	consume(t, k, "small", 1, 5)
}

// max_message_bytes is the sink's own limit: by default a record over 1 MiB
// is too large, saying what to raise; raised (with the topic's
// max.message.bytes), a 2 MB body is delivered.
func TestSinkMaxMessageBytes(t *testing.T) {
	k := testenv.Kafka(t)
	if err := k.Cluster.CreateTopic("big", 1, map[string]string{"max.message.bytes": strconv.Itoa(8 << 20)}); err != nil {
		t.Fatal(err)
	}
	body := bytes.Repeat([]byte("x"), 2_000_000)
	byDefault := newSink(t, k, SinkParams{})
	err := byDefault.Publish(ctxT(t, 20*time.Second), []sinks.Outgoing{out("m", "big", nil, body)})[0]
	if !sinks.IsPermanent(err) || !strings.Contains(fmt.Sprint(err), "max_message_bytes 1048576 (raise sinks[].kafka.max_message_bytes") {
		t.Fatalf("2 MB by default: %v, want too large, saying what to raise", err)
	}
	raised := newSink(t, k, SinkParams{MaxMessageBytes: 4 << 20})
	if err := raised.Publish(ctxT(t, 20*time.Second), []sinks.Outgoing{out("m", "big", nil, body)})[0]; err != nil {
		t.Fatalf("2 MB with max_message_bytes 4 MiB: %v", err)
	}
	consume(t, k, "big", 1, 1)
}

// Many goroutines publishing one message each: every message is written
// once, and messages of different calls share produce requests.
func TestSinkConcurrentPublish(t *testing.T) {
	const goroutines, each, parts = 50, 20, 4
	k := testenv.Kafka(t, testenv.WithTopic("conc", parts))
	s := newSink(t, k, SinkParams{BatchTimeout: 5 * time.Millisecond})
	_ = s.w.Stats() // reset
	var wg sync.WaitGroup
	errc := make(chan error, goroutines*each)
	for g := 0; g < goroutines; g++ {
		wg.Go(func() {
			for i := 0; i < each; i++ {
				m := out(fmt.Sprintf("g%d-%d", g, i), "conc", []byte(fmt.Sprint(g)), []byte("x"))
				if err := s.Publish(ctxT(t, 20*time.Second), []sinks.Outgoing{m})[0]; err != nil {
					errc <- err
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	st := s.w.Stats()
	t.Logf("%d messages in %d produce requests", st.Messages, st.Writes)
	if st.Writes >= st.Messages {
		t.Errorf("no batching across callers: %d requests for %d messages", st.Writes, st.Messages)
	}
	recs := consume(t, k, "conc", parts, goroutines*each)
	seen := map[string]bool{}
	for _, r := range recs {
		for _, h := range r.Headers {
			if h.Key == envelope.HeaderMessageID {
				if seen[string(h.Value)] {
					t.Errorf("duplicate %s", h.Value)
				}
				seen[string(h.Value)] = true
			}
		}
	}
	if len(seen) != goroutines*each {
		t.Errorf("%d distinct messages", len(seen))
	}
}

func TestSinkCompression(t *testing.T) {
	k := testenv.Kafka(t, testenv.WithTopic("z", 1))
	for _, c := range []string{"gzip", "snappy", "lz4", "zstd"} {
		s := newSink(t, k, SinkParams{Compression: c})
		if err := s.Publish(ctxT(t, 10*time.Second), []sinks.Outgoing{out(c, "z", nil, bytes.Repeat([]byte(c), 100))})[0]; err != nil {
			t.Fatalf("%s: %v", c, err)
		}
	}
	consume(t, k, "z", 1, 4)
	if _, err := NewSink(withSinkDefaults(SinkParams{Brokers: k.Brokers, Compression: "brotli"}), slog.Default()); err == nil {
		t.Fatal("unknown compression accepted")
	}
}

// Ready follows the brokers; a publish while they are down fails
// retryably, and works again after they are back.
func TestSinkBrokersDown(t *testing.T) {
	k := testenv.Kafka(t, testenv.WithTopic("d", 1))
	s := newSink(t, k, SinkParams{})
	if errs := s.Publish(ctxT(t, 10*time.Second), []sinks.Outgoing{out("1", "d", nil, nil)}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	k.Close()
	testenv.Eventually(t, 10*time.Second, func() bool { return s.Ready() != nil }, "Ready to fail")
	t.Logf("Ready while down: %v", s.Ready())
	start := time.Now()
	err := s.Publish(ctxT(t, 3*time.Second), []sinks.Outgoing{out("2", "d", nil, nil)})[0]
	if err == nil || sinks.IsPermanent(err) {
		t.Fatalf("publish while down: %v", err)
	}
	t.Logf("publish while down: %v (after %v)", err, time.Since(start))
	k.Restart()
	testenv.Eventually(t, 10*time.Second, func() bool { return s.Ready() == nil }, "Ready after restart")
	testenv.Eventually(t, 20*time.Second, func() bool {
		return s.Publish(ctxT(t, 5*time.Second), []sinks.Outgoing{out("3", "d", nil, nil)})[0] == nil
	}, "publish after restart")
}

// endable is a caller's context whose deadline passes when the test says
// (end), not at a time a busy machine could reach before the sink handed
// its batch over: until then the deadline is an hour away. The sink sees
// it end as a deadline (ctx.Err, sinks.Expired); kafka-go, under
// context.WithoutCancel, does not.
type endable struct {
	context.Context
	done    chan struct{}
	once    sync.Once
	endedAt atomic.Int64 // Unix ns; 0 until end
	far     time.Time
}

func newEndable() *endable {
	return &endable{Context: context.Background(), done: make(chan struct{}), far: time.Now().Add(time.Hour)}
}

// end makes the deadline pass now.
func (c *endable) end() {
	c.once.Do(func() { c.endedAt.Store(time.Now().UnixNano()); close(c.done) })
}

func (c *endable) Deadline() (time.Time, bool) {
	if at := c.endedAt.Load(); at != 0 {
		return time.Unix(0, at), true
	}
	return c.far, true
}

func (c *endable) Done() <-chan struct{} { return c.done }

func (c *endable) Err() error {
	if c.endedAt.Load() != 0 {
		return context.DeadlineExceeded
	}
	return nil
}

// holdProduce holds every produce request at k until release is closed,
// and sends the partitions each one names on got as it arrives.
func holdProduce(k *testenv.KafkaCluster, release <-chan struct{}, got chan<- []int32, answer func(*kmsg.ProduceRequest) kmsg.Response) {
	k.Cluster.ControlKey(int16(kmsg.Produce), func(r kmsg.Request) (kmsg.Response, error, bool) {
		k.Cluster.KeepControl()
		req := r.(*kmsg.ProduceRequest)
		var ps []int32
		for _, rt := range req.Topics {
			for _, rp := range rt.Partitions {
				ps = append(ps, rp.Partition)
			}
		}
		got <- ps
		k.Cluster.SleepControl(func() { <-release })
		if resp := answer(req); resp != nil {
			return resp, nil, true
		}
		return nil, nil, false // handled as usual: written
	})
}

// waitHeld waits until the held produce requests have named every one of
// partitions.
func waitHeld(t *testing.T, got <-chan []int32, partitions ...int32) {
	t.Helper()
	want := map[int32]bool{}
	for _, p := range partitions {
		want[p] = true
	}
	for len(want) > 0 {
		select {
		case ps := <-got:
			for _, p := range ps {
				delete(want, p)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("no produce request for partitions %v reached the broker", want)
		}
	}
}

// TestNothingWrittenAfterPublishFailed: a publish whose caller's time ends
// while the broker holds its produce request returns only once kafka-go is
// done with the batch, with the batch's real outcome. kafka-go goes on with
// a batch whose call ended; a sink that returned at the deadline said
// "failed" and then the record was appended, so that a message cancelled in
// between (204) still arrived.
func TestNothingWrittenAfterPublishFailed(t *testing.T) {
	k := testenv.Kafka(t, testenv.WithTopic("held", 1))
	s := newSink(t, k, SinkParams{})
	if errs := s.Publish(ctxT(t, 10*time.Second), []sinks.Outgoing{out("0", "held", nil, nil)}); errs[0] != nil {
		t.Fatal(errs[0]) // metadata and connection in place
	}
	release, got := make(chan struct{}), make(chan []int32, 16)
	holdProduce(k, release, got, func(*kmsg.ProduceRequest) kmsg.Response { return nil })
	ctx := newEndable()
	done := make(chan error, 1)
	go func() { done <- s.Publish(ctx, []sinks.Outgoing{out("1", "held", nil, nil)})[0] }()
	waitHeld(t, got, 0)
	ctx.end() // the caller's time is up; the broker still holds the request
	close(release)
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Publish did not return")
	}
	if err != nil {
		// Failed: the record must never be written.
		t.Fatalf("publish: %v; the broker appended the record once released, so a failure here is what the sink must not say", err)
	}
	consume(t, k, "held", 1, 2) // confirmed, and written once
}

// TestLateBatchKeepsEachResult: a batch over two partitions whose
// produce requests are both answered after the publish's deadline, one
// confirmed and one refused: the confirmed message has no error (it was
// written: publishing it again would duplicate it, and a cancel would
// answer 204 for it), and the refused one has the deadline's error first
// (a timeout to the scheduler) with the broker's reason after it.
func TestLateBatchKeepsEachResult(t *testing.T) {
	k := testenv.Kafka(t, testenv.WithTopic("mixed", 2))
	s := newSink(t, k, SinkParams{})
	// A key for each partition, as the sink's balancer places them.
	keys := map[int][]byte{}
	for i := 0; len(keys) < 2; i++ {
		key := []byte(fmt.Sprint("k", i))
		p := (kafka.Murmur2Balancer{}).Balance(kafka.Message{Key: key}, 0, 1)
		if keys[p] == nil {
			keys[p] = key
		}
	}
	warm := []sinks.Outgoing{out("w0", "mixed", keys[0], nil), out("w1", "mixed", keys[1], nil)}
	for _, err := range s.Publish(ctxT(t, 10*time.Second), warm) {
		if err != nil {
			t.Fatal(err) // metadata and connections in place
		}
	}
	release, got := make(chan struct{}), make(chan []int32, 16)
	holdProduce(k, release, got, func(req *kmsg.ProduceRequest) kmsg.Response {
		refuse := false
		for _, rt := range req.Topics {
			for _, rp := range rt.Partitions {
				refuse = refuse || rp.Partition == 1
			}
		}
		if !refuse {
			return nil // handled as usual: written
		}
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, kerr.InvalidRecord.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp
	})
	ctx := newEndable()
	done := make(chan []error, 1)
	go func() {
		done <- s.Publish(ctx, []sinks.Outgoing{out("m0", "mixed", keys[0], []byte("zero")), out("m1", "mixed", keys[1], []byte("one"))})
	}()
	waitHeld(t, got, 0, 1)
	ctx.end() // the caller's time is up; the broker still holds both requests
	close(release)
	var errs []error
	select {
	case errs = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Publish did not return")
	}
	if errs[0] != nil {
		t.Errorf("the message confirmed after the deadline failed: %v", errs[0])
	}
	if errs[1] == nil || !errors.Is(errs[1], context.DeadlineExceeded) || !errors.Is(errs[1], kafka.InvalidRecord) {
		t.Errorf("the message refused after the deadline: %v, want the deadline's error and the broker's", errs[1])
	}
	recs := consume(t, k, "mixed", 2, 3) // the two warm-ups and m0
	for _, m := range recs {
		if string(m.Value) == "one" {
			t.Errorf("the refused message was written")
		}
	}
}

// BenchmarkPublish publishes to kfake (3 brokers, 8 partitions) messages of
// 200 bytes: "batch100" from 4 goroutines per CPU, 100 messages per call
// (the scheduler's shape under load); "single" one message per call from one
// goroutine (the latency of a lone due message).
func BenchmarkPublish(b *testing.B) {
	k := testenv.Kafka(b, testenv.WithTopic("bench", 8))
	s := newSink(b, k, SinkParams{})
	body := bytes.Repeat([]byte("x"), 200)
	b.Run("batch100", func(b *testing.B) {
		const batch = 100
		start := time.Now()
		var n atomic.Int64
		b.SetParallelism(4)
		b.RunParallel(func(pb *testing.PB) {
			msgs := make([]sinks.Outgoing, batch)
			for i := range msgs {
				msgs[i] = out(fmt.Sprintf("m%d", i), "bench", []byte(fmt.Sprint(i)), body)
			}
			for pb.Next() {
				for _, err := range s.Publish(context.Background(), msgs) {
					if err != nil {
						b.Error(err)
						return
					}
				}
				n.Add(batch)
			}
		})
		b.ReportMetric(float64(n.Load())/time.Since(start).Seconds(), "msg/s")
	})
	b.Run("single", func(b *testing.B) {
		msgs := []sinks.Outgoing{out("one", "bench", []byte("k"), body)}
		start := time.Now()
		for b.Loop() {
			if err := s.Publish(context.Background(), msgs)[0]; err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msg/s")
	})
}

// withSinkDefaults fills the zero fields of p with the configuration's
// defaults.
func withSinkDefaults(p SinkParams) SinkParams {
	config.Default(&p.BatchTimeout, DefaultBatchTimeout)
	config.Default(&p.BatchSize, DefaultBatchSize)
	return p
}
