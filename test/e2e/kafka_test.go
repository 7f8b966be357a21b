package e2e

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// TestKafkaIngestSurvivesKill9 produces records into a Kafka ingest while the
// daemon is killed with SIGKILL twice and restarted: every record is
// delivered at least once (offsets are committed only after parking, so a
// crash re-reads and never skips), and the re-reads park as no-ops because
// the derived ID topic/partition/offset is stable.
//
// It runs twice: with scheduler.dedupe_window at its default (2m) and off.
// Offsets are committed every 10 s (kafka commit_interval 10s, far above
// its 100 ms default), so each kill re-reads every record the killed process
// read, about half of them already delivered (delays 0-2 s). With the
// window on, such a re-read is acknowledged as a duplicate and not parked
// again: the duplicates are bounded by what was being published at the
// kills (the claims the killed process held in Redis, published again after
// their lease), not by the commit interval. With it off, every re-read of a
// delivered record is parked and delivered again.
func TestKafkaIngestSurvivesKill9(t *testing.T) {
	t.Parallel() // servers of its own, no timing bound (harness_test.go)
	var report []string
	for _, window := range []string{"2m", "0"} {
		t.Run("dedupe_window="+window, func(t *testing.T) {
			dups, inflight, reread := kafkaKill9(t, window)
			report = append(report, fmt.Sprintf("dedupe_window %s: %d duplicates, %d claims in flight at the kills, %d re-reads acknowledged as duplicates by the last process",
				window, dups, inflight, reread))
			if window != "0" && dups > inflight {
				t.Errorf("%d duplicates with the dedupe window on, more than the %d claims in flight at the kills", dups, inflight)
			}
		})
	}
	t.Logf("kafka ingest, 2 x SIGKILL, 1,500 records:\n  %s", strings.Join(report, "\n  "))
}

// kafkaKill9 is one run of TestKafkaIngestSurvivesKill9: it returns the
// duplicates the sink got, the claims the killed processes held, and the
// re-reads the last process acknowledged as duplicates.
func kafkaKill9(t *testing.T, window string) (dups, inflight, reread int) {
	kc := testenv.Kafka(t, testenv.WithTopic("delayed", 4))
	ns := testenv.NATS(t)
	rs := testenv.Redis(t, testenv.WithAppendFsync("always"))
	rdb := rs.Client()
	nc, err := nats.Connect(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var (
		mu  sync.Mutex
		got = map[int]int{}
		ids = map[string]bool{}
		bad []string
	)
	if _, err := nc.Subscribe("fired.>", func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		seq, _ := strconv.Atoi(m.Header.Get("seq"))
		got[seq]++
		ids[m.Header.Get(envelope.HeaderMessageID)] = true
		if string(m.Data) != m.Header.Get("seq") {
			bad = append(bad, fmt.Sprintf("record %s arrived with body %q", m.Header.Get("seq"), m.Data))
		}
	}); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	distinct := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(got)
	}

	d := startDaemon(t, fmt.Sprintf(`
redis: {addr: "%s", key_prefix: k}
admin: {listen: "%%ADMIN%%"}
scheduler: {max_sleep: 250ms, lease: 3s, publish_timeout: 2s, dedupe_window: %s}
ingest:
  - name: kin
    kafka: {brokers: ["%s"], topic: delayed, group: delaybridge, session_timeout: 2s, commit_interval: 10s}
    route: {sink: out, destination: fired.kafka}
sinks:
  - name: out
    nats: {url: "%s"}
`, rs.Addr, window, strings.Join(kc.Brokers, `", "`), ns.URL))

	w := &kafka.Writer{Addr: kafka.TCP(kc.Brokers...), Topic: "delayed", RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond, Balancer: &kafka.RoundRobin{}}
	defer w.Close()
	const n = 1500
	produce := func(from, to int) {
		var batch []kafka.Message
		for i := from; i < to; i++ {
			batch = append(batch, kafka.Message{
				Key:   []byte("k" + strconv.Itoa(i)),
				Value: []byte(strconv.Itoa(i)),
				Headers: []kafka.Header{
					{Key: "x-delay", Value: []byte(strconv.Itoa(rand.IntN(2000)))},
					{Key: "seq", Value: []byte(strconv.Itoa(i))},
				},
			})
		}
		if err := w.WriteMessages(context.Background(), batch...); err != nil {
			t.Fatal(err)
		}
	}
	// Each kill comes while records are being delivered, before the
	// killed process committed any offset.
	kill := func(after int) {
		testenv.Eventually(t, 30*time.Second, func() bool { return distinct() >= after }, "fewer than %d records delivered", after)
		d.proc.Kill()
		held := claimsHeld(t, rdb, "k")
		inflight += held
		t.Logf("SIGKILL with %d records delivered: the process held %d claims", distinct(), held)
		d.start()
	}
	produce(0, 500)
	kill(250)
	produce(500, 1000)
	kill(750)
	produce(1000, n)

	testenv.Eventually(t, 60*time.Second, func() bool { return distinct() == n }, "not every record delivered")
	// Quiet: nothing parked, every offset committed (the re-reads are done).
	testenv.Eventually(t, 30*time.Second, func() bool {
		lag, err := groupLag(kc.Brokers, "delaybridge", "delayed", 4)
		return err == nil && lag == 0 && d.stats().Parked == 0
	}, "the daemon did not settle")
	nc.Flush()
	mu.Lock()
	defer mu.Unlock()
	for _, b := range bad {
		t.Error(b)
	}
	for _, c := range got {
		dups += c - 1
	}
	for id := range ids {
		if !strings.HasPrefix(id, "delayed/") {
			t.Fatalf("ID %q is not derived from the Kafka position", id)
		}
	}
	v, _ := metricValue(d.metrics(), "delaybridge_ingest_messages_total", map[string]string{"result": "duplicate"})
	t.Logf("dedupe_window %s: %d records, all delivered, %d duplicates; %d claims in flight at the kills", window, n, dups, inflight)
	return dups, inflight, int(v)
}

// claimsHeld counts the messages claimed in Redis under key prefix p, 16
// shards, priority 0: in layout 1 a due score with a fraction (lease
// expiry + 0.5 or + 0.75), in layout 2 the members of the in-flight and
// claimed-ahead sets.
func claimsHeld(t *testing.T, rdb *redis.Client, p string) int {
	t.Helper()
	keys := store.NewKeys(p)
	n := 0
	for sh := range 16 {
		n += int(rdb.ZCard(context.Background(), keys.InflightAt(sh, 0)).Val() + rdb.ZCard(context.Background(), keys.AheadAt(sh, 0)).Val())
		zs, err := rdb.ZRangeWithScores(context.Background(), keys.Due(sh), 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, z := range zs {
			if z.Score != math.Trunc(z.Score) {
				n++
			}
		}
	}
	return n
}

// groupLag is the records of topic not yet committed by group.
func groupLag(brokers []string, group, topic string, partitions int) (int64, error) {
	c := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 3 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	parts := make([]int, partitions)
	reqs := make([]kafka.OffsetRequest, partitions)
	for i := range parts {
		parts[i] = i
		reqs[i] = kafka.LastOffsetOf(i)
	}
	committed, err := c.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: parts}})
	if err != nil {
		return 0, err
	}
	last, err := c.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return 0, err
	}
	end := map[int]int64{}
	for _, po := range last.Topics[topic] {
		end[po.Partition] = po.LastOffset
	}
	var lag int64
	for _, po := range committed.Topics[topic] {
		if po.Error != nil {
			return 0, po.Error
		}
		lag += end[po.Partition] - max(po.CommittedOffset, 0)
	}
	return lag, nil
}
