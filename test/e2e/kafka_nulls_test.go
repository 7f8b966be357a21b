package e2e

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// debianPython is Debian's python3, which has python3-confluent-kafka
// (scripts/test-deps.sh installs it); a python3 earlier on PATH (pyenv)
// may not.
const debianPython = "/usr/bin/python3"

// TestKafkaNullsRoundTrip: a null value (a tombstone, so that a scheduled
// one still deletes its key in a compacted topic), an empty key, a null
// header value and binary keys and values reach a Kafka sink as they were
// sent to a Kafka ingest: from kafka-go, and from librdkafka
// (python3-confluent-kafka), read back by each: a null value must not come
// out empty, nor an empty key null, nor a null header value "".
func TestKafkaNullsRoundTrip(t *testing.T) {
	t.Parallel() // servers of its own, no timing bound (harness_test.go)
	kc := testenv.Kafka(t, testenv.WithTopic("nulls-in", 1), testenv.WithTopic("nulls-out", 1))
	rs := testenv.Redis(t)
	d := startDaemon(t, fmt.Sprintf(`
redis: {addr: %q, key_prefix: nulls}
admin: {listen: "%%ADMIN%%"}
scheduler: {max_sleep: 250ms}
ingest:
  - name: in
    kafka: {brokers: [%q], topic: nulls-in, group: nulls, session_timeout: 2s}
    route: {sink: out, destination: nulls-out}
sinks:
  - name: out
    kafka: {brokers: [%q]}
`, rs.Addr, kc.Brokers[0], kc.Brokers[0]))
	t.Cleanup(d.stop)

	// A record as it came out: nil for null, else hex.
	type rec struct {
		Key     *string     `json:"key"`
		Value   *string     `json:"value"`
		Headers [][]*string `json:"headers"`
	}
	hexOf := func(b []byte) *string {
		if b == nil {
			return nil
		}
		s := hex.EncodeToString(b)
		return &s
	}
	header := func(r rec, name string) (*string, bool) {
		for _, h := range r.Headers {
			if len(h) == 2 && h[0] != nil && *h[0] == name {
				return h[1], true
			}
		}
		return nil, false
	}
	show := func(s *string) string {
		if s == nil {
			return "null"
		}
		return strconv.Quote(*s)
	}
	check := func(who string, got map[string]rec) {
		t.Helper()
		null, empty, bin := got[who+"-null"], got[who+"-empty"], got[who+"-bin"]
		if null.Value != nil {
			t.Errorf("%s: the null value arrived as %q, not null", who, *null.Value)
		}
		if v, ok := header(null, "h-null"); !ok || v != nil {
			t.Errorf("%s: the null header value arrived as %s (present %v), not null", who, show(v), ok)
		}
		if empty.Key == nil || *empty.Key != "" || empty.Value == nil || *empty.Value != "" {
			t.Errorf("%s: the empty key and value arrived as %s / %s, not empty", who, show(empty.Key), show(empty.Value))
		}
		if bin.Key == nil || *bin.Key != "00ff" || bin.Value == nil || *bin.Value != "0001feff" {
			t.Errorf("%s: binary key and value arrived as %s / %s", who, show(bin.Key), show(bin.Value))
		}
		if v, ok := header(bin, "bin"); !ok || v == nil || *v != "00ff" {
			t.Errorf("%s: the binary header arrived as %s", who, show(v))
		}
	}
	idOf := func(r rec) string {
		v, _ := header(r, "x-message-id")
		if v == nil {
			return ""
		}
		b, _ := hex.DecodeString(*v)
		return string(b)
	}

	// From kafka-go, read back with the protocol client (kafka-go's Reader
	// reads a null and an empty value alike).
	w := &kafka.Writer{Addr: kafka.TCP(kc.Brokers...), Topic: "nulls-in", RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	delay := func(id string, more ...kafka.Header) []kafka.Header {
		return append([]kafka.Header{{Key: "x-delay", Value: []byte("0")}, {Key: "x-message-id", Value: []byte(id)}}, more...)
	}
	if err := w.WriteMessages(ctx,
		kafka.Message{Key: []byte("go-k1"), Value: nil, Headers: delay("go-null", kafka.Header{Key: "h-null", Value: nil})},
		kafka.Message{Key: []byte{}, Value: []byte{}, Headers: delay("go-empty")},
		kafka.Message{Key: []byte{0, 0xff}, Value: []byte{0, 1, 0xfe, 0xff}, Headers: delay("go-bin", kafka.Header{Key: "bin", Value: []byte{0, 0xff}})},
	); err != nil {
		t.Fatal(err)
	}
	client := &kafka.Client{Addr: kafka.TCP(kc.Brokers...), Timeout: 10 * time.Second}
	got := map[string]rec{}
	var offset int64
	testenv.Eventually(t, 30*time.Second, func() bool {
		res, err := client.Fetch(ctx, &kafka.FetchRequest{Topic: "nulls-out", Partition: 0, Offset: offset, MaxBytes: 1 << 20, MaxWait: 100 * time.Millisecond})
		if err != nil || res.Error != nil {
			return false
		}
		for {
			r, err := res.Records.ReadRecord()
			if errors.Is(err, io.EOF) || err != nil {
				break
			}
			offset = r.Offset + 1
			var out rec
			if out.Key, err = readAll(r.Key); err != nil {
				t.Fatal(err)
			}
			if out.Value, err = readAll(r.Value); err != nil {
				t.Fatal(err)
			}
			for _, h := range r.Headers {
				k := h.Key
				out.Headers = append(out.Headers, []*string{&k, hexOf(h.Value)})
			}
			got[idOf(out)] = out
		}
		return len(got) >= 3
	}, "the three kafka-go records did not all reach the sink topic")
	check("go", got)

	// From librdkafka, read back by librdkafka.
	py := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(debianPython, append([]string{"testdata/kafka_nulls.py"}, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("kafka_nulls.py %s: %v\n%s(python3-confluent-kafka comes with scripts/test-deps.sh)", strings.Join(args, " "), err, stderr.String())
		}
		return string(out)
	}
	py("produce", kc.Brokers[0], "nulls-in")
	got = map[string]rec{}
	for _, line := range strings.Split(strings.TrimSpace(py("consume", kc.Brokers[0], "nulls-out", "6")), "\n") {
		var r rec
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("%v in %q", err, line)
		}
		got[idOf(r)] = r
	}
	check("py", got)
}

// readAll reads a record's key or value: nil for null, else its hex.
func readAll(b kafka.Bytes) (*string, error) {
	if b == nil {
		return nil, nil
	}
	defer b.Close()
	v, err := io.ReadAll(b)
	s := hex.EncodeToString(v)
	return &s, err
}
