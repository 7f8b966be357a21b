package envelope

import (
	"bufio"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"
)

// GoldenMessages are the messages of testdata/blobs-v2.txt, as they were
// before the blobs were written by the version before encoding version 3.
// pkg/store's upgrade test parks the same blobs and fires them.
func GoldenMessages() []*Message {
	due := time.Date(2026, 12, 1, 10, 0, 0, 123e6, time.UTC)
	v1 := &Message{ID: "order-42", DueAt: due, Sink: "rabbit", Destination: "orders.expired", Key: []byte("key\x00\xff"),
		Headers: Headers{{Key: "content-type", Value: "application/json"}, {Key: "bin", Value: "\x00\x01\xff\xfe"}},
		Body:    []byte(`{"a":1}`), Priority: 7, Ingest: "orders-in", IngestedAt: due.Add(-5 * time.Second)}
	v2 := &Message{ID: "evt-7", DueAt: due, Sink: "kafka", Destination: "events", Key: []byte{},
		Headers: Headers{{Key: "x-n", Value: "42", Native: "I\x00\x00\x00\x2a"}, {Key: "plain", Value: ""}},
		Body:    []byte("payload"), Ingest: "events-in", IngestedAt: due.Add(-time.Minute),
		PublishedAt: due.Add(-61 * time.Second), Group: "order-42",
		Recur:      &Recurrence{Cron: "*/5 * * * *", TimeZone: "Europe/Berlin", Anchor: due.Add(-time.Hour), Until: due.Add(24 * time.Hour), Count: 10, N: 3, Missed: MissedAll},
		Properties: Headers{{Key: "content_type", Value: "text/plain"}}}
	v2e := &Message{ID: "every-1", DueAt: due, Sink: "nats", Destination: "tick", Body: []byte{}, Ingest: "in",
		Recur: &Recurrence{Every: 1500 * time.Millisecond, Anchor: due, N: 1}}
	return []*Message{v1, v2, v2e}
}

// GoldenBlobs reads testdata/blobs-v2.txt (path from the test's package):
// ID -> stored blob.
func GoldenBlobs(t testing.TB, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]byte{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		id, h, _ := strings.Cut(line, " ")
		b, err := hex.DecodeString(h)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out[id] = b
	}
	return out
}

// TestDecodesBlobsOfTheVersionBefore: messages parked before encoding
// version 3 decode to what they were, and encoding them
// again writes the same bytes (a message that needs nothing of version 3 is
// still written in the version it was).
func TestDecodesBlobsOfTheVersionBefore(t *testing.T) {
	blobs := GoldenBlobs(t, "testdata/blobs-v2.txt")
	for _, want := range GoldenMessages() {
		b, ok := blobs[want.ID]
		if !ok {
			t.Fatalf("no blob for %s", want.ID)
		}
		got, err := Decode(want.ID, b)
		if err != nil {
			t.Fatalf("%s: %v", want.ID, err)
		}
		if d := diffMessages(want, got); d != "" {
			t.Errorf("%s: %s", want.ID, d)
		}
		if again := Encode(nil, got); string(again) != string(b) {
			t.Errorf("%s: encoded again as version %d, % x; was version %d", want.ID, again[0], again, b[0])
		}
	}
}

// TestCodecVersion3: what "Identity and order" added survives the stored
// form: the origin, the print, a null body, null header values, an empty
// key, a publish time with nanoseconds.
func TestCodecVersion3(t *testing.T) {
	m := fullMessage()
	m.Origin = Origin{Log: "orders/3", Pos: 1 << 40, Print: 0xfeedfacecafebeef}
	m.NullBody, m.Body = true, nil
	m.Key = []byte{}
	m.Headers = Headers{{Key: "a", Value: "1"}, {Key: "null", Null: true}, {Key: "empty", Value: ""}}
	m.PublishedAt = codecDue.Add(-time.Second + 123456789)
	enc, got := roundTrip(t, m)
	if enc[0] != codecV3 {
		t.Fatalf("version %d, want 3", enc[0])
	}
	if !got.NullBody || got.Key == nil || len(got.Key) != 0 || !got.Headers[1].Null || got.Headers[2].Null {
		t.Fatalf("null marks lost: %+v", got)
	}
	for _, only := range []func(*Message){
		func(m *Message) { m.Origin = Origin{Log: "S", Pos: 9} },
		func(m *Message) { m.Origin = Origin{Print: 1} },
		func(m *Message) { m.NullBody = true },
		func(m *Message) { m.Source = "delayed.orders.eu" },
		func(m *Message) { m.Headers = Headers{{Key: "n", Null: true}} },
		func(m *Message) { m.PublishedAt = codecDue.Add(1) },
	} {
		m := fullMessage()
		only(m)
		if enc, _ := roundTrip(t, m); enc[0] != codecV3 {
			t.Errorf("%+v written as version %d, want 3", m, enc[0])
		}
	}
	// A publish time in whole milliseconds needs no version 3.
	m = fullMessage()
	m.PublishedAt = codecDue.Add(-time.Second)
	if enc, _ := roundTrip(t, m); enc[0] != codecV2 {
		t.Errorf("whole-ms publish time written as version %d, want 2", enc[0])
	}
}
