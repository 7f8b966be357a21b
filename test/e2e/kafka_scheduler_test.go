package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// schedulerRecord is a schedule as etf1's kafka-message-scheduler users
// write it (its clientlib, its README, kafkajs in its issue tracker): key = the
// schedule ID; headers scheduler-epoch (Unix seconds, decimal),
// scheduler-target-topic and scheduler-target-key, all strings; any other
// header passes through; the value is what the target topic gets.
func schedulerRecord(id string, epoch int64, targetKey, value string) kafka.Message {
	return kafka.Message{
		Key:   []byte(id),
		Value: []byte(value),
		Headers: []kafka.Header{
			{Key: "scheduler-epoch", Value: []byte(strconv.FormatInt(epoch, 10))},
			{Key: "scheduler-target-topic", Value: []byte("online-videos")},
			{Key: "scheduler-target-key", Value: []byte(targetKey)},
			{Key: "customer-header", Value: []byte("dummy")},
		},
	}
}

// cancelRecord is clientlib.DeleteSchedule: the key, a null value.
func cancelRecord(id string) kafka.Message { return kafka.Message{Key: []byte(id)} }

type triggered struct {
	msg kafka.Message
	at  time.Time // when the consumer read it
}

// TestKafkaSchedulerDialect runs the real binary on a schedules topic that
// etf1's scheduler users write to, unchanged:
// the record fires on the target topic at scheduler-epoch with the target
// key and the value, with etf1's scheduler-key/-topic/-timestamp headers; a
// newer record of a key replaces the parked one; a tombstone cancels it; a
// tombstone for an unknown key is simply acknowledged; an epoch in
// milliseconds, an unparsable epoch, a record without a key and a record
// mixing dialects are dead with their reason, and nothing waits behind them.
//
// The replace step needs the store side of replace (Message.Replace honoured
// by store.Park).
func TestKafkaSchedulerDialect(t *testing.T) {
	t.Parallel() // servers of its own, no timing bound (harness_test.go)
	kc := testenv.Kafka(t, testenv.WithTopic("schedules", 3), testenv.WithTopic("online-videos", 1))
	rs := testenv.Redis(t)
	d := startDaemon(t, fmt.Sprintf(`
redis: {addr: "%s", key_prefix: ks}
admin: {listen: "%%ADMIN%%"}
scheduler: {max_sleep: 250ms}
ingest:
  - name: schedules
    kafka: {brokers: ["%s"], topic: schedules, group: delaybridge, session_timeout: 2s, commit_interval: 50ms}
    dialects: [kafka-scheduler]
    route: {sink: kafka, destination: unscheduled, allow_override: true, allowed_destinations: [online-videos]}
sinks:
  - name: kafka
    kafka: {brokers: ["%s"]}
`, rs.Addr, strings.Join(kc.Brokers, `", "`), strings.Join(kc.Brokers, `", "`)))
	t.Cleanup(d.stop)

	// The target topic's consumer.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rd := kafka.NewReader(kafka.ReaderConfig{Brokers: kc.Brokers, Topic: "online-videos", Partition: 0, MaxWait: 50 * time.Millisecond})
	defer rd.Close()
	var mu sync.Mutex
	got := map[string][]triggered{} // by scheduler-key
	go func() {
		for {
			m, err := rd.ReadMessage(ctx)
			if err != nil {
				return
			}
			at := time.Now().Round(0)
			var id string
			for _, h := range m.Headers {
				if h.Key == "scheduler-key" {
					id = string(h.Value)
				}
			}
			mu.Lock()
			got[id] = append(got[id], triggered{m, at})
			mu.Unlock()
		}
	}()
	copies := func(id string) []triggered {
		mu.Lock()
		defer mu.Unlock()
		return append([]triggered(nil), got[id]...)
	}

	// The schedules producer, as etf1's users configure theirs: murmur2
	// partitioning (Java's default, the README's advice), so that every
	// record of a key lands in one partition.
	w := &kafka.Writer{Addr: kafka.TCP(kc.Brokers...), Topic: "schedules", Balancer: kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()
	produce := func(ms ...kafka.Message) {
		t.Helper()
		if err := w.WriteMessages(context.Background(), ms...); err != nil {
			t.Fatal(err)
		}
	}
	parked := func(id string) bool { code, _ := d.get("/v1/messages/"+id, nil); return code == http.StatusOK }

	now := time.Now().Unix()
	msEpoch := schedulerRecord("bad-ms", 0, "x", "in milliseconds")
	msEpoch.Headers[0].Value = []byte(strconv.FormatInt(time.Now().Add(time.Minute).UnixMilli(), 10))
	textEpoch := schedulerRecord("bad-text", 0, "x", "as text")
	textEpoch.Headers[0].Value = []byte("tomorrow")
	noKey := schedulerRecord("", now+1, "x", "no key")
	noKey.Key = nil
	mixed := schedulerRecord("bad-mixed", now+1, "x", "both dialects")
	mixed.Headers = append(mixed.Headers, kafka.Header{Key: "x-delay", Value: []byte("5000")})
	produce(msEpoch, textEpoch, noKey, mixed,
		cancelRecord("never-scheduled"),
		schedulerRecord("vid1-online", now+2, "vid1", "video 1"),
		schedulerRecord("vid2-online", now+4, "vid2", "video 2, first version"),
		schedulerRecord("vid3-online", now+3, "vid3", "video 3, cancelled"),
	)
	testenv.Eventually(t, 10*time.Second, func() bool { return parked("vid2-online") && parked("vid3-online") }, "schedules not parked")
	// A newer record of vid2 (earlier epoch, other value and target key)
	// replaces it; vid3's tombstone cancels it. The sentinel is due after
	// both: when it has fired, anything of vid2's first version or of vid3
	// would have too.
	produce(schedulerRecord("vid2-online", now+2, "vid2-new", "video 2, second version"),
		cancelRecord("vid3-online"),
		schedulerRecord("sentinel", now+5, "s", "sentinel"))

	testenv.Eventually(t, 30*time.Second, func() bool { return len(copies("sentinel")) > 0 }, "the sentinel never fired")
	var late latency
	for id, want := range map[string]struct {
		value, key string
		epoch      int64
	}{
		"vid1-online": {"video 1", "vid1", now + 2},
		"vid2-online": {"video 2, second version", "vid2-new", now + 2},
		"sentinel":    {"sentinel", "s", now + 5},
	} {
		c := copies(id)
		if len(c) != 1 {
			t.Errorf("%s triggered %d times, want once", id, len(c))
			continue
		}
		m := c[0].msg
		if string(m.Value) != want.value || string(m.Key) != want.key {
			t.Errorf("%s: value %q key %q, want %q %q", id, m.Value, m.Key, want.value, want.key)
		}
		h := map[string]string{}
		for _, kv := range m.Headers {
			h[kv.Key] = string(kv.Value)
		}
		for k, v := range map[string]string{"customer-header": "dummy", "scheduler-key": id, "scheduler-topic": "schedules", envelope.HeaderMessageID: id} {
			if h[k] != v {
				t.Errorf("%s: header %s = %q, want %q", id, k, h[k], v)
			}
		}
		if ts, err := strconv.ParseInt(h["scheduler-timestamp"], 10, 64); err != nil || ts < now-5 || ts > now+5 {
			t.Errorf("%s: scheduler-timestamp %q is not the record's timestamp in Unix seconds", id, h["scheduler-timestamp"])
		}
		for _, k := range []string{"scheduler-epoch", "scheduler-target-topic", "scheduler-target-key"} {
			if _, ok := h[k]; ok {
				t.Errorf("%s: the dialect's control header %s was forwarded", id, k)
			}
		}
		due := time.Unix(want.epoch, 0)
		if c[0].at.Before(due) {
			t.Errorf("%s: read at %v, before its scheduler-epoch %v", id, c[0].at, due)
		}
		late = append(late, c[0].at.Sub(due))
	}
	if c := copies("vid3-online"); len(c) != 0 {
		t.Errorf("vid3-online fired after its tombstone: %q", c[0].msg.Value)
	}
	t.Logf("kafka-scheduler records, read on the target topic after scheduler-epoch: %s", late.summary())

	// A record that cannot be read as a schedule is dead under its key,
	// else under its position (topic/partition/offset).
	reasons := []struct{ id, reason string }{
		{"bad-ms", "more than limits.max_delay 8760h0m0s from now: after the year 9999; it looks like Unix milliseconds"},
		{"bad-text", `scheduler-epoch "tomorrow" is not Unix seconds`},
		{"schedules/", "both scheduler-epoch (kafka-scheduler) and x-delay (delaybridge) given"},
		{"schedules/", "a kafka-scheduler record needs a key"},
	}
	dead := d.dead()
	for _, r := range reasons {
		found := false
		for _, m := range dead {
			if strings.HasPrefix(m.ID, r.id) && strings.Contains(m.Reason, r.reason) {
				found = true
			}
		}
		if !found {
			t.Errorf("no dead message %s... with a reason containing %q in %+v", r.id, r.reason, dead)
		}
	}
	if len(dead) != len(reasons) {
		t.Errorf("%d dead messages, want %d (an unknown tombstone is not dead): %+v", len(dead), len(reasons), dead)
	}
	fams := d.metrics()
	for result, want := range map[string]float64{"tombstone_unknown": 1, "cancelled": 1, "rejected": 4} {
		if n, _ := metricValue(fams, "delaybridge_ingest_messages_total", map[string]string{"result": result}); n != want {
			t.Errorf("ingest_messages_total{result=%q} = %v, want %v", result, n, want)
		}
	}
}
