package envelope

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fuzzLimits are small so that the fuzzer reaches every limit.
var fuzzLimits = Limits{
	MaxDelay:        365 * 24 * time.Hour,
	MaxPayloadBytes: 64,
	MaxHeaderBytes:  512,
	MaxIDBytes:      40,
}

// Bits of FuzzParse's mask: which headers are present and how the route is
// configured. A header is present when its bit is set, so that the fuzzer
// can give empty values as well as leave headers out.
const (
	fzDelay = 1 << iota
	fzAt
	fzID
	fzSink
	fzDest
	fzCancel
	fzPrio
	fzExtra1
	fzExtra2
	fzNats
	fzOverride
	fzAllowedSinks
	fzAllowedDests
	fzDefault
	fzPublished
	fzKey
)

func FuzzParse(f *testing.F) {
	all := uint16(fzDelay | fzID | fzExtra1)
	f.Add(all, "5000", "", "order-1", "", "", "", "", "content-type", "text/plain", "", "", "", "", "", int64(0), []byte("body"))
	f.Add(uint16(fzDelay), " 5000 ", "", "", "", "", "", "", "", "", "", "", "", "", "", int64(0), []byte(nil))
	f.Add(uint16(fzDelay|fzPublished), "1h30m", "", "", "", "", "", "", "", "", "", "", "", "amqp-1", "t/0/1", int64(-5000), []byte{})
	f.Add(uint16(fzAt), "", "2026-12-01T10:00:00.123+02:00", "", "", "", "", "", "", "", "", "", "", "", "", int64(0), []byte("x"))
	f.Add(uint16(fzAt), "", "1796119200000", "", "", "", "", "", "", "", "", "", "", "", "", int64(0), []byte("x"))
	f.Add(uint16(fzAt), "", "1969-12-31T23:59:59Z", "", "", "", "", "", "", "", "", "", "", "", "", int64(0), []byte("x"))
	f.Add(uint16(fzDelay|fzAt), "1", "0", "", "", "", "", "", "", "", "", "", "", "", "", int64(0), []byte("x"))
	f.Add(uint16(fzDelay), "9223372036854775807", "", "", "", "", "", "", "", "", "", "", "", "", "", int64(0), []byte("x"))
	f.Add(uint16(fzDelay), "100000000h", "", "", "", "", "", "", "", "", "", "", "", "", "", int64(0), []byte("x"))
	f.Add(uint16(fzDelay), "-5s", "", "", "", "", "", "", "", "", "", "", "", "", "", int64(0), []byte("x"))
	f.Add(uint16(fzDelay|fzID), "1", "", "\xff\x00", "", "", "", "", "", "", "", "", "", "", "", int64(0), []byte("x"))
	f.Add(uint16(fzDelay|fzID), "1", "", "", "", "", "", "", "", "", "", "", "", "", "", int64(0), []byte("x"))
	f.Add(uint16(fzDelay|fzSink|fzDest|fzOverride|fzAllowedSinks|fzAllowedDests), "1", "", "", "kafka", "orders.x", "", "", "", "", "", "", "", "", "", int64(0), []byte("x"))
	f.Add(uint16(fzDelay|fzSink|fzDest), "1", "", "", "kafka", "orders.x", "", "", "", "", "", "", "", "", "", int64(0), []byte("x"))
	f.Add(uint16(fzCancel), "", "", "", "", "", "order-1", "", "", "", "", "", "", "", "", int64(0), []byte(nil))
	f.Add(uint16(fzCancel), "", "", "", "", "", "", "", "", "", "", "", "", "", "", int64(0), []byte(nil))
	f.Add(uint16(fzDelay|fzPrio), "1", "", "", "", "", "", "9", "", "", "", "", "", "", "", int64(0), []byte("x"))
	f.Add(uint16(fzDelay|fzPrio), "1", "", "", "", "", "", "10", "", "", "", "", "", "", "", int64(0), []byte("x"))
	f.Add(uint16(fzDelay|fzExtra1|fzExtra2), "1", "", "", "", "", "", "", "X-Delay", "2", "x-message-id", "dup", "", "", "", int64(0), []byte("x"))
	f.Add(uint16(fzDefault|fzNats|fzKey), "", "", "", "", "", "", "", "", "", "", "", "nats-1", "", "", int64(0), bytes.Repeat([]byte("b"), 65))
	f.Add(uint16(fzDefault|fzPublished), "", "", "", "", "", "", "", "", "", "", "", "", "", "", int64(400*24*3600*1000), []byte("x"))
	// Destination templates in x-delay-destination (FuzzParseDialects has
	// them in the route, with a source name, and the kafka-scheduler dialect).
	f.Add(uint16(fzDelay|fzDest|fzOverride|fzExtra1), "1", "", "", "", "{header.t}.due", "", "", "t", "eu", "", "", "", "", "", int64(0), []byte("x"))
	f.Add(uint16(fzDelay|fzDest|fzOverride|fzAllowedDests), "1", "", "", "", "orders.{header.t}", "", "", "", "", "", "", "", "", "", int64(0), []byte("x"))
	f.Add(uint16(fzDelay|fzDest|fzOverride), "1", "", "", "", "{source.2:}", "", "", "", "", "", "", "", "", "", int64(0), []byte("x"))
	f.Add(uint16(fzDelay|fzDest|fzOverride|fzExtra1), "1", "", "", "", "{{{header.t}}}", "", "", "t", "\n", "", "", "", "", "", int64(0), []byte("x"))
	f.Add(uint16(fzDelay|fzDest|fzOverride), "1", "", "", "", "{nope}", "", "", "", "", "", "", "", "", "", int64(0), []byte("x"))
	f.Add(uint16(fzDelay|fzExtra1), "1", "", "", "", "", "", "", "x-delay-replace", "True", "", "", "", "", "", int64(0), []byte("x"))
	f.Add(uint16(fzDelay|fzExtra1), "1", "", "", "", "", "", "", "x-delay-replace", "maybe", "", "", "", "", "", int64(0), []byte("x"))

	f.Fuzz(func(t *testing.T, mask uint16, delay, at, id, sink, dest, cancel, prio, k1, v1, k2, v2, natsID, nativeID, positionID string, pubOffsetMs int64, body []byte) {
		has := func(bit int) bool { return mask&uint16(bit) != 0 }
		in := &Incoming{Body: body, NativeID: nativeID}
		if positionID != "" {
			in.Origin = Origin{Log: positionID, Pos: uint64(len(body))}
		}
		add := func(bit int, k, v string) {
			if has(bit) {
				in.Headers = append(in.Headers, Header{Key: k, Value: v})
			}
		}
		add(fzExtra1, k1, v1)
		add(fzDelay, HeaderDelay, delay)
		add(fzAt, HeaderDeliverAt, at)
		add(fzID, HeaderMessageID, id)
		add(fzSink, HeaderSink, sink)
		add(fzDest, HeaderDestination, dest)
		add(fzCancel, HeaderCancel, cancel)
		add(fzPrio, HeaderPriority, prio)
		add(fzNats, HeaderNatsMsgID, natsID)
		add(fzExtra2, k2, v2)
		if has(fzKey) {
			in.Key = []byte(k1)
		}
		if has(fzPublished) {
			// Within about ±100 years of now.
			off := time.Duration(pubOffsetMs%(100*365*24*3600*1000)) * time.Millisecond
			in.PublishedAt = testNow.Add(off)
		}
		r := testRoute()
		r.AllowOverride = has(fzOverride)
		if has(fzAllowedSinks) {
			r.AllowedSinks = []string{"rabbit", "kafka"}
		}
		if has(fzAllowedDests) {
			r.AllowedDestinations = []string{"orders.*", "audit"}
		}
		if has(fzDefault) {
			r.DefaultDelay, r.HasDefaultDelay = 30*time.Second, true
		}
		inCopy := append(Headers(nil), in.Headers...)
		newID, _ := genIDs()

		d := Parse(in, r, fuzzLimits, testNow, newID)
		checkDecision(t, in, fuzzLimits, testNow, d)

		if len(inCopy) != len(in.Headers) {
			t.Fatalf("Parse modified the incoming headers")
		}
		for i := range inCopy {
			if inCopy[i] != in.Headers[i] {
				t.Fatalf("Parse modified the incoming headers")
			}
		}
		// A due time rounds up to a whole millisecond (never early): the
		// publish time counts exactly, capped at the moment of ingest; the
		// moment of ingest rounded up to a whole ms.
		base := nowMs
		if !in.PublishedAt.IsZero() {
			base = in.PublishedAt
			if base.After(testNow) {
				base = testNow
			}
		}
		hDelay, hasDelay := in.Headers.Get(HeaderDelay)
		_, hasAt := in.Headers.Get(HeaderDeliverAt)
		_, hasCancel := in.Headers.Get(HeaderCancel)
		m := d.Message
		switch d.Action {
		case Park:
			if hasAt && hasDelay {
				t.Fatalf("parked with both x-delay and x-deliver-at")
			}
			if hasCancel {
				t.Fatalf("parked a cancel")
			}
			if !hasAt && !hasDelay && !r.HasDefaultDelay {
				t.Fatalf("parked without delay header or default")
			}
			if hasDelay {
				dd, reason := ParseDelay(hDelay)
				if reason != "" || dd < 0 || !m.DueAt.Equal(CeilMillis(base.Add(dd))) {
					t.Fatalf("x-delay %q: due %v, base %v", hDelay, m.DueAt, base)
				}
			}
			if !hasAt && !hasDelay && !m.DueAt.Equal(CeilMillis(base.Add(r.DefaultDelay))) {
				t.Fatalf("default delay: due %v, base %v", m.DueAt, base)
			}
			if want := expectedID(in, fuzzLimits.MaxIDBytes); want != "" && m.ID != want {
				t.Fatalf("ID %q, want %q", m.ID, want)
			}
			if !r.AllowOverride && (m.Sink != r.Sink || m.Destination != r.Destination) {
				t.Fatalf("override without allow_override: %q %q", m.Sink, m.Destination)
			}
			syn, ok := r.syntax(m.Sink)
			if !ok {
				t.Fatalf("parked for unknown sink %q", m.Sink)
			}
			if r.AllowedDestinations != nil && m.Destination != r.Destination && !syn.MatchAny(r.AllowedDestinations, m.Destination) {
				t.Fatalf("destination %q not allowed", m.Destination)
			}
			if err := syn.Check(m.Destination, r.AllowedDestinations, false); err != nil {
				t.Fatalf("parked for a destination the sink may not reach: %v", err)
			}
			for _, h := range controlHeaders {
				if in.Headers.Count(h) > 1 {
					t.Fatalf("parked with %s given twice", h)
				}
			}
			out := m.OutHeaders(1)
			if v, _ := out.Get(HeaderMessageID); v != m.ID || out.Count(HeaderMessageID) != 1 {
				t.Fatalf("out x-message-id %q", v)
			}
			got, err := Decode(m.ID, Encode(nil, m))
			if err != nil {
				t.Fatalf("Decode of a parsed message: %v", err)
			}
			if diff := diffMessages(m, got); diff != "" {
				t.Fatalf("codec round trip of a parsed message: %s", diff)
			}
			got, err = sealK1.Decode(m.ID, sealK1.Encode(nil, m))
			if err != nil {
				t.Fatalf("Decode of a sealed parsed message: %v", err)
			}
			if diff := diffMessages(m, got); diff != "" {
				t.Fatalf("sealed round trip of a parsed message: %s", diff)
			}
		case Cancel:
			if !hasCancel {
				t.Fatalf("cancel without %s", HeaderCancel)
			}
			if v, _ := in.Headers.Get(HeaderCancel); v != d.CancelID {
				t.Fatalf("CancelID %q, header %q", d.CancelID, v)
			}
		}
	})
}

// expectedID returns the ID a valid message gets from its sources in the
// contract's order, or "" when it is generated.
func expectedID(in *Incoming, _ int) string {
	if v, ok := in.Headers.Get(HeaderMessageID); ok {
		return v
	}
	if in.NativeID != "" {
		return in.NativeID
	}
	if v, ok := in.Headers.Get(HeaderNatsMsgID); ok && v != "" {
		return v
	}
	if p := in.Origin.PositionID(); validTestID(p, 0) { // positions are not bound by max_id_bytes
		return p
	}
	return "gen-1"
}

func FuzzDecode(f *testing.F) {
	f.Add(Encode(nil, fullMessage()))
	m := fullMessage()
	m.Key, m.Headers, m.Body, m.IngestedAt = nil, nil, nil, time.Time{}
	f.Add(Encode(nil, m))
	m = fullMessage()
	m.Key = []byte{}
	f.Add(Encode(nil, m))
	f.Add([]byte{})
	f.Add([]byte{1})
	f.Add([]byte{1, 0})
	f.Add([]byte{2, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{1, 0x80, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{1, 0, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01})
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add([]byte{1, 1, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x02, 9, 1, 'a', 1, 'b', 1, 'c', 0, 1, 0, 0, 'x'})
	// Sealed blobs (flag bit 2) of the ID the target decodes with, so that
	// they open until the fuzzer changes a byte.
	sm := fullMessage()
	sm.ID = "fuzz-id"
	f.Add(sealK1.Encode(nil, sm))
	f.Add(sealK2.Encode(nil, sm))
	sm.Key, sm.Headers, sm.Body = nil, nil, nil
	f.Add(sealK1.Encode(nil, sm))
	f.Add([]byte{1, 4, 0, 0, 0, 0, 0, 0, 2, 'k', '1'})
	f.Add([]byte{1, 4, 0, 0, 0, 0, 0, 0, 0x7f})

	f.Fuzz(func(t *testing.T, b []byte) {
		orig := append([]byte(nil), b...)
		// With a Sealer (which also reads clear messages): never panics,
		// every error is ErrCorrupt, and what opens seals again.
		for _, c := range []Codec{sealK1, sealK2, {}} {
			// DecodeString decodes what Decode does, the same way.
			got, err := c.Decode("fuzz-id", b)
			fromString, serr := c.DecodeString("fuzz-id", string(b))
			if (err == nil) != (serr == nil) || (err != nil && err.Error() != serr.Error()) {
				t.Fatalf("Decode: %v; DecodeString: %v", err, serr)
			}
			if err == nil {
				if diff := diffMessages(got, fromString); diff != "" {
					t.Fatalf("DecodeString differs from Decode: %s", diff)
				}
			}
		}
		for _, c := range []Codec{sealK1, sealK2} {
			got, err := c.Decode("fuzz-id", b)
			if !bytes.Equal(orig, b) {
				t.Fatalf("sealed Decode modified its input")
			}
			if err != nil {
				if !errors.Is(err, ErrCorrupt) || got != nil {
					t.Fatalf("sealed Decode: %v, %v", got, err)
				}
				continue
			}
			if got.ID != "fuzz-id" {
				t.Fatalf("ID %q", got.ID)
			}
			checkReencodeSealed(t, c, got)
		}
		keyID, sealed, kerr := SealedKeyID(b)
		if kerr != nil && !errors.Is(kerr, ErrCorrupt) {
			t.Fatalf("SealedKeyID error %v does not wrap ErrCorrupt", kerr)
		}
		m, err := Decode("fuzz-id", b)
		if !bytes.Equal(orig, b) {
			t.Fatalf("Decode modified its input")
		}
		if sealed && (err == nil || !errors.Is(err, ErrSealed)) {
			t.Fatalf("sealed with %q but Decode without a Sealer gave %v", keyID, err)
		}
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			if m != nil {
				t.Fatalf("message together with an error")
			}
			return
		}
		if m.ID != "fuzz-id" {
			t.Fatalf("ID %q", m.ID)
		}
		if !bytes.HasSuffix(b, m.Body) {
			t.Fatalf("body is not the end of the input")
		}
		checkReencode(t, m)
	})
}

func FuzzCodecRoundTrip(f *testing.F) {
	f.Add(codecDue.UnixMilli(), codecDue.UnixMilli()-5000, true, uint8(7), "rabbit", "orders.expired", "orders-in", []byte("key"), false, uint8(3), "content-type", "\x00\xff", []byte("body"), uint8(0))
	f.Add(int64(0), int64(0), false, uint8(0), "", "", "", []byte(nil), true, uint8(0), "", "", []byte(nil), uint8(0))
	f.Add(int64(-1), int64(1), true, uint8(255), "\xff", "a\x00", "é", []byte{}, false, uint8(255), "k", strings.Repeat("v", 300), bytes.Repeat([]byte{0}, 1000), uint8(31))
	f.Add(int64(1<<63-1), int64(-1<<63), true, uint8(9), "s", "d", "i", []byte{0}, false, uint8(1), "", "", []byte{1}, uint8(5))
	f.Add(codecDue.UnixMilli(), codecDue.UnixMilli()-5000, true, uint8(0), "nats", "fired.x", "in", []byte(nil), true, uint8(4), "x-num", "42", []byte("b"), uint8(0x1f))

	f.Fuzz(func(t *testing.T, dueMs, ingestedMs int64, hasIngested bool, prio uint8, sink, dest, ingest string, key []byte, keyNil bool, nHeaders uint8, hk, hv string, body []byte, v2 uint8) {
		m := &Message{
			ID:          "rt-" + strconv.Itoa(int(nHeaders)),
			DueAt:       time.UnixMilli(dueMs),
			Sink:        sink,
			Destination: dest,
			Ingest:      ingest,
			Body:        body,
			Priority:    prio,
		}
		if hasIngested {
			m.IngestedAt = time.UnixMilli(ingestedMs)
		}
		if !keyNil {
			m.Key = key
			if m.Key == nil {
				m.Key = []byte{}
			}
		}
		for i := 0; i < int(nHeaders%32); i++ {
			m.Headers = append(m.Headers, Header{Key: hk + strconv.Itoa(i), Value: hv[:len(hv)*i/32]})
		}
		// The version 2 fields, each drawn by a bit of v2.
		if v2&1 != 0 {
			m.PublishedAt = time.UnixMilli(ingestedMs ^ dueMs)
		}
		if v2&2 != 0 {
			m.Group = hk + dest
		}
		if v2&4 != 0 {
			m.Recur = &Recurrence{Every: time.Duration(uint64(ingestedMs)%(1<<40)) * time.Millisecond, Cron: hk, TimeZone: sink,
				Anchor: time.UnixMilli(dueMs), Count: int(nHeaders), N: int(prio), Missed: Missed(prio % 3)}
			if hasIngested {
				m.Recur.Until = time.UnixMilli(ingestedMs | 1)
			}
		}
		if v2&8 != 0 && len(m.Headers) > 0 {
			m.Headers[len(m.Headers)/2].Native = "I" + hv
		}
		if v2&16 != 0 {
			m.Properties = Headers{{Key: "content_type", Value: hv, Native: hk}, {Key: "priority", Value: "5"}}
		}
		enc := Encode(nil, m)
		if !bytes.HasSuffix(enc, body) {
			t.Fatalf("encoding does not end with the body")
		}
		if n := EncodedSize(m); len(enc) > n {
			t.Fatalf("EncodedSize %d < %d", n, len(enc))
		}
		got, err := Decode(m.ID, enc)
		if err != nil {
			t.Fatalf("Decode: %v", err)
		}
		if diff := diffMessages(m, got); diff != "" {
			t.Fatalf("round trip: %s", diff)
		}
		if got.DueAt.UnixMilli() != dueMs {
			t.Fatalf("due %d, want %d", got.DueAt.UnixMilli(), dueMs)
		}
		checkReencode(t, got)

		// Sealed: round trip, open after rotation, and any changed byte
		// (its position drawn from the inputs) does not open.
		sealed := sealK1.Encode(nil, m)
		got, err = sealK2.Decode(m.ID, sealed)
		if err != nil {
			t.Fatalf("sealed Decode: %v", err)
		}
		if diff := diffMessages(m, got); diff != "" {
			t.Fatalf("sealed round trip: %s", diff)
		}
		if _, err := onlyK2.Decode(m.ID, sealed); !errors.Is(err, ErrSealed) {
			t.Fatalf("opened without its key: %v", err)
		}
		pos := int((uint64(dueMs) ^ uint64(len(body))*31 ^ uint64(nHeaders)*7) % uint64(len(sealed)))
		tampered := append([]byte(nil), sealed...)
		tampered[pos] ^= 1 << (prio % 8)
		// Clearing the sealed flag turns the blob into a message in clear,
		// which a codec accepts for migration unless RequireSealed.
		strict := sealK1
		strict.RequireSealed = true
		if m2, err := strict.Decode(m.ID, tampered); err == nil || !errors.Is(err, ErrCorrupt) {
			t.Fatalf("byte %d of %d changed, Decode = %+v, %v", pos, len(sealed), m2, err)
		}
		if _, err := strict.Decode(m.ID, Encode(nil, m)); !errors.Is(err, ErrSealed) {
			t.Fatalf("RequireSealed accepted a message in clear: %v", err)
		}
	})
}
