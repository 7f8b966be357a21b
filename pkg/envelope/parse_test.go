package envelope

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/delaybridge/delaybridge/pkg/destination"
)

// testNow is the moment of ingest in the table tests. It has a
// sub-millisecond part to check that Parse works in milliseconds.
var testNow = time.Date(2026, 6, 1, 12, 0, 0, 500_123, time.UTC)

// nowMs is testNow rounded up to milliseconds, as Parse sees it: a delay
// counted from the moment of ingest never ends before that moment plus it.
var nowMs = CeilMillis(testNow)

// The brokers' destination syntaxes, defined in the broker packages, which
// import this one: brokers_test.go (package envelope_test) sets them.
var SyntaxNATS, SyntaxKafka, SyntaxRabbitMQ destination.Syntax

func testRoute() *Route {
	return &Route{
		Ingest:      "orders-in",
		Sink:        "rabbit",
		Destination: "orders.expired",
		Sinks:       destination.Sinks{"rabbit": SyntaxRabbitMQ, "kafka": SyntaxKafka, "nats": SyntaxNATS}.Lookup,
	}
}

// hdrs builds Headers from key, value pairs.
func hdrs(kv ...string) Headers {
	if len(kv)%2 != 0 {
		panic("hdrs: odd number of arguments")
	}
	var h Headers
	for i := 0; i < len(kv); i += 2 {
		h = append(h, Header{Key: kv[i], Value: kv[i+1]})
	}
	return h
}

// genIDs returns a newID func that hands out gen-1, gen-2, ... and counts
// its calls.
func genIDs() (func() string, *int) {
	n := 0
	return func() string {
		n++
		return "gen-" + strconv.Itoa(n)
	}, &n
}

// why is the reason of a rejected decision: its Err's words; "" for a
// decision that is not a rejection.
func why(d Decision) string {
	if d.Err == nil {
		return ""
	}
	return d.Err.Error()
}

// validTestID is an independent statement of what a valid message ID is:
// non-empty, valid UTF-8, no C0 or C1 control character, DEL, bidi
// embedding, override or isolate, at most max bytes.
func validTestID(id string, max int) bool {
	if id == "" || !utf8.ValidString(id) || (max > 0 && len(id) > max) {
		return false
	}
	for _, r := range id {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f) || strings.ContainsRune("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069", r) {
			return false
		}
	}
	return true
}

// checkDecision asserts the invariants every decision must meet, whatever
// the input: a Message with a valid ID; a Reject has a readable Reason and
// keeps no part over its limit; a Park is due no later than max_delay from
// now, forwards no control header and carries the body as it came; a Cancel
// names a valid ID.
func checkDecision(t testing.TB, in *Incoming, lim Limits, now time.Time, d Decision) {
	t.Helper()
	if d.Message == nil {
		t.Fatalf("%v decision without Message (reason %q)", d.Action, why(d))
	}
	m := d.Message
	if max := lim.MaxIDBytes; !validTestID(m.ID, max) && !(m.ID == in.Origin.PositionID() && validTestID(m.ID, 0)) {
		t.Fatalf("%v decision has invalid ID %q", d.Action, m.ID)
	}
	switch d.Action {
	case Reject:
		if why(d) == "" {
			t.Fatalf("Reject without Reason")
		}
		if !utf8.ValidString(why(d)) {
			t.Fatalf("Reason is not valid UTF-8: %q", why(d))
		}
		for _, r := range why(d) {
			if r < 0x20 || r == 0x7f {
				t.Fatalf("Reason contains control character %U: %q", r, why(d))
			}
		}
		if lim.MaxPayloadBytes > 0 && len(m.Body) > lim.MaxPayloadBytes {
			t.Fatalf("dead message keeps a body of %d bytes, over the limit %d", len(m.Body), lim.MaxPayloadBytes)
		}
		if lim.MaxHeaderBytes > 0 && m.Headers.Size() > lim.MaxHeaderBytes {
			t.Fatalf("dead message keeps headers of %d bytes, over the limit %d", m.Headers.Size(), lim.MaxHeaderBytes)
		}
	case Park:
		if why(d) != "" {
			t.Fatalf("Park with Reason %q", why(d))
		}
		if lim.MaxDelay > 0 && m.DueAt.Sub(CeilMillis(now)) > lim.MaxDelay {
			t.Fatalf("parked due %v is more than max_delay %v after now %v", m.DueAt, lim.MaxDelay, now)
		}
		if !m.DueAt.Equal(m.DueAt.Truncate(time.Millisecond)) {
			t.Fatalf("due %v is not in whole milliseconds", m.DueAt)
		}
		if m.DueAt.Before(time.Unix(0, 0)) {
			t.Fatalf("parked due %v is before 1970", m.DueAt)
		}
		for _, h := range m.Headers {
			if IsControlHeader(h.Key) {
				t.Fatalf("parked message forwards control header %q", h.Key)
			}
		}
		if !bytes.Equal(m.Body, in.Body) {
			t.Fatalf("parked body differs from the ingested body")
		}
		if m.Sink == "" {
			t.Fatalf("parked message has no sink")
		}
		if strings.TrimSpace(m.Destination) == "" || strings.ContainsFunc(m.Destination, func(c rune) bool { return c < 0x20 || c == 0x7f }) {
			t.Fatalf("parked with an invalid destination %q", m.Destination)
		}
		if m.Priority > 9 {
			t.Fatalf("priority %d over 9", m.Priority)
		}
		if lim.MaxPayloadBytes > 0 && len(m.Body) > lim.MaxPayloadBytes {
			t.Fatalf("parked body %d bytes over the limit %d", len(m.Body), lim.MaxPayloadBytes)
		}
	case Cancel:
		if !validTestID(d.CancelID, lim.MaxIDBytes) {
			t.Fatalf("Cancel of invalid ID %q", d.CancelID)
		}
	case CancelGroup:
		if !validTestID(d.Group, lim.MaxIDBytes) {
			t.Fatalf("CancelGroup of invalid group %q", d.Group)
		}
	default:
		t.Fatalf("unknown action %d", d.Action)
	}
}

// parseWith runs Parse and checks the invariants.
func parseWith(t testing.TB, in *Incoming, r *Route, lim Limits) Decision {
	t.Helper()
	newID, _ := genIDs()
	d := Parse(in, r, lim, testNow, newID)
	checkDecision(t, in, lim, testNow, d)
	return d
}

func parse(t testing.TB, in *Incoming) Decision {
	t.Helper()
	return parseWith(t, in, testRoute(), testLimits)
}

func mustPark(t testing.TB, d Decision) *Message {
	t.Helper()
	if d.Action != Park {
		t.Fatalf("got %v (reason %q), want park", d.Action, why(d))
	}
	return d.Message
}

func mustReject(t testing.TB, d Decision, reasonHas string) {
	t.Helper()
	if d.Action != Reject {
		t.Fatalf("got %v, want reject (reason containing %q)", d.Action, reasonHas)
	}
	if !strings.Contains(why(d), reasonHas) {
		t.Fatalf("reason %q does not contain %q", why(d), reasonHas)
	}
}

func TestParseDelayValid(t *testing.T) {
	cases := []struct {
		in   string
		want time.Duration
	}{
		{"5000", 5 * time.Second},
		{"0", 0},
		{" 5000 ", 5 * time.Second},
		{"\t250\n", 250 * time.Millisecond},
		{"1", time.Millisecond},
		{"1500ms", 1500 * time.Millisecond},
		{"5m", 5 * time.Minute},
		{"1h30m", 90 * time.Minute},
		{" 5s ", 5 * time.Second},
		{"1.5s", 1500 * time.Millisecond},
		{"0s", 0},
		{"1500us", 1500 * time.Microsecond},                 // exact: the due time it makes rounds up
		{"8760h", 365 * 24 * time.Hour},                     // exactly testLimits.MaxDelay
		{"31536000000", 365 * 24 * time.Hour},               // same, in ms
		{"9223372036854", 9223372036854 * time.Millisecond}, // the largest Duration in ms
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			got, reason := ParseDelay(c.in)
			if reason != "" || got != c.want {
				t.Fatalf("ParseDelay(%q) = %v, %q; want %v", c.in, got, reason, c.want)
			}
			d := parse(t, &Incoming{Headers: hdrs(HeaderDelay, c.in)})
			if c.want > testLimits.MaxDelay {
				mustReject(t, d, "max_delay")
				return
			}
			m := mustPark(t, d)
			if want := CeilMillis(nowMs.Add(c.want)); !m.DueAt.Equal(want) {
				t.Fatalf("due %v, want %v", m.DueAt, want)
			}
		})
	}
}

func TestParseDelayInvalid(t *testing.T) {
	cases := []struct {
		name, in, reasonHas string
	}{
		{"empty", "", "empty"},
		{"whitespace", " \t ", "empty"},
		{"word", "abc", "neither"},
		{"NaN", "NaN", "neither"},
		{"Inf", "Inf", "neither"},
		{"+Inf", "+Inf", "neither"},
		{"exponent", "1e3", "neither"},
		{"hex", "0x10", "neither"},
		{"unit only", "ms", "neither"},
		{"days", "1d", "neither"},
		{"sign only", "-", "neither"},
		{"inner space", "50 00", "neither"},
		{"negative ms", "-1", "negative"},
		{"negative duration", "-5s", "negative"},
		{"overflow int64", "99999999999999999999", "out of range"},
		{"overflow negative int64", "-99999999999999999999", "negative"},
		{"max int64 ms overflows a Duration", "9223372036854775807", "out of range"},
		{"one ms past the largest Duration", "9223372036855", "out of range"},
		{"overflow duration", "100000000h", "x-delay"},
		{"binary", "\xff\xfe\x00\x01", "x-delay"},
		{"non-UTF-8 digits", "50\xc000", "x-delay"},
		{"NUL", "\x00", "x-delay"},
		{"long garbage", strings.Repeat("z", 10000), "x-delay"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, reason := ParseDelay(c.in)
			if reason == "" {
				t.Fatalf("ParseDelay(%q) = %v, want a reason", c.in, got)
			}
			if !strings.Contains(reason, c.reasonHas) {
				t.Fatalf("reason %q does not contain %q", reason, c.reasonHas)
			}
			if len(reason) > 400 {
				t.Fatalf("reason is %d bytes; a reason should quote a bounded part of the value", len(reason))
			}
			mustReject(t, parse(t, &Incoming{Headers: hdrs(HeaderDelay, c.in)}), c.reasonHas)
		})
	}
}

func TestParseDelayOverMaxDelay(t *testing.T) {
	lim := testLimits
	lim.MaxDelay = time.Hour
	for _, v := range []string{"3600001", "1h0m0.001s", "2h", "8761h", "9223372036854"} {
		t.Run(v, func(t *testing.T) {
			mustReject(t, parseWith(t, &Incoming{Headers: hdrs(HeaderDelay, v)}, testRoute(), lim), "max_delay")
		})
	}
	// Exactly max_delay is allowed.
	m := mustPark(t, parseWith(t, &Incoming{Headers: hdrs(HeaderDelay, "1h")}, testRoute(), lim))
	if !m.DueAt.Equal(nowMs.Add(time.Hour)) {
		t.Fatalf("due %v", m.DueAt)
	}
	// Without a max_delay any delay parks up to 2109 (MaxDueMs), and a
	// later due time is refused.
	lim.MaxDelay = 0
	m = mustPark(t, parseWith(t, &Incoming{Headers: hdrs(HeaderDelay, "2000000000000")}, testRoute(), lim))
	if !m.DueAt.Equal(nowMs.Add(2000000000000 * time.Millisecond)) {
		t.Fatalf("due %v", m.DueAt)
	}
	mustReject(t, parseWith(t, &Incoming{Headers: hdrs(HeaderDelay, "9223372036854")}, testRoute(), lim), "the latest delaybridge keeps")
}

func TestParseDeliverAtValid(t *testing.T) {
	cases := []struct {
		in   string
		want time.Time
	}{
		{"2026-12-01T10:00:00Z", time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)},
		{" 2026-12-01T10:00:00Z ", time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)},
		{"2026-12-01T10:00:00.5Z", time.Date(2026, 12, 1, 10, 0, 0, 500e6, time.UTC)},
		{"2026-12-01T10:00:00.123Z", time.Date(2026, 12, 1, 10, 0, 0, 123e6, time.UTC)},
		{"2026-12-01T10:00:00.123456789Z", time.Date(2026, 12, 1, 10, 0, 0, 124e6, time.UTC)}, // rounded up: never early
		{"2026-12-01T12:00:00+02:00", time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)},
		{"2026-12-01T05:30:00.250-04:30", time.Date(2026, 12, 1, 10, 0, 0, 250e6, time.UTC)},
		{"1796119200000", time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)},
		{"1796119200123", time.Date(2026, 12, 1, 10, 0, 0, 123e6, time.UTC)},
		// In the past: parked due at once.
		{"2020-01-01T00:00:00Z", time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"0", time.Unix(0, 0)},
		{"1970-01-01T00:00:00Z", time.Unix(0, 0)},
		{"1577836800000", time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)},
		// Now.
		{FormatTime(testNow), testNow.Truncate(time.Millisecond)}, // FormatTime writes whole ms
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			got, reason := ParseDeliverAt(c.in)
			if reason != "" || !got.Equal(c.want) {
				t.Fatalf("ParseDeliverAt(%q) = %v, %q; want %v", c.in, got, reason, c.want)
			}
			m := mustPark(t, parse(t, &Incoming{Headers: hdrs(HeaderDeliverAt, c.in)}))
			if !m.DueAt.Equal(c.want) {
				t.Fatalf("due %v, want %v", m.DueAt, c.want)
			}
		})
	}
}

func TestParseDeliverAtInvalid(t *testing.T) {
	cases := []struct {
		name, in, reasonHas string
	}{
		{"empty", "", "empty"},
		{"whitespace", "   ", "empty"},
		{"word", "tomorrow", "neither"},
		{"date only", "2026-12-01", "neither"},
		{"no zone", "2026-12-01T10:00:00", "neither"},
		{"space separator", "2026-12-01 10:00:00Z", "neither"},
		{"month 13", "2026-13-01T10:00:00Z", "neither"},
		{"hour 25", "2026-12-01T25:00:00Z", "neither"},
		{"exponent", "1.7e12", "neither"},
		{"fraction ms", "1796119200000.5", "neither"},
		{"overflow int64", "99999999999999999999", "out of range"},
		{"binary", "\xff\x00\x80", "x-deliver-at"},
		{"negative epoch", "-1", "before 1970"},
		{"before 1970", "1969-12-31T23:59:59Z", "before 1970"},
		{"just before 1970", "1969-12-31T23:59:59.999Z", "before 1970"},
		{"year 1", "0001-01-01T00:00:00Z", "before 1970"},
		{"1970 in an earlier zone", "1970-01-01T00:30:00+01:00", "before 1970"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, reason := ParseDeliverAt(c.in)
			if reason == "" {
				t.Fatalf("ParseDeliverAt(%q) = %v, want a reason", c.in, got)
			}
			if !strings.Contains(reason, c.reasonHas) {
				t.Fatalf("reason %q does not contain %q", reason, c.reasonHas)
			}
			mustReject(t, parse(t, &Incoming{Headers: hdrs(HeaderDeliverAt, c.in)}), c.reasonHas)
		})
	}
}

func TestParseDeliverAtBeyondMaxDelay(t *testing.T) {
	lim := testLimits
	lim.MaxDelay = time.Hour
	at := func(d time.Duration) string { return FormatTime(nowMs.Add(d)) }
	for _, v := range []string{
		at(time.Hour + time.Millisecond),
		at(24 * time.Hour),
		"9999-12-31T23:59:59.999Z",
		"9223372036854775807", // max int64 ms
		strconv.FormatInt(nowMs.Add(time.Hour+time.Millisecond).UnixMilli(), 10),
	} {
		t.Run(v, func(t *testing.T) {
			mustReject(t, parseWith(t, &Incoming{Headers: hdrs(HeaderDeliverAt, v)}, testRoute(), lim), "max_delay")
		})
	}
	m := mustPark(t, parseWith(t, &Incoming{Headers: hdrs(HeaderDeliverAt, at(time.Hour))}, testRoute(), lim))
	if !m.DueAt.Equal(nowMs.Add(time.Hour)) {
		t.Fatalf("due %v", m.DueAt)
	}
	// max_delay counts from now, not from the publish time.
	in := &Incoming{Headers: hdrs(HeaderDeliverAt, at(30*time.Minute)), PublishedAt: testNow.Add(-2 * time.Hour)}
	mustPark(t, parseWith(t, in, testRoute(), lim))
}

func TestParseDelayHeadersCombination(t *testing.T) {
	t.Run("both", func(t *testing.T) {
		mustReject(t, parse(t, &Incoming{Headers: hdrs(HeaderDelay, "5000", HeaderDeliverAt, "2026-12-01T10:00:00Z")}), "both")
	})
	t.Run("both, one empty", func(t *testing.T) {
		mustReject(t, parse(t, &Incoming{Headers: hdrs("X-Deliver-At", "", "X-Delay", "5000")}), "both")
	})
	t.Run("none, no default", func(t *testing.T) {
		mustReject(t, parse(t, &Incoming{Headers: hdrs("content-type", "text/plain")}), "default_delay")
	})
	t.Run("none, default", func(t *testing.T) {
		r := testRoute()
		r.DefaultDelay, r.HasDefaultDelay = 90*time.Second, true
		m := mustPark(t, parseWith(t, &Incoming{}, r, testLimits))
		if !m.DueAt.Equal(nowMs.Add(90 * time.Second)) {
			t.Fatalf("due %v", m.DueAt)
		}
	})
	t.Run("none, default zero", func(t *testing.T) {
		r := testRoute()
		r.HasDefaultDelay = true
		m := mustPark(t, parseWith(t, &Incoming{}, r, testLimits))
		if !m.DueAt.Equal(nowMs) {
			t.Fatalf("due %v", m.DueAt)
		}
	})
	t.Run("header wins over default", func(t *testing.T) {
		r := testRoute()
		r.DefaultDelay, r.HasDefaultDelay = time.Hour, true
		m := mustPark(t, parseWith(t, &Incoming{Headers: hdrs(HeaderDelay, "2s")}, r, testLimits))
		if !m.DueAt.Equal(nowMs.Add(2 * time.Second)) {
			t.Fatalf("due %v", m.DueAt)
		}
	})
	t.Run("invalid header does not fall back to default", func(t *testing.T) {
		r := testRoute()
		r.DefaultDelay, r.HasDefaultDelay = time.Hour, true
		mustReject(t, parseWith(t, &Incoming{Headers: hdrs(HeaderDelay, "soon")}, r, testLimits), "x-delay")
	})
	t.Run("default over max_delay", func(t *testing.T) {
		r := testRoute()
		r.DefaultDelay, r.HasDefaultDelay = 2*time.Hour, true
		lim := testLimits
		lim.MaxDelay = time.Hour
		mustReject(t, parseWith(t, &Incoming{}, r, lim), "max_delay")
	})
}

func TestParseDelayBase(t *testing.T) {
	pub := testNow.Add(-2*time.Second - 300*time.Microsecond)
	pubMs := CeilMillis(pub) // due times round up: never early
	cases := []struct {
		name    string
		in      Incoming
		def     time.Duration
		wantDue time.Time
	}{
		{"x-delay from now", Incoming{Headers: hdrs(HeaderDelay, "5000")}, 0, nowMs.Add(5 * time.Second)},
		{"x-delay from published", Incoming{Headers: hdrs(HeaderDelay, "5000"), PublishedAt: pub}, 0, pubMs.Add(5 * time.Second)},
		{"duration from published", Incoming{Headers: hdrs(HeaderDelay, "1m"), PublishedAt: pub}, 0, pubMs.Add(time.Minute)},
		{"already due: published long ago", Incoming{Headers: hdrs(HeaderDelay, "1000"), PublishedAt: testNow.Add(-time.Hour)}, 0, CeilMillis(testNow.Add(-time.Hour + time.Second))},
		{"default from published", Incoming{PublishedAt: pub}, 10 * time.Second, pubMs.Add(10 * time.Second)},
		{"default from now", Incoming{}, 10 * time.Second, nowMs.Add(10 * time.Second)},
		{"x-deliver-at ignores published", Incoming{Headers: hdrs(HeaderDeliverAt, "2026-07-01T00:00:00Z"), PublishedAt: pub}, 0, time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := testRoute()
			if c.def != 0 {
				r.DefaultDelay, r.HasDefaultDelay = c.def, true
			}
			m := mustPark(t, parseWith(t, &c.in, r, testLimits))
			if !m.DueAt.Equal(c.wantDue) {
				t.Fatalf("due %v, want %v", m.DueAt, c.wantDue)
			}
			if !m.IngestedAt.Equal(nowMs) {
				t.Fatalf("ingested at %v, want %v", m.IngestedAt, nowMs)
			}
		})
	}
}

func TestParseHeaderCaseInsensitive(t *testing.T) {
	for _, k := range []string{"x-delay", "X-Delay", "X-DELAY", "x-DeLaY"} {
		t.Run(k, func(t *testing.T) {
			m := mustPark(t, parse(t, &Incoming{Headers: hdrs(k, "1500ms", "Other", "v")}))
			if !m.DueAt.Equal(nowMs.Add(1500 * time.Millisecond)) {
				t.Fatalf("due %v", m.DueAt)
			}
			if len(m.Headers) != 1 || m.Headers[0] != (Header{Key: "Other", Value: "v"}) {
				t.Fatalf("forwarded %v", m.Headers)
			}
		})
	}
	r := testRoute()
	r.AllowOverride = true
	m := mustPark(t, parseWith(t, &Incoming{Headers: hdrs(
		"X-Deliver-At", "2026-07-01T00:00:00Z",
		"X-MESSAGE-ID", "id-1",
		"X-Delay-Sink", "kafka",
		"X-DELAY-DESTINATION", "topic-a",
		"X-Delay-Priority", "7",
	)}, r, testLimits))
	if m.ID != "id-1" || m.Sink != "kafka" || m.Destination != "topic-a" || m.Priority != 7 ||
		!m.DueAt.Equal(time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC)) || len(m.Headers) != 0 {
		t.Fatalf("got %+v", m)
	}
	d := parse(t, &Incoming{Headers: hdrs("X-Delay-CANCEL", "id-9")})
	if d.Action != Cancel || d.CancelID != "id-9" {
		t.Fatalf("got %v %q", d.Action, d.CancelID)
	}
}

func TestParseControlHeaderTwice(t *testing.T) {
	base := func() Headers { return hdrs(HeaderDelay, "5000") }
	for _, h := range []string{HeaderDelay, HeaderDeliverAt, HeaderMessageID, HeaderSink, HeaderDestination, HeaderCancel, HeaderPriority} {
		for _, pair := range [][2]string{{h, h}, {h, strings.ToUpper(h)}} {
			t.Run(pair[0]+"+"+pair[1], func(t *testing.T) {
				r := testRoute()
				r.AllowOverride = true
				hs := base()
				if h == HeaderDelay {
					hs = nil
				}
				val := "5000"
				switch h {
				case HeaderDeliverAt:
					val = "2026-07-01T00:00:00Z"
				case HeaderSink:
					val = "kafka"
				case HeaderPriority:
					val = "1"
				}
				hs = append(hs, Header{Key: pair[0], Value: val}, Header{Key: "keep", Value: "me"}, Header{Key: pair[1], Value: val})
				mustReject(t, parseWith(t, &Incoming{Headers: hs}, r, testLimits), "given 2 times")
			})
		}
	}
	// A forwarded header given twice is fine and kept twice, in order.
	m := mustPark(t, parse(t, &Incoming{Headers: hdrs(HeaderDelay, "1", "a", "1", "b", "x", "A", "2")}))
	want := hdrs("a", "1", "b", "x", "A", "2")
	if fmt.Sprint(m.Headers) != fmt.Sprint(want) {
		t.Fatalf("forwarded %v, want %v", m.Headers, want)
	}
}

func TestParseMessageIDSources(t *testing.T) {
	cases := []struct {
		name string
		in   Incoming
		want string
	}{
		{"x-message-id first", Incoming{Headers: hdrs(HeaderMessageID, "hdr", HeaderNatsMsgID, "nats"), NativeID: "amqp", Origin: Origin{Log: "t/0", Pos: 1}}, "hdr"},
		{"x-message-id case", Incoming{Headers: hdrs("X-Message-ID", "hdr"), NativeID: "amqp"}, "hdr"},
		{"AMQP message_id", Incoming{Headers: hdrs(HeaderNatsMsgID, "nats"), NativeID: "amqp", Origin: Origin{Log: "t/0", Pos: 1}}, "amqp"},
		{"Nats-Msg-Id", Incoming{Headers: hdrs(HeaderNatsMsgID, "nats"), Origin: Origin{Log: "S", Pos: 42}}, "nats"},
		{"Nats-Msg-Id lower case", Incoming{Headers: hdrs("nats-msg-id", "nats"), Origin: Origin{Log: "S", Pos: 42}}, "nats"},
		{"empty Nats-Msg-Id skipped", Incoming{Headers: hdrs(HeaderNatsMsgID, ""), Origin: Origin{Log: "S", Pos: 42}}, "S/42"},
		{"position", Incoming{Origin: Origin{Log: "orders/3", Pos: 1234}}, "orders/3/1234"},
		{"generated", Incoming{}, "gen-1"},
		{"long position is kept (not bound by max_id_bytes)", Incoming{Origin: Origin{Log: strings.Repeat("p", 300), Pos: 1}}, strings.Repeat("p", 300) + "/1"},
		{"invalid position: generated", Incoming{Origin: Origin{Log: "bad\x00pos", Pos: 1}}, "gen-1"},
		{"unicode ID", Incoming{Headers: hdrs(HeaderMessageID, "bestellung-ü-✓")}, "bestellung-ü-✓"},
		{"ID of exactly max bytes", Incoming{Headers: hdrs(HeaderMessageID, strings.Repeat("i", 256))}, strings.Repeat("i", 256)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.in.Headers = append(c.in.Headers, Header{Key: HeaderDelay, Value: "1000"})
			m := mustPark(t, parse(t, &c.in))
			if m.ID != c.want {
				t.Fatalf("ID %q, want %q", m.ID, c.want)
			}
			for _, h := range m.Headers {
				if strings.EqualFold(h.Key, HeaderMessageID) {
					t.Fatalf("x-message-id forwarded as it came: %v", m.Headers)
				}
			}
		})
	}
}

func TestParseNewIDNilUsesNewID(t *testing.T) {
	d := Parse(&Incoming{Headers: hdrs(HeaderDelay, "1")}, testRoute(), testLimits, testNow, nil)
	checkDecision(t, &Incoming{Headers: hdrs(HeaderDelay, "1")}, testLimits, testNow, d)
	d2 := Parse(&Incoming{Headers: hdrs(HeaderDelay, "1")}, testRoute(), testLimits, testNow, nil)
	if d.Message.ID == d2.Message.ID {
		t.Fatalf("two generated IDs are equal: %q", d.Message.ID)
	}
	if len(d.Message.ID) != 36 {
		t.Fatalf("generated ID %q is not a UUID", d.Message.ID)
	}
}

func TestParseInvalidMessageID(t *testing.T) {
	cases := []struct {
		name   string
		in     Incoming
		reason string
		wantID string
	}{
		{"empty", Incoming{Headers: hdrs(HeaderMessageID, "")}, "empty", "gen-1"},
		{"too long", Incoming{Headers: hdrs(HeaderMessageID, strings.Repeat("x", 10<<10))}, "max_id_bytes", "gen-1"},
		{"one over", Incoming{Headers: hdrs(HeaderMessageID, strings.Repeat("x", 257))}, "max_id_bytes", "gen-1"},
		{"non-UTF-8", Incoming{Headers: hdrs(HeaderMessageID, "id-\xff\xfe")}, "UTF-8", "gen-1"},
		{"NUL", Incoming{Headers: hdrs(HeaderMessageID, "id\x00x")}, "control", "gen-1"},
		{"newline", Incoming{Headers: hdrs(HeaderMessageID, "id\nx")}, "control", "gen-1"},
		{"DEL", Incoming{Headers: hdrs(HeaderMessageID, "id\x7f")}, "control", "gen-1"},
		{"tab", Incoming{Headers: hdrs(HeaderMessageID, "\tid")}, "control", "gen-1"},
		{"C1 control", Incoming{Headers: hdrs(HeaderMessageID, "id\u0085x")}, "U+0085", "gen-1"},
		{"C1 CSI", Incoming{Headers: hdrs(HeaderMessageID, "id\u009b31m")}, "U+009B", "gen-1"},
		{"right-to-left override", Incoming{Headers: hdrs(HeaderMessageID, "invoice-\u202egpj.exe")}, "U+202E", "gen-1"},
		{"left-to-right embedding", Incoming{Headers: hdrs(HeaderMessageID, "\u202aorder-1")}, "U+202A", "gen-1"},
		{"first-strong isolate", Incoming{Headers: hdrs(HeaderMessageID, "order-\u2068x\u2069")}, "U+2068", "gen-1"},
		{"pop directional isolate", Incoming{Headers: hdrs(HeaderMessageID, "order\u2069")}, "U+2069", "gen-1"},
		{"invalid with position fallback", Incoming{Headers: hdrs(HeaderMessageID, ""), Origin: Origin{Log: "orders/0", Pos: 7}}, "empty", "orders/0/7"},
		{"invalid AMQP message_id", Incoming{NativeID: "a\rb", Origin: Origin{Log: "orders/0", Pos: 7}}, "message_id", "orders/0/7"},
		{"invalid Nats-Msg-Id", Incoming{Headers: hdrs(HeaderNatsMsgID, strings.Repeat("n", 300))}, HeaderNatsMsgID, "gen-1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.in.Headers = append(c.in.Headers, Header{Key: HeaderDelay, Value: "1000"})
			c.in.Body = []byte("payload")
			d := parse(t, &c.in)
			mustReject(t, d, c.reason)
			if d.Message.ID != c.wantID {
				t.Fatalf("fallback ID %q, want %q", d.Message.ID, c.wantID)
			}
			if string(d.Message.Body) != "payload" {
				t.Fatalf("dead message lost its body")
			}
			// The dead message keeps every header as it came, so that an
			// operator sees what was wrong.
			if fmt.Sprint(d.Message.Headers) != fmt.Sprint(c.in.Headers) {
				t.Fatalf("dead headers %v, want %v", d.Message.Headers, c.in.Headers)
			}
		})
	}
}

// IDs in scripts written right to left, and characters next to the refused
// ranges, are IDs like any other.
func TestParseIDsNearTheRefusedRanges(t *testing.T) {
	for _, id := range []string{"\u05d4\u05d6\u05de\u05e0\u05d4-42", "\u0637\u0644\u0628-7", "a\u00a0b", "x\u2029y", "nbsp\u00a0", "\u2070", "~"} {
		d := parse(t, &Incoming{Headers: hdrs(HeaderMessageID, id, HeaderDelay, "1000")})
		if d.Action != Park || d.Message.ID != id {
			t.Errorf("ID %q: %v %q (%s)", id, d.Action, d.Message.ID, why(d))
		}
	}
}

func TestDisplayID(t *testing.T) {
	for id, want := range map[string]string{
		"order-42":              "order-42",
		"\u05d4\u05d6-1":        "\u05d4\u05d6-1",
		"invoice-\u202egpj.exe": `invoice-\u202egpj.exe`,
		"a\u0085b\tc":           `a\u0085b\u0009c`,
		"x\u2066y\u2069":        `x\u2066y\u2069`,
		// Invisible, and accepted: shown so that they cannot pass for
		// "victim" (a variation selector beyond U+FFFF as JSON writes it).
		"victim\u200b":     `victim\u200b`,
		"vic\u00adtim":     `vic\u00adtim`,
		"\ufeffvictim":     `\ufeffvictim`,
		"victim\u034f":     `victim\u034f`,
		"victim\U000e0100": `victim\udb40\udd00`,
		"caf\u00e9 \u00a0": "caf\u00e9 \u00a0", // visible: letters, spaces
	} {
		if got := DisplayID(id); got != want {
			t.Errorf("DisplayID(%q) = %q, want %q", id, got, want)
		}
	}
}

// A message whose broker could not decode its header block is rejected
// with that reason, not for a missing delay header, under its position ID.
func TestParseHeaderError(t *testing.T) {
	in := &Incoming{HeaderError: "nats: message could not decode headers", Body: []byte("b"), Origin: Origin{Log: "DELAYED", Pos: 7}}
	d := parse(t, in)
	mustReject(t, d, "headers could not be decoded: nats: message could not decode headers")
	if CodeOf(d.Err) != CodeUndecodableHeaders || d.Message.ID != "DELAYED/7" || string(d.Message.Body) != "b" {
		t.Errorf("code %q, ID %q, body %q", CodeOf(d.Err), d.Message.ID, d.Message.Body)
	}
	// Even with a delay among the headers that could be read.
	in = &Incoming{HeaderError: "bad", Headers: hdrs(HeaderDelay, "1000")}
	if d := parse(t, in); d.Action != Reject || CodeOf(d.Err) != CodeUndecodableHeaders {
		t.Errorf("with a readable delay: %v %q", d.Action, CodeOf(d.Err))
	}
}

// When the chosen ID is invalid, the rejected message is kept under the next
// usable source (AMQP message_id, Nats-Msg-Id, position), so that a
// redelivery maps to the same dead message.
func TestParseInvalidMessageIDFallsBackToNextSource(t *testing.T) {
	in := &Incoming{Headers: hdrs(HeaderMessageID, "bad\x00id", HeaderDelay, "1000"), NativeID: "amqp-1"}
	d := parse(t, in)
	mustReject(t, d, "control")
	if d.Message.ID != "amqp-1" {
		t.Errorf("fallback ID %q, want the next source, AMQP message_id %q", d.Message.ID, "amqp-1")
	}
	in = &Incoming{Headers: hdrs(HeaderMessageID, "", HeaderNatsMsgID, "nats-1", HeaderDelay, "1000"), Origin: Origin{Log: "S", Pos: 9}}
	d = parse(t, in)
	mustReject(t, d, "empty")
	if d.Message.ID != "nats-1" {
		t.Errorf("fallback ID %q, want the next source, Nats-Msg-Id %q", d.Message.ID, "nats-1")
	}
}

func TestParseOverrides(t *testing.T) {
	type tc struct {
		name      string
		route     func(*Route)
		headers   Headers
		wantSink  string
		wantDest  string
		reasonHas string // non-empty: reject
	}
	allow := func(r *Route) { r.AllowOverride = true }
	cases := []tc{
		{"no override", nil, nil, "rabbit", "orders.expired", ""},
		{"sink without allow", nil, hdrs(HeaderSink, "kafka"), "", "", "allow_override"},
		{"destination without allow", nil, hdrs(HeaderDestination, "x"), "", "", "allow_override"},
		{"empty destination without allow", nil, hdrs(HeaderDestination, ""), "", "", "allow_override"},
		{"sink", allow, hdrs(HeaderSink, "kafka"), "kafka", "orders.expired", ""},
		{"sink trimmed", allow, hdrs(HeaderSink, " nats "), "nats", "orders.expired", ""},
		{"destination", allow, hdrs(HeaderDestination, "orders.late"), "rabbit", "orders.late", ""},
		{"both", allow, hdrs(HeaderSink, "kafka", HeaderDestination, "late-orders"), "kafka", "late-orders", ""},
		{"unknown sink", allow, hdrs(HeaderSink, "nope"), "", "", "names no configured sink"},
		{"sink names are case-sensitive", allow, hdrs(HeaderSink, "Kafka"), "", "", "names no configured sink"},
		{"empty sink", allow, hdrs(HeaderSink, ""), "", "", "x-delay-sink is empty"},
		{"blank sink", allow, hdrs(HeaderSink, "  "), "", "", "x-delay-sink is empty"},
		{"empty destination", allow, hdrs(HeaderDestination, ""), "", "", "x-delay-destination is empty"},
		{"destination with newline", allow, hdrs(HeaderDestination, "a\nb"), "", "", "not printable"},
		{"destination with NUL", allow, hdrs(HeaderDestination, "a\x00"), "", "", "not printable"},
		{"destination not UTF-8", allow, hdrs(HeaderDestination, "\xff"), "", "", "not printable"},
		{"allowed sink", func(r *Route) { allow(r); r.AllowedSinks = []string{"kafka", "rabbit"} }, hdrs(HeaderSink, "kafka"), "kafka", "orders.expired", ""},
		{"sink not allowed", func(r *Route) { allow(r); r.AllowedSinks = []string{"rabbit"} }, hdrs(HeaderSink, "kafka"), "", "", "allowed_sinks"},
		{"allowed sinks do not limit the route's own", func(r *Route) { allow(r); r.AllowedSinks = []string{"kafka"} }, nil, "rabbit", "orders.expired", ""},
		{"allowed destination pattern", func(r *Route) { allow(r); r.AllowedDestinations = []string{"audit", "orders.*"} }, hdrs(HeaderDestination, "orders.late"), "rabbit", "orders.late", ""},
		{"allowed destination exact", func(r *Route) { allow(r); r.AllowedDestinations = []string{"audit", "orders.*"} }, hdrs(HeaderDestination, "audit"), "rabbit", "audit", ""},
		{"allowed destination # words", func(r *Route) { allow(r); r.AllowedDestinations = []string{"orders.#"} }, hdrs(HeaderDestination, "orders.eu.late"), "rabbit", "orders.eu.late", ""},
		{"destination not allowed", func(r *Route) { allow(r); r.AllowedDestinations = []string{"orders.*"} }, hdrs(HeaderDestination, "payments.x"), "", "", "allowed_destinations"},
		{"star does not cross slash", func(r *Route) { allow(r); r.AllowedDestinations = []string{"orders/*"} }, hdrs(HeaderDestination, "orders/a/b"), "", "", "allowed_destinations"},
		{"star is one word", func(r *Route) { allow(r); r.AllowedDestinations = []string{"orders.*"} }, hdrs(HeaderDestination, "orders.eu.late"), "", "", "allowed_destinations"},
		{"sink override to sink-less route", func(r *Route) { allow(r); r.Sink = "" }, hdrs(HeaderSink, "nats"), "nats", "orders.expired", ""},
		{"no sink at all", func(r *Route) { r.Sink = "" }, nil, "", "", "no sink"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := testRoute()
			if c.route != nil {
				c.route(r)
			}
			in := &Incoming{Headers: append(hdrs(HeaderDelay, "1000", "trace", "t1"), c.headers...)}
			d := parseWith(t, in, r, testLimits)
			if c.reasonHas != "" {
				mustReject(t, d, c.reasonHas)
				return
			}
			m := mustPark(t, d)
			if m.Sink != c.wantSink || m.Destination != c.wantDest {
				t.Fatalf("sink %q destination %q, want %q %q", m.Sink, m.Destination, c.wantSink, c.wantDest)
			}
			if len(m.Headers) != 1 || m.Headers[0] != (Header{Key: "trace", Value: "t1"}) {
				t.Fatalf("forwarded %v", m.Headers)
			}
		})
	}
}

// allowed_sinks are sink names (validated against the configured sinks),
// compared exactly.
func TestParseAllowedSinksAreNames(t *testing.T) {
	r := testRoute()
	r.AllowOverride = true
	r.AllowedSinks = []string{"kafka-eu"}
	r.Sinks = destination.Sinks{"kafka-eu": SyntaxKafka, "rabbit": SyntaxRabbitMQ}.Lookup
	d := parseWith(t, &Incoming{Headers: hdrs(HeaderDelay, "1000", HeaderSink, "kafka-eu")}, r, testLimits)
	if d.Action != Park || d.Message.Sink != "kafka-eu" {
		t.Errorf("allowed sink kafka-eu refused: %v %q", d.Action, why(d))
	}
	mustReject(t, parseWith(t, &Incoming{Headers: hdrs(HeaderDelay, "1000", HeaderSink, "rabbit")}, r, testLimits), "allowed_sinks")
}

func TestParseSinksNil(t *testing.T) {
	r := testRoute()
	r.AllowOverride = true
	r.Sinks = nil
	m := mustPark(t, parseWith(t, &Incoming{Headers: hdrs(HeaderDelay, "1", HeaderSink, "anything")}, r, testLimits))
	if m.Sink != "anything" {
		t.Fatalf("sink %q", m.Sink)
	}
}

// A message its sink would refuse for its size (Limits.Fits) is refused
// at once, with the sink's words, and kept whole for an operator (headers
// and body); the sink is asked of the message as it would be parked, and
// not of one refused for another reason first.
func TestParseTooLargeForItsSink(t *testing.T) {
	var asked []*Message
	lim := testLimits
	lim.Fits = func(m *Message) error {
		asked = append(asked, m)
		if len(m.Body) > 10 {
			return fmt.Errorf("sink %s takes 10 bytes", m.Sink)
		}
		return nil
	}
	in := &Incoming{Headers: hdrs(HeaderDelay, "1000", "app", "v"), Body: []byte("eleven byte")}
	d := parseWith(t, in, testRoute(), lim)
	if d.Action != Reject || CodeOf(d.Err) != CodePayloadTooLarge || why(d) != "too large for its sink: sink rabbit takes 10 bytes" {
		t.Fatalf("got %v %q (%v), want a payload_too_large rejection in the sink's words", d.Action, why(d), CodeOf(d.Err))
	}
	if string(d.Message.Body) != "eleven byte" || d.Message.Headers.Count(HeaderDelay) != 1 {
		t.Fatalf("the refused message lost its body or headers: %q %v", d.Message.Body, d.Message.Headers)
	}
	if len(asked) != 1 || asked[0].Sink != "rabbit" || asked[0].Destination != "orders.expired" || !asked[0].DueAt.Equal(nowMs.Add(time.Second)) {
		t.Fatalf("Fits was asked %d times, of %+v", len(asked), asked)
	}
	mustPark(t, parseWith(t, &Incoming{Headers: hdrs(HeaderDelay, "1000"), Body: []byte("ten bytes!")}, testRoute(), lim))
	asked = nil
	if d := parseWith(t, &Incoming{Headers: hdrs(HeaderDelay, "nope"), Body: []byte("eleven byte")}, testRoute(), lim); CodeOf(d.Err) != CodeInvalidDelay || len(asked) != 0 {
		t.Fatalf("an invalid delay: %v, Fits asked %d times", d.Err, len(asked))
	}
}

func TestParseCancel(t *testing.T) {
	in := &Incoming{
		Headers:  hdrs(HeaderCancel, "order-42", "who", "ops", HeaderDelay, "5000"),
		Body:     []byte("ignored"),
		NativeID: "ctl-1",
	}
	d := parse(t, in)
	if d.Action != Cancel {
		t.Fatalf("got %v (%q), want cancel", d.Action, why(d))
	}
	if d.CancelID != "order-42" {
		t.Fatalf("CancelID %q", d.CancelID)
	}
	if d.Message.ID != "ctl-1" {
		t.Fatalf("control message ID %q", d.Message.ID)
	}
	if why(d) != "" {
		t.Fatalf("cancel with reason %q", why(d))
	}
	// A cancel needs no delay header, and no default delay.
	d = parse(t, &Incoming{Headers: hdrs("x-delay-cancel", "t/0/5")})
	if d.Action != Cancel || d.CancelID != "t/0/5" {
		t.Fatalf("got %v %q %q", d.Action, d.CancelID, why(d))
	}
	// The cancel target is taken as given (IDs are not trimmed anywhere).
	d = parse(t, &Incoming{Headers: hdrs(HeaderCancel, " a b ")})
	if d.Action != Cancel || d.CancelID != " a b " {
		t.Fatalf("got %v %q %q", d.Action, d.CancelID, why(d))
	}
}

func TestParseCancelInvalid(t *testing.T) {
	for _, c := range []struct{ name, v, reason string }{
		{"empty", "", "empty"},
		{"too long", strings.Repeat("c", 257), "max_id_bytes"},
		{"10 kB", strings.Repeat("c", 10<<10), "max_id_bytes"},
		{"non-UTF-8", "\xc3\x28", "UTF-8"},
		{"control", "id\r\n", "control"},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := parse(t, &Incoming{Headers: hdrs(HeaderCancel, c.v)})
			mustReject(t, d, c.reason)
			if !strings.Contains(why(d), HeaderCancel) {
				t.Fatalf("reason %q does not name %s", why(d), HeaderCancel)
			}
			if d.CancelID != "" {
				t.Fatalf("rejected cancel with CancelID %q", d.CancelID)
			}
		})
	}
}

func TestParsePriority(t *testing.T) {
	for i := 0; i <= 9; i++ {
		v := strconv.Itoa(i)
		m := mustPark(t, parse(t, &Incoming{Headers: hdrs(HeaderDelay, "1", HeaderPriority, v)}))
		if m.Priority != uint8(i) {
			t.Fatalf("priority %q: got %d", v, m.Priority)
		}
	}
	m := mustPark(t, parse(t, &Incoming{Headers: hdrs(HeaderDelay, "1", HeaderPriority, " 3 ")}))
	if m.Priority != 3 {
		t.Fatalf("priority %d", m.Priority)
	}
	m = mustPark(t, parse(t, &Incoming{Headers: hdrs(HeaderDelay, "1")}))
	if m.Priority != 0 {
		t.Fatalf("default priority %d", m.Priority)
	}
	for _, v := range []string{"10", "-1", "", " ", "a", "1.5", "256", "99999999999999999999", "\xff", "5 5"} {
		t.Run(v, func(t *testing.T) {
			mustReject(t, parse(t, &Incoming{Headers: hdrs(HeaderDelay, "1", HeaderPriority, v)}), HeaderPriority)
		})
	}
}

func TestParseBodyLimit(t *testing.T) {
	lim := testLimits
	lim.MaxPayloadBytes = 100
	m := mustPark(t, parseWith(t, &Incoming{Headers: hdrs(HeaderDelay, "1"), Body: make([]byte, 100)}, testRoute(), lim))
	if len(m.Body) != 100 {
		t.Fatalf("body %d bytes", len(m.Body))
	}
	in := &Incoming{Headers: hdrs(HeaderDelay, "1", "h", "v"), Body: make([]byte, 101), Key: []byte("k")}
	d := parseWith(t, in, testRoute(), lim)
	mustReject(t, d, "max_payload_bytes")
	if d.Message.Body != nil {
		t.Fatalf("dead message keeps a %d-byte body", len(d.Message.Body))
	}
	if len(d.Message.Headers) != 2 || string(d.Message.Key) != "k" {
		t.Fatalf("dead message lost its headers or key: %+v", d.Message)
	}
	// 0 means no limit.
	lim.MaxPayloadBytes = 0
	mustPark(t, parseWith(t, &Incoming{Headers: hdrs(HeaderDelay, "1"), Body: make([]byte, 2<<20)}, testRoute(), lim))
	// The default limit is 1 MiB.
	mustPark(t, parse(t, &Incoming{Headers: hdrs(HeaderDelay, "1"), Body: make([]byte, 1<<20)}))
	mustReject(t, parse(t, &Incoming{Headers: hdrs(HeaderDelay, "1"), Body: make([]byte, 1<<20+1)}), "max_payload_bytes")
}

func TestParseEmptyBody(t *testing.T) {
	for _, body := range [][]byte{nil, {}} {
		m := mustPark(t, parse(t, &Incoming{Headers: hdrs(HeaderDelay, "1"), Body: body}))
		if len(m.Body) != 0 {
			t.Fatalf("body %q", m.Body)
		}
	}
}

func TestParseHeaderLimit(t *testing.T) {
	lim := testLimits
	lim.MaxHeaderBytes = 32
	// "x-delay"+"1" = 8 bytes, "k"+23 bytes = 24: exactly 32.
	ok := hdrs(HeaderDelay, "1", "k", strings.Repeat("v", 23))
	mustPark(t, parseWith(t, &Incoming{Headers: ok}, testRoute(), lim))
	over := hdrs(HeaderDelay, "1", "k", strings.Repeat("v", 24))
	d := parseWith(t, &Incoming{Headers: over, Body: []byte("body")}, testRoute(), lim)
	mustReject(t, d, "max_header_bytes")
	if d.Message.Headers != nil {
		t.Fatalf("dead message keeps %d bytes of headers", d.Message.Headers.Size())
	}
	if string(d.Message.Body) != "body" {
		t.Fatalf("dead message lost its body")
	}
	// Keys count too.
	d = parseWith(t, &Incoming{Headers: hdrs(HeaderDelay, "1", strings.Repeat("k", 30), "")}, testRoute(), lim)
	mustReject(t, d, "max_header_bytes")
	// Both limits at once: neither part is kept.
	lim.MaxPayloadBytes = 2
	d = parseWith(t, &Incoming{Headers: over, Body: []byte("body")}, testRoute(), lim)
	if d.Action != Reject || d.Message.Body != nil || d.Message.Headers != nil {
		t.Fatalf("got %v body %q headers %v", d.Action, d.Message.Body, d.Message.Headers)
	}
}

func TestParseParkMessage(t *testing.T) {
	in := &Incoming{
		Headers: hdrs(
			"content-type", "application/json",
			HeaderDelay, "5000",
			"X-Delay-Priority", "4",
			HeaderMessageID, "order-42",
			"bin", "\x00\xff\x01",
			HeaderDueAt, "stale",
			"X-Delaybridge-Attempt", "9",
			HeaderNatsMsgID, "n-1",
			"content-type", "dup",
		),
		Body:   []byte("{\"a\":1}"),
		Key:    []byte("key-1"),
		Origin: Origin{Log: "orders/1", Pos: 2},
	}
	r := testRoute()
	r.AllowOverride = true
	d := parseWith(t, in, r, testLimits)
	m := mustPark(t, d)
	want := &Message{
		ID:          "order-42",
		DueAt:       nowMs.Add(5 * time.Second),
		Sink:        "rabbit",
		Destination: "orders.expired",
		Key:         []byte("key-1"),
		Headers:     hdrs("content-type", "application/json", "bin", "\x00\xff\x01", HeaderNatsMsgID, "n-1", "content-type", "dup"),
		Body:        []byte("{\"a\":1}"),
		Priority:    4,
		Ingest:      "orders-in",
		IngestedAt:  nowMs,
		Origin:      Origin{Log: "orders/1", Pos: 2},
	}
	if diff := diffMessages(want, m); diff != "" {
		t.Fatalf("parked message: %s", diff)
	}
	// The incoming headers are not modified.
	if len(in.Headers) != 9 || in.Headers[1].Key != HeaderDelay {
		t.Fatalf("incoming headers modified: %v", in.Headers)
	}
	// All control headers: nothing forwarded.
	m = mustPark(t, parse(t, &Incoming{Headers: hdrs(HeaderDelay, "1", HeaderMessageID, "x")}))
	if len(m.Headers) != 0 {
		t.Fatalf("forwarded %v", m.Headers)
	}
}

func TestParseCancelAndRejectKeepAllHeaders(t *testing.T) {
	hs := hdrs(HeaderCancel, "victim", "a", "b", HeaderDelay, "5")
	d := parse(t, &Incoming{Headers: hs})
	if d.Action != Cancel || fmt.Sprint(d.Message.Headers) != fmt.Sprint(hs) {
		t.Fatalf("got %v %v", d.Action, d.Message.Headers)
	}
	hs = hdrs(HeaderDelay, "-5", "a", "b")
	d = parse(t, &Incoming{Headers: hs})
	if d.Action != Reject || fmt.Sprint(d.Message.Headers) != fmt.Sprint(hs) {
		t.Fatalf("got %v %v", d.Action, d.Message.Headers)
	}
}

func TestIsControlHeader(t *testing.T) {
	for _, h := range []string{"x-delay", "X-Deliver-At", "X-DELAY-SINK", "x-delay-destination", "x-delay-cancel",
		"x-delay-priority", "x-message-id", "x-delaybridge-due-at", "X-Delaybridge-Attempt"} {
		if !IsControlHeader(h) {
			t.Errorf("IsControlHeader(%q) = false", h)
		}
	}
	for _, h := range []string{"", "x-delayed", "delay", "Nats-Msg-Id", "content-type", "x-delay ", "x-message-ids"} {
		if IsControlHeader(h) {
			t.Errorf("IsControlHeader(%q) = true", h)
		}
	}
}

func TestHeaders(t *testing.T) {
	h := hdrs("A", "1", "b", "2", "a", "3")
	if v, ok := h.Get("a"); !ok || v != "1" {
		t.Fatalf("Get(a) = %q %v", v, ok)
	}
	if v, ok := h.Get("B"); !ok || v != "2" {
		t.Fatalf("Get(B) = %q %v", v, ok)
	}
	if _, ok := h.Get("c"); ok {
		t.Fatalf("Get(c) found")
	}
	if h.Count("A") != 2 || h.Count("c") != 0 {
		t.Fatalf("Count")
	}
	if h.Size() != 6 {
		t.Fatalf("Size %d", h.Size())
	}
	if Headers(nil).Size() != 0 {
		t.Fatalf("nil Size")
	}
}

func TestOutHeaders(t *testing.T) {
	m := &Message{
		ID:    "order-42",
		DueAt: time.Date(2026, 12, 1, 12, 0, 5, 123_456_789, time.FixedZone("CEST", 2*3600)),
		Headers: hdrs(
			"content-type", "text/plain",
			"X-Message-Id", "old",
			"x-delaybridge-due-at", "old",
			"X-DELAYBRIDGE-ATTEMPT", "7",
			"x-delay", "5000",
			"trace", "t",
			"trace", "u",
		),
	}
	orig := fmt.Sprint(m.Headers)
	out := m.OutHeaders(3)
	want := hdrs(
		"content-type", "text/plain",
		"trace", "t",
		"trace", "u",
		HeaderMessageID, "order-42",
		HeaderDueAt, "2026-12-01T10:00:05.123Z",
		HeaderAttempt, "3",
	)
	if fmt.Sprint(out) != fmt.Sprint(want) {
		t.Fatalf("OutHeaders\n got %+v\nwant %+v", out, want)
	}
	for _, k := range []string{HeaderMessageID, HeaderDueAt, HeaderAttempt} {
		if out.Count(k) != 1 {
			t.Fatalf("%s appears %d times", k, out.Count(k))
		}
	}
	if fmt.Sprint(m.Headers) != orig {
		t.Fatalf("OutHeaders modified the message's headers")
	}
	// First attempt, whole seconds, no forwarded headers.
	m = &Message{ID: "a", DueAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	out = m.OutHeaders(1)
	if fmt.Sprint(out) != fmt.Sprint(hdrs(HeaderMessageID, "a", HeaderDueAt, "2026-01-02T03:04:05.000Z", HeaderAttempt, "1")) {
		t.Fatalf("OutHeaders %+v", out)
	}
}

func TestOutHeadersOfParsedMessage(t *testing.T) {
	in := &Incoming{Headers: hdrs(HeaderDelay, "1500", "X-Message-Id", "m-1", "k", "v")}
	m := mustPark(t, parse(t, in))
	out := m.OutHeaders(1)
	if v, _ := out.Get(HeaderMessageID); v != "m-1" {
		t.Fatalf("x-message-id %q", v)
	}
	due, _ := out.Get(HeaderDueAt)
	parsed, err := time.Parse(time.RFC3339Nano, due)
	if err != nil || !parsed.Equal(nowMs.Add(1500*time.Millisecond)) {
		t.Fatalf("due-at %q (%v), want %v", due, err, nowMs.Add(1500*time.Millisecond))
	}
	if !strings.HasSuffix(due, "Z") || len(due) != len("2006-01-02T15:04:05.000Z") {
		t.Fatalf("due-at %q is not RFC 3339 UTC with milliseconds", due)
	}
	for _, h := range out {
		if strings.EqualFold(h.Key, HeaderDelay) {
			t.Fatalf("x-delay published")
		}
	}
}

func TestFormatTime(t *testing.T) {
	for _, c := range []struct {
		t    time.Time
		want string
	}{
		{time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC), "2026-12-01T10:00:00.000Z"},
		{time.Date(2026, 12, 1, 10, 0, 0, 999_999_999, time.UTC), "2026-12-01T10:00:00.999Z"},
		{time.Date(2026, 12, 1, 5, 0, 0, 1e6, time.FixedZone("", -5*3600)), "2026-12-01T10:00:00.001Z"},
		{time.UnixMilli(0), "1970-01-01T00:00:00.000Z"},
	} {
		if got := FormatTime(c.t); got != c.want {
			t.Errorf("FormatTime(%v) = %q, want %q", c.t, got, c.want)
		}
	}
}

func TestActionString(t *testing.T) {
	for a, want := range map[Action]string{Park: "park", Cancel: "cancel", Reject: "reject", Action(42): "unknown"} {
		if a.String() != want {
			t.Errorf("%d.String() = %q", a, a.String())
		}
	}
}

func TestParseDoesNotCallNewIDNeedlessly(t *testing.T) {
	newID, calls := genIDs()
	d := Parse(&Incoming{Headers: hdrs(HeaderDelay, "1", HeaderMessageID, "given")}, testRoute(), testLimits, testNow, newID)
	if d.Message.ID != "given" || *calls != 0 {
		t.Fatalf("ID %q, newID called %d times", d.Message.ID, *calls)
	}
}

// testLimits are the configuration's default limits.
var testLimits = Limits{
	MaxDelay:        365 * 24 * time.Hour,
	MaxPayloadBytes: 1 << 20,
	MaxHeaderBytes:  64 << 10,
	MaxIDBytes:      256,
}

// TestParseDelayFractional: "Fractional delays" of the contract: a decimal
// string with a fraction, as JavaScript, Python and AMQP floats and
// doubles produce them, rounds up to the next millisecond; an overflow says
// it is one.
func TestParseDelayFractional(t *testing.T) {
	for v, want := range map[string]time.Duration{
		"1500.5":             1501 * time.Millisecond,
		"300.00000000000006": 301 * time.Millisecond, // 0.1*3*1000 in JavaScript
		"1500.0":             1500 * time.Millisecond,
		"1500.":              1500 * time.Millisecond,
		".5":                 time.Millisecond,
		"0.0":                0,
		"+7.25":              8 * time.Millisecond,
		"5000":               5 * time.Second,
		"1500ms":             1500 * time.Millisecond,
		"1.5s":               1500 * time.Millisecond,
	} {
		if d, reason := ParseDelay(v); reason != "" || d != want {
			t.Errorf("ParseDelay(%q) = %v %q, want %v", v, d, reason, want)
		}
	}
	for v, has := range map[string]string{
		"-1.5":                   "negative",
		"-0.5":                   "negative",
		"99999999h":              "out of range",
		"99999999999999999999":   "out of range",
		"99999999999999999999.5": "out of range",
		"1.5.5":                  "neither",
		"1e3":                    "neither",
		"abc":                    "neither",
		".":                      "neither",
		"--1":                    "neither",
		"1500.5ms.":              "neither",
	} {
		if _, reason := ParseDelay(v); !strings.Contains(reason, has) {
			t.Errorf("ParseDelay(%q) reason %q, want it to say %q", v, reason, has)
		}
	}
}

// A delay counted from the moment of ingest (no broker publish time: a
// RabbitMQ message without a timestamp, a POST) ends no earlier than that
// moment plus the delay, whatever part of a millisecond the moment is in:
// truncated to its millisecond, it ended up to a millisecond before, and a
// message sent in that millisecond went out before its send plus its delay.
func TestDelayFromTheMomentOfIngestNeverEndsEarly(t *testing.T) {
	base := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	route := testRoute()
	route.HasDefaultDelay, route.DefaultDelay = true, 2*time.Second
	for _, sub := range []time.Duration{0, time.Nanosecond, 123 * time.Microsecond, 999_999 * time.Nanosecond} {
		now := base.Add(sub)
		for _, c := range []struct {
			in    *Incoming
			delay time.Duration
		}{
			{&Incoming{Headers: hdrs(HeaderDelay, "5000")}, 5 * time.Second},
			{&Incoming{Headers: hdrs(HeaderDelay, "0")}, 0},
			{&Incoming{}, 2 * time.Second}, // the route's default_delay
		} {
			d := Parse(c.in, route, testLimits, now, nil)
			m := mustPark(t, d)
			if m.DueAt.Before(now.Add(c.delay)) || !m.DueAt.Before(now.Add(c.delay+time.Millisecond)) {
				t.Errorf("ingested at %v with delay %v: due %v, want within a millisecond from %v", now, c.delay, m.DueAt, now.Add(c.delay))
			}
			if m.DueAt.Sub(m.IngestedAt) != c.delay {
				t.Errorf("ingested at %v with delay %v: due %v, ingested_at %v", now, c.delay, m.DueAt, m.IngestedAt)
			}
		}
	}
}

// A schedule without a publish time counts from the moment of ingest as
// read: a cron tick less than a millisecond after it is the first
// occurrence. Counted from that moment rounded up, the tick was passed
// over and the first occurrence came a whole period later.
func TestCronFirstOccurrenceJustAfterTheMomentOfIngest(t *testing.T) {
	now := time.Date(2026, 6, 1, 12, 59, 59, 999_500_000, time.UTC)
	m := mustPark(t, Parse(&Incoming{Headers: hdrs(HeaderCron, "0 * * * *")}, testRoute(), testLimits, now, nil))
	if want := time.Date(2026, 6, 1, 13, 0, 0, 0, time.UTC); !m.DueAt.Equal(want) {
		t.Fatalf("first occurrence %v, want %v", m.DueAt, want)
	}
}
