package envelope

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// diffMessages describes how got differs from want, or returns "". Times
// compare as instants (the codec keeps no location); Key compares nil
// against empty; Headers and Body compare by content (nil equals empty).
func diffMessages(want, got *Message) string {
	var d []string
	add := func(format string, args ...any) { d = append(d, fmt.Sprintf(format, args...)) }
	if want.ID != got.ID {
		add("ID %q, want %q", got.ID, want.ID)
	}
	if !want.DueAt.Equal(got.DueAt) {
		add("DueAt %v, want %v", got.DueAt, want.DueAt)
	}
	if want.IngestedAt.IsZero() != got.IngestedAt.IsZero() || !want.IngestedAt.Equal(got.IngestedAt) {
		add("IngestedAt %v, want %v", got.IngestedAt, want.IngestedAt)
	}
	if want.Sink != got.Sink {
		add("Sink %q, want %q", got.Sink, want.Sink)
	}
	if want.Destination != got.Destination {
		add("Destination %q, want %q", got.Destination, want.Destination)
	}
	if want.Ingest != got.Ingest {
		add("Ingest %q, want %q", got.Ingest, want.Ingest)
	}
	if (want.Key == nil) != (got.Key == nil) || !bytes.Equal(want.Key, got.Key) {
		add("Key %#v, want %#v", got.Key, want.Key)
	}
	if want.Priority != got.Priority {
		add("Priority %d, want %d", got.Priority, want.Priority)
	}
	if len(want.Headers) != len(got.Headers) {
		add("%d headers, want %d", len(got.Headers), len(want.Headers))
	} else {
		for i := range want.Headers {
			if want.Headers[i] != got.Headers[i] {
				add("header %d %+v, want %+v", i, got.Headers[i], want.Headers[i])
			}
		}
	}
	if !bytes.Equal(want.Body, got.Body) {
		add("Body of %d bytes differs from want's %d bytes", len(got.Body), len(want.Body))
	}
	if want.PublishedAt.IsZero() != got.PublishedAt.IsZero() || !want.PublishedAt.Equal(got.PublishedAt) {
		add("PublishedAt %v, want %v", got.PublishedAt, want.PublishedAt)
	}
	if want.Group != got.Group {
		add("Group %q, want %q", got.Group, want.Group)
	}
	switch w, g := want.Recur, got.Recur; {
	case (w == nil) != (g == nil):
		add("Recur %+v, want %+v", g, w)
	case w != nil && (w.Every != g.Every || w.Cron != g.Cron || w.TimeZone != g.TimeZone || !w.Anchor.Equal(g.Anchor) ||
		!w.Until.Equal(g.Until) || w.Count != g.Count || w.N != g.N || w.Missed != g.Missed):
		add("Recur %+v, want %+v", *g, *w)
	}
	if want.Origin != got.Origin {
		add("Origin %+v, want %+v", got.Origin, want.Origin)
	}
	if want.Source != got.Source {
		add("Source %q, want %q", got.Source, want.Source)
	}
	if want.NullBody != got.NullBody {
		add("NullBody %v, want %v", got.NullBody, want.NullBody)
	}
	if fmt.Sprint(want.Properties) != fmt.Sprint(got.Properties) {
		add("Properties %+v, want %+v", got.Properties, want.Properties)
	}
	return strings.Join(d, "; ")
}

var codecDue = time.Date(2026, 12, 1, 10, 0, 0, 123e6, time.UTC)

func fullMessage() *Message {
	return &Message{
		ID:          "order-42",
		DueAt:       codecDue,
		Sink:        "rabbit",
		Destination: "orders.expired",
		Key:         []byte("key\x00\xff"),
		Headers:     hdrs("content-type", "application/json", "bin", "\x00\x01\xff\xfe", "content-type", "dup", "", ""),
		Body:        []byte("{\"a\":1}"),
		Priority:    7,
		Ingest:      "orders-in",
		IngestedAt:  codecDue.Add(-5 * time.Second),
	}
}

func roundTrip(t *testing.T, m *Message) ([]byte, *Message) {
	t.Helper()
	enc := Encode(nil, m)
	if !bytes.HasSuffix(enc, m.Body) {
		t.Fatalf("encoding does not end with the body")
	}
	if n := EncodedSize(m); len(enc) > n {
		t.Fatalf("EncodedSize %d < encoded length %d", n, len(enc))
	}
	got, err := Decode(m.ID, enc)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if diff := diffMessages(m, got); diff != "" {
		t.Fatalf("round trip: %s", diff)
	}
	fromString, err := Codec{}.DecodeString(m.ID, string(enc))
	if err != nil {
		t.Fatalf("DecodeString: %v", err)
	}
	if diff := diffMessages(m, fromString); diff != "" {
		t.Fatalf("round trip through DecodeString: %s", diff)
	}
	return enc, got
}

func TestCodecRoundTrip(t *testing.T) {
	manyHeaders := make(Headers, 1000)
	for i := range manyHeaders {
		manyHeaders[i] = Header{Key: fmt.Sprintf("h-%d", i), Value: strings.Repeat("v", i%300)}
	}
	bigBody := make([]byte, 1<<20)
	for i := range bigBody {
		bigBody[i] = byte(i * 7)
	}
	cases := []struct {
		name string
		mod  func(*Message)
	}{
		{"full", func(*Message) {}},
		{"nil key", func(m *Message) { m.Key = nil }},
		{"empty key", func(m *Message) { m.Key = []byte{} }},
		{"no headers", func(m *Message) { m.Headers = nil }},
		{"many headers", func(m *Message) { m.Headers = manyHeaders }},
		{"long header value", func(m *Message) { m.Headers = hdrs("big", strings.Repeat("x", 70000)) }},
		{"empty body", func(m *Message) { m.Body = nil }},
		{"1 MB body", func(m *Message) { m.Body = bigBody }},
		{"body like an encoding", func(m *Message) { m.Body = Encode(nil, fullMessage()) }},
		{"priority 0", func(m *Message) { m.Priority = 0 }},
		{"priority 9", func(m *Message) { m.Priority = 9 }},
		{"priority 255", func(m *Message) { m.Priority = 255 }},
		{"zero IngestedAt", func(m *Message) { m.IngestedAt = time.Time{} }},
		{"ingested after due", func(m *Message) { m.IngestedAt = m.DueAt.Add(time.Hour) }},
		{"ingested long before due", func(m *Message) { m.IngestedAt = m.DueAt.Add(-300 * 24 * time.Hour) }},
		{"due at epoch", func(m *Message) { m.DueAt = time.UnixMilli(0) }},
		{"due before epoch", func(m *Message) { m.DueAt = time.UnixMilli(-1) }},
		{"due far future", func(m *Message) { m.DueAt = time.Date(9999, 12, 31, 23, 59, 59, 999e6, time.UTC) }},
		{"empty strings", func(m *Message) { m.Sink, m.Destination, m.Ingest = "", "", "" }},
		{"binary strings", func(m *Message) { m.Sink, m.Destination, m.Ingest = "\xff", "a\x00b", strings.Repeat("é", 200) }},
		{"empty ID", func(m *Message) { m.ID = "" }},
		{"nothing", func(m *Message) { *m = Message{DueAt: time.UnixMilli(0)} }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := fullMessage()
			c.mod(m)
			roundTrip(t, m)
		})
	}
}

func TestCodecKeyNilVersusEmpty(t *testing.T) {
	m := fullMessage()
	m.Key = nil
	_, got := roundTrip(t, m)
	if got.Key != nil {
		t.Fatalf("nil key decoded as %#v", got.Key)
	}
	m.Key = []byte{}
	_, got = roundTrip(t, m)
	if got.Key == nil || len(got.Key) != 0 {
		t.Fatalf("empty key decoded as %#v", got.Key)
	}
	if a, b := Encode(nil, &Message{Key: nil}), Encode(nil, &Message{Key: []byte{}}); bytes.Equal(a, b) {
		t.Fatalf("nil and empty key encode the same")
	}
}

// IngestedAt is stored relative to DueAt; a message ingested at the very
// millisecond it is due (x-delay: 0) must keep it (flag bit 1).
func TestCodecIngestedAtEqualToDueAt(t *testing.T) {
	m := fullMessage()
	m.IngestedAt = m.DueAt
	got, err := Decode(m.ID, Encode(nil, m))
	if err != nil {
		t.Fatal(err)
	}
	if !got.IngestedAt.Equal(m.IngestedAt) {
		t.Errorf("IngestedAt %v decoded as %v", m.IngestedAt, got.IngestedAt)
	}
	// The same through Parse with x-delay: 0.
	pm := mustPark(t, parse(t, &Incoming{Headers: hdrs(HeaderDelay, "0")}))
	got, err = Decode(pm.ID, Encode(nil, pm))
	if err != nil {
		t.Fatal(err)
	}
	if !got.IngestedAt.Equal(pm.IngestedAt) {
		t.Errorf("parsed message with x-delay 0: IngestedAt %v decoded as %v", pm.IngestedAt, got.IngestedAt)
	}
}

func TestCodecParsedMessage(t *testing.T) {
	in := &Incoming{
		Headers: hdrs(HeaderDelay, "1h30m", "a", "1", "bin", "\xff"),
		Body:    []byte("hello"),
		Key:     []byte("k"),
		Origin:  Origin{Log: "t/1", Pos: 2},
	}
	m := mustPark(t, parse(t, in))
	roundTrip(t, m)
	// A message due at an offset time round-trips as the same instant.
	m = mustPark(t, parse(t, &Incoming{Headers: hdrs(HeaderDeliverAt, "2026-12-01T12:00:00.5+02:00")}))
	_, got := roundTrip(t, m)
	if FormatTime(got.DueAt) != "2026-12-01T10:00:00.500Z" {
		t.Fatalf("due %s", FormatTime(got.DueAt))
	}
}

func TestCodecBodyRawAtEnd(t *testing.T) {
	m := fullMessage()
	m.Body = []byte("THE-BODY")
	enc := Encode(nil, m)
	withoutBody := Encode(nil, &Message{
		DueAt: m.DueAt, Sink: m.Sink, Destination: m.Destination, Key: m.Key,
		Headers: m.Headers, Priority: m.Priority, Ingest: m.Ingest, IngestedAt: m.IngestedAt,
	})
	if !bytes.Equal(enc, append(withoutBody, "THE-BODY"...)) {
		t.Fatalf("body is not stored raw after the rest of the encoding")
	}
	// The encoding of everything but the body is small.
	if len(withoutBody) > 200 {
		t.Fatalf("overhead %d bytes", len(withoutBody))
	}
	// The version byte leads, then the flags with the key bit set.
	if enc[0] != 1 || enc[1]&1 == 0 {
		t.Fatalf("version/flags % x", enc[:2])
	}
}

func TestEncodeAppends(t *testing.T) {
	m := fullMessage()
	prefix := []byte("prefix")
	enc := Encode(append([]byte(nil), prefix...), m)
	if !bytes.HasPrefix(enc, prefix) || !bytes.Equal(enc[len(prefix):], Encode(nil, m)) {
		t.Fatalf("Encode does not append to dst")
	}
}

func TestDecodeIDIsTheKey(t *testing.T) {
	enc := Encode(nil, fullMessage())
	got, err := Decode("other-id", enc)
	if err != nil || got.ID != "other-id" {
		t.Fatalf("Decode ID %v %v", got, err)
	}
}

func TestDecodeCorrupt(t *testing.T) {
	valid := Encode(nil, fullMessage())
	// An origin with its log emptied and its position kept (the fuzzer's
	// FuzzDecode/011c9a53fd6c43fe was one, sealed).
	withOrigin := fullMessage()
	withOrigin.Origin = Origin{Log: "Q", Pos: 48}
	noLog := Encode(nil, withOrigin)
	at := bytes.Index(noLog, []byte{1, 'Q', 48})
	if at < 0 {
		t.Fatal("the origin's log and position are not in the encoding")
	}
	noLog = append(append(append([]byte(nil), noLog[:at]...), 0, 48), noLog[at+3:]...)
	cases := []struct {
		name string
		b    []byte
		has  string
	}{
		{"nil", nil, ""},
		{"empty", []byte{}, ""},
		{"one byte", []byte{1}, ""},
		{"version 0", append([]byte{0}, valid[1:]...), "unknown version"},
		{"version 2", append([]byte{2}, valid[1:]...), "unknown version"},
		{"version 255", append([]byte{255}, valid[1:]...), "unknown version"},
		{"flag bit 3", append([]byte{1, 0x09}, valid[2:]...), "unknown flags"},
		{"flag bit 6", append([]byte{1, 0x40}, valid[2:]...), "unknown flags"},
		{"flag bit 7", append([]byte{1, 0x80}, valid[2:]...), "unknown flags"},
		{"all flags", append([]byte{1, 0xff}, valid[2:]...), "unknown flags"},
		{"only version and flags", []byte{1, 0}, ""},
		{"overlong varint", append([]byte{1, 0}, bytes.Repeat([]byte{0xff}, 11)...), "varint"},
		{"string length past the end", []byte{1, 0, 0, 0, 0, 0x7f, 'a'}, "exceeds"},
		{"huge string length", append([]byte{1, 0, 0, 0, 0}, binary.AppendUvarint(nil, 1<<62)...), "exceeds"},
		{"huge header count", append([]byte{1, 0, 0, 0, 0, 0, 0, 0}, binary.AppendUvarint(nil, 1<<62)...), "header count"},
		{"max header count", append([]byte{1, 0, 0, 0, 0, 0, 0, 0}, binary.AppendUvarint(nil, 1<<64-1)...), "header count"},
		{"header count past the end", []byte{1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0}, ""},
		{"key flag without key", []byte{1, 1, 0, 0, 0, 0, 0, 0}, ""},
		{"origin position without its log", noLog, "origin position without its log"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := Decode("id-1", c.b)
			if err == nil {
				t.Fatalf("Decode succeeded: %+v", m)
			}
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			if m != nil {
				t.Fatalf("message with error")
			}
			if !strings.Contains(err.Error(), "id-1") || !strings.Contains(err.Error(), c.has) {
				t.Fatalf("error %q does not name the ID and %q", err, c.has)
			}
		})
	}
}

func TestDecodeTruncated(t *testing.T) {
	for _, name := range []string{"full", "no key"} {
		m := fullMessage()
		if name == "no key" {
			m.Key = nil
		}
		enc := Encode(nil, m)
		bodyStart := len(enc) - len(m.Body)
		for i := 0; i < bodyStart; i++ {
			got, err := Decode("id", enc[:i])
			if err == nil {
				t.Fatalf("%s: Decode of the first %d of %d bytes succeeded: %+v", name, i, bodyStart, got)
			}
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("%s: error %v does not wrap ErrCorrupt", name, err)
			}
		}
		// Truncating the body yields a shorter body, which is what a raw body
		// at the end means.
		for i := bodyStart; i <= len(enc); i++ {
			got, err := Decode("id", enc[:i])
			if err != nil {
				t.Fatalf("%s: %d bytes: %v", name, i, err)
			}
			if !bytes.Equal(got.Body, m.Body[:i-bodyStart]) {
				t.Fatalf("%s: body %q", name, got.Body)
			}
		}
	}
}

func TestDecodeEveryByteFlipNeverPanics(t *testing.T) {
	enc := Encode(nil, fullMessage())
	for i := range enc {
		for _, x := range []byte{0x01, 0x80, 0xff} {
			b := append([]byte(nil), enc...)
			b[i] ^= x
			m, err := Decode("id", b)
			if err != nil {
				if !errors.Is(err, ErrCorrupt) || m != nil {
					t.Fatalf("byte %d ^ %#x: %v %v", i, x, m, err)
				}
				continue
			}
			checkReencode(t, m)
		}
	}
}

// checkReencode asserts that a decoded message encodes to a form that
// decodes to the same message, and that this form is stable.
func checkReencode(t testing.TB, m *Message) {
	t.Helper()
	enc := Encode(nil, m)
	if n := EncodedSize(m); len(enc) > n {
		t.Fatalf("EncodedSize %d < %d", n, len(enc))
	}
	m2, err := Decode(m.ID, enc)
	if err != nil {
		t.Fatalf("re-encoded message does not decode: %v", err)
	}
	if diff := diffMessages(m, m2); diff != "" {
		t.Fatalf("re-encode round trip: %s", diff)
	}
	if enc2 := Encode(nil, m2); !bytes.Equal(enc, enc2) {
		t.Fatalf("encoding is not stable:\n% x\n% x", enc, enc2)
	}
}
