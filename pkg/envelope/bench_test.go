package envelope_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/pkg/brokers/natsbroker"
	"github.com/delaybridge/delaybridge/pkg/destination"
	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// Micro-benchmarks of the per-message hot path: every ingested message goes
// through Parse and Encode, every fired one through Decode and OutHeaders.
// Run: go test -run '^$' -bench . -benchmem ./pkg/envelope/

var benchRoute = &envelope.Route{
	Ingest:      "in",
	Sink:        "out",
	Destination: "fired.default",
	Sinks:       destination.Sinks{"out": natsbroker.Destinations}.Lookup,
}

var benchNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// benchIncoming is what the NATS ingest hands the pipeline for a typical
// message: x-delay, x-message-id, two application headers, a body of size.
func benchIncoming(size int) *envelope.Incoming {
	return &envelope.Incoming{
		Headers: envelope.Headers{
			{Key: "Content-Type", Value: "application/json"},
			{Key: "X-Delay", Value: "30000"},
			{Key: "X-Message-Id", Value: "m-0000001"},
			{Key: "X-Trace", Value: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		},
		Body:        make([]byte, size),
		PublishedAt: benchNow,
		Origin:      envelope.Origin{Log: "DELAYED", Pos: 123456},
	}
}

func BenchmarkParse(b *testing.B) {
	for _, c := range []struct {
		name string
		in   *envelope.Incoming
	}{
		{"x-delay-ms", benchIncoming(100)},
		{"x-delay-duration", func() *envelope.Incoming {
			in := benchIncoming(100)
			in.Headers[1].Value = "1m30s"
			return in
		}()},
		{"x-deliver-at-rfc3339", func() *envelope.Incoming {
			in := benchIncoming(100)
			in.Headers[1] = envelope.Header{Key: "x-deliver-at", Value: "2026-03-01T12:00:30.250Z"}
			return in
		}()},
		{"no-id", func() *envelope.Incoming { // falls back to the stream position
			in := benchIncoming(100)
			in.Headers = append(in.Headers[:2:2], in.Headers[3])
			return in
		}()},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				d := envelope.Parse(c.in, benchRoute, envelope.Limits{MaxDelay: 24 * time.Hour, MaxPayloadBytes: 1 << 20, MaxHeaderBytes: 64 << 10, MaxIDBytes: 256}, benchNow, nil)
				if d.Action != envelope.Park {
					b.Fatalf("not parked: %v", d.Err)
				}
			}
		})
	}
}

func benchMessage(size, headers int) *envelope.Message {
	m := &envelope.Message{
		ID:          "m-0000001",
		DueAt:       benchNow.Add(30 * time.Second),
		Sink:        "out",
		Destination: "fired.default",
		Body:        make([]byte, size),
		Ingest:      "in",
		IngestedAt:  benchNow,
	}
	for i := range headers {
		m.Headers = append(m.Headers, envelope.Header{Key: "x-app-" + strconv.Itoa(i), Value: "value-" + strconv.Itoa(i)})
	}
	return m
}

var codecCases = []struct {
	name          string
	size, headers int
}{
	{"100B-0h", 100, 0},
	{"100B-4h", 100, 4},
	{"1kB-4h", 1024, 4},
	{"64kB-4h", 64 << 10, 4},
}

func BenchmarkEncode(b *testing.B) {
	for _, c := range codecCases {
		m := benchMessage(c.size, c.headers)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(c.size))
			buf := make([]byte, 0, envelope.EncodedSize(m))
			for b.Loop() {
				buf = envelope.Encode(buf[:0], m)
			}
		})
		// What the store does: a fresh buffer per message.
		b.Run(c.name+"-alloc", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(c.size))
			for b.Loop() {
				_ = envelope.Encode(make([]byte, 0, envelope.EncodedSize(m)), m)
			}
		})
	}
}

func BenchmarkDecode(b *testing.B) {
	for _, c := range codecCases {
		m := benchMessage(c.size, c.headers)
		enc := envelope.Encode(nil, m)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(c.size))
			for b.Loop() {
				if _, err := envelope.Decode(m.ID, enc); err != nil {
					b.Fatal(err)
				}
			}
		})
		// What the store does with a Redis reply, and what it did before
		// DecodeString.
		blob := string(enc)
		b.Run(c.name+"-copy", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(c.size))
			for b.Loop() {
				if _, err := envelope.Decode(m.ID, []byte(blob)); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"-string", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(c.size))
			for b.Loop() {
				if _, err := (envelope.Codec{}).DecodeString(m.ID, blob); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkOutHeaders(b *testing.B) {
	m := benchMessage(100, 4)
	b.ReportAllocs()
	for b.Loop() {
		_ = m.OutHeaders(1)
	}
}
