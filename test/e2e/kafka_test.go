package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/segmentio/kafka-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// TestKafkaIngestSurvivesKill9 produces records into a Kafka ingest while the
// daemon is killed with SIGKILL twice and restarted: every record is
// delivered at least once (offsets are committed only after parking, so a
// crash re-reads and never skips), and the re-reads park as no-ops because
// the derived ID topic/partition/offset is stable.
func TestKafkaIngestSurvivesKill9(t *testing.T) {
	kc := testenv.Kafka(t, testenv.WithTopic("delayed", 4))
	ns := testenv.NATS(t)
	rs := testenv.Redis(t, testenv.WithAppendFsync("always"))
	nc, err := nats.Connect(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	fired := make(chan *nats.Msg, 10000)
	if _, err := nc.ChanSubscribe("fired.>", fired); err != nil {
		t.Fatal(err)
	}
	nc.Flush()

	d := startDaemon(t, fmt.Sprintf(`
redis: {addr: "%s", key_prefix: k}
admin: {listen: "%%ADMIN%%"}
scheduler: {max_sleep: 250ms, lease: 3s, publish_timeout: 2s}
ingest:
  - name: kin
    kafka: {brokers: ["%s"], topic: delayed, group: delaybridge, session_timeout: 2s, commit_interval: 50ms}
    route: {sink: out, destination: fired.kafka}
sinks:
  - name: out
    nats: {url: "%s"}
`, rs.Addr, strings.Join(kc.Brokers, `", "`), ns.URL))

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
	produce(0, 500)
	d.proc.Kill()
	d.start()
	produce(500, 1000)
	testenv.Eventually(t, 20*time.Second, func() bool { return len(fired) > 300 }, "nothing fired after the first restart")
	d.proc.Kill()
	d.start()
	produce(1000, n)

	got := map[int]int{}
	ids := map[string]bool{}
	deadline := time.After(60 * time.Second)
	for len(got) < n {
		select {
		case m := <-fired:
			seq, _ := strconv.Atoi(m.Header.Get("seq"))
			got[seq]++
			ids[m.Header.Get(envelope.HeaderMessageID)] = true
			if string(m.Data) != m.Header.Get("seq") {
				t.Fatalf("record %s arrived with body %q", m.Header.Get("seq"), m.Data)
			}
		case <-deadline:
			var missing []int
			for i := 0; i < n; i++ {
				if got[i] == 0 {
					missing = append(missing, i)
				}
			}
			t.Fatalf("%d of %d records delivered; skipped: %v", len(got), n, missing)
		}
	}
	dups := 0
	for _, c := range got {
		dups += c - 1
	}
	t.Logf("kafka ingest, 2 x SIGKILL: %d records, all delivered, %d duplicates", n, dups)
	for id := range ids {
		if !strings.HasPrefix(id, "delayed/") {
			t.Fatalf("ID %q is not derived from the Kafka position", id)
		}
	}
}
