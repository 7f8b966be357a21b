package envelope

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// schedRoute is a Kafka ingest reading the given dialects, whose route
// allows overrides (scheduler-target-topic is one).
func schedRoute(dialects ...Dialect) *Route {
	r := testRoute()
	r.Sink = "kafka"
	r.Destination = "fallback"
	r.AllowOverride = true
	r.Dialects = dialects
	return r
}

// epoch is testNow plus d, as scheduler-epoch (Unix seconds).
func epoch(d time.Duration) string { return strconv.FormatInt(testNow.Add(d).Unix(), 10) }

// schedRecord is a record written the way etf1's clientlib and its README
// write them: key = schedule ID, the three scheduler-* headers as strings,
// a customer header, the original value.
func schedRecord(key, epoch string) *Incoming {
	return &Incoming{
		Source:      "schedules",
		Key:         []byte(key),
		Body:        []byte("video 1"),
		Origin:      Origin{Log: "schedules/0", Pos: 7},
		PublishedAt: testNow.Add(-time.Second),
		Headers: hdrs(
			HeaderSchedulerEpoch, epoch,
			HeaderSchedulerTargetTopic, "online-videos",
			HeaderSchedulerTargetKey, "vid1",
			"customer-header", "dummy",
		),
	}
}

func TestParseKafkaScheduler(t *testing.T) {
	in := schedRecord("vid1-online", epoch(90*time.Second))
	d := parseWith(t, in, schedRoute(DialectKafkaScheduler), testLimits)
	m := mustPark(t, d)
	pub := testNow.Add(-time.Second) // full resolution
	want := &Message{
		ID:          "vid1-online",
		DueAt:       time.Unix(testNow.Add(90*time.Second).Unix(), 0),
		Sink:        "kafka",
		Destination: "online-videos",
		Key:         []byte("vid1"),
		Body:        []byte("video 1"),
		Ingest:      "orders-in",
		IngestedAt:  nowMs,
		PublishedAt: pub,
		Origin:      Origin{Log: "schedules/0", Pos: 7},
		Headers: hdrs("customer-header", "dummy",
			HeaderSchedulerTimestamp, strconv.FormatInt(pub.Unix(), 10),
			HeaderSchedulerKey, "vid1-online",
			HeaderSchedulerTopic, "schedules"),
	}
	if diff := diffMessages(want, m); diff != "" {
		t.Fatal(diff)
	}
	if !m.Replace {
		t.Fatal("a kafka-scheduler record does not replace")
	}

	// Without scheduler-target-key the record is published without a key,
	// as etf1 does.
	in = schedRecord("k", epoch(time.Minute))
	in.Headers = hdrs(HeaderSchedulerEpoch, epoch(time.Minute), HeaderSchedulerTargetTopic, "t", "x", "y")
	if m := mustPark(t, parseWith(t, in, schedRoute(DialectKafkaScheduler), testLimits)); m.Key != nil {
		t.Fatalf("key %q without scheduler-target-key", m.Key)
	}
	// An empty scheduler-target-key is an empty key, not a null one (a
	// compacted target topic refuses a record without a key).
	in = schedRecord("k", epoch(time.Minute))
	in.Headers = hdrs(HeaderSchedulerEpoch, epoch(time.Minute), HeaderSchedulerTargetTopic, "t", HeaderSchedulerTargetKey, "")
	if m := mustPark(t, parseWith(t, in, schedRoute(DialectKafkaScheduler), testLimits)); m.Key == nil || len(m.Key) != 0 {
		t.Fatalf("key %q (nil: %v) for an empty scheduler-target-key, want an empty key", m.Key, m.Key == nil)
	}
	// Without scheduler-target-topic the route's destination, which may be
	// a template.
	in = schedRecord("k", epoch(time.Minute))
	in.Headers = hdrs(HeaderSchedulerEpoch, epoch(time.Minute))
	r := schedRoute(DialectKafkaScheduler)
	r.Destination = "{source}.fired"
	if m := mustPark(t, parseWith(t, in, r, testLimits)); m.Destination != "schedules.fired" {
		t.Fatalf("destination %q", m.Destination)
	}
	// A past epoch is published at once, as etf1 does with a missed
	// schedule.
	in = schedRecord("k", epoch(-time.Hour))
	if m := mustPark(t, parseWith(t, in, schedRoute(DialectKafkaScheduler), testLimits)); !m.DueAt.Equal(time.Unix(testNow.Add(-time.Hour).Unix(), 0)) {
		t.Fatalf("due %v", m.DueAt)
	}
	// Header names are case-insensitive here (etf1 matches them exactly).
	in = schedRecord("k", epoch(time.Minute))
	in.Headers[0].Key = "Scheduler-Epoch"
	mustPark(t, parseWith(t, in, schedRoute(DialectKafkaScheduler), testLimits))
	// Without a broker publish time, scheduler-timestamp is the moment of
	// ingest; PublishedAt stays unknown (the store counts the moment of
	// ingest for it).
	in = schedRecord("k", epoch(time.Minute))
	in.PublishedAt = time.Time{}
	m = mustPark(t, parseWith(t, in, schedRoute(DialectKafkaScheduler), testLimits))
	if v, _ := m.Headers.Get(HeaderSchedulerTimestamp); v != strconv.FormatInt(testNow.Unix(), 10) || !m.PublishedAt.IsZero() {
		t.Fatalf("scheduler-timestamp %q, published %v", v, m.PublishedAt)
	}
}

// A record that already carries scheduler-key, -topic or -timestamp (a
// triggered record fed back) gets one of each, delaybridge's.
func TestParseKafkaSchedulerReplacesAddedHeaders(t *testing.T) {
	in := schedRecord("new", epoch(time.Minute))
	in.Headers = append(in.Headers, Header{Key: HeaderSchedulerKey, Value: "old"}, Header{Key: "Scheduler-Topic", Value: "old"})
	m := mustPark(t, parseWith(t, in, schedRoute(DialectKafkaScheduler), testLimits))
	if m.Headers.Count(HeaderSchedulerKey) != 1 || m.Headers.Count(HeaderSchedulerTopic) != 1 {
		t.Fatalf("headers %v", m.Headers)
	}
	if v, _ := m.Headers.Get(HeaderSchedulerKey); v != "new" {
		t.Fatalf("scheduler-key %q", v)
	}
}

func TestParseKafkaSchedulerTombstone(t *testing.T) {
	in := &Incoming{Source: "schedules", Key: []byte("vid1-online"), Tombstone: true, Origin: Origin{Log: "schedules/0", Pos: 9}}
	d := parseWith(t, in, schedRoute(DialectKafkaScheduler), testLimits)
	if d.Action != Cancel || d.CancelID != "vid1-online" || !d.Tombstone {
		t.Fatalf("tombstone: %v %q tombstone=%v (%s)", d.Action, d.CancelID, d.Tombstone, why(d))
	}
	// With the schedule's headers still on it (etf1 writes its tombstones
	// so), and on an ingest that reads both dialects.
	in = schedRecord("vid1-online", epoch(time.Minute))
	in.Body, in.Tombstone = nil, true
	d = parseWith(t, in, schedRoute(DialectDelaybridge, DialectKafkaScheduler), testLimits)
	if d.Action != Cancel || d.CancelID != "vid1-online" || !d.Tombstone {
		t.Fatalf("tombstone with headers: %v %q (%s)", d.Action, d.CancelID, why(d))
	}
	// Without kafka-scheduler a record without a value is a message with
	// an empty body, as before.
	in = &Incoming{Key: []byte("k"), Tombstone: true, Headers: hdrs(HeaderDelay, "5")}
	d = parseWith(t, in, schedRoute(), testLimits)
	if m := mustPark(t, d); m.ID == "k" || d.Tombstone {
		t.Fatalf("delaybridge ingest took a tombstone as a cancel")
	}
	// On a mixed ingest a delaybridge message with an empty body is no
	// tombstone.
	d = parseWith(t, in, schedRoute(DialectDelaybridge, DialectKafkaScheduler), testLimits)
	mustPark(t, d)
	// A tombstone without a key cancels nothing: rejected.
	in = &Incoming{Tombstone: true, Origin: Origin{Log: "schedules/0", Pos: 3}}
	d = parseWith(t, in, schedRoute(DialectKafkaScheduler), testLimits)
	mustReject(t, d, "needs a key")
}

func TestParseKafkaSchedulerInvalid(t *testing.T) {
	ms := strconv.FormatInt(testNow.Add(time.Hour).UnixMilli(), 10)
	type tc struct {
		name   string
		in     func(*Incoming)
		route  *Route
		reason string
		code   Code
	}
	set := func(k, v string) func(*Incoming) {
		return func(in *Incoming) {
			for i := range in.Headers {
				if strings.EqualFold(in.Headers[i].Key, k) {
					in.Headers[i].Value = v
					return
				}
			}
			in.Headers = append(in.Headers, Header{Key: k, Value: v})
		}
	}
	cases := []tc{
		{"epoch in milliseconds", set(HeaderSchedulerEpoch, ms), nil,
			"it looks like Unix milliseconds (" + FormatTime(testNow.Add(time.Hour).Truncate(time.Millisecond)) + "), but scheduler-epoch is in seconds", CodeOverMaxDelay},
		{"epoch in microseconds", set(HeaderSchedulerEpoch, ms+"000"), nil, "after the year 9999; it looks like Unix milliseconds", CodeOverMaxDelay},
		{"epoch beyond max_delay", set(HeaderSchedulerEpoch, epoch(400*24*time.Hour)), nil, "is more than limits.max_delay", CodeOverMaxDelay},
		{"epoch overflows", set(HeaderSchedulerEpoch, "99999999999999999999"), nil, "out of range", CodeOverMaxDelay},
		{"epoch with fraction", set(HeaderSchedulerEpoch, "1893456000.5"), nil, `scheduler-epoch "1893456000.5" is not Unix seconds`, CodeInvalidEpoch},
		{"epoch in exponent form", set(HeaderSchedulerEpoch, "1.8e9"), nil, "is not Unix seconds", CodeInvalidEpoch},
		{"epoch with a space", set(HeaderSchedulerEpoch, " 1893456000"), nil, "is not Unix seconds", CodeInvalidEpoch},
		{"epoch RFC 3339", set(HeaderSchedulerEpoch, "2026-06-01T12:00:00Z"), nil, "is not Unix seconds", CodeInvalidEpoch},
		{"epoch empty", set(HeaderSchedulerEpoch, ""), nil, "is not Unix seconds", CodeInvalidEpoch},
		{"epoch negative", set(HeaderSchedulerEpoch, "-5"), nil, "before 1970", CodeInvalidEpoch},
		{"no epoch", func(in *Incoming) { in.Headers = in.Headers[1:] }, nil, "no scheduler-epoch header", CodeInvalidEpoch},
		{"no key", func(in *Incoming) { in.Key = nil }, nil, "needs a key", CodeInvalidScheduler},
		{"key not UTF-8", func(in *Incoming) { in.Key = []byte{0xff, 0x01} }, nil, "record key (the schedule ID)", CodeInvalidScheduler},
		{"epoch twice", func(in *Incoming) { in.Headers = append(in.Headers, Header{Key: HeaderSchedulerEpoch, Value: "1"}) }, nil, "given 2 times", CodeDuplicateHeader},
		{"with x-delay", set(HeaderDelay, "5000"), nil, "both scheduler-epoch (kafka-scheduler) and x-delay (delaybridge)", CodeInvalidScheduler},
		{"with x-delay-every", set(HeaderEvery, "1h"), nil, "both scheduler-epoch (kafka-scheduler) and x-delay-every (delaybridge)", CodeInvalidScheduler},
		{"with x-message-id", set(HeaderMessageID, "other"), nil, "x-message-id given on a kafka-scheduler record", CodeInvalidScheduler},
		{"priority twice", func(in *Incoming) { in.Headers = append(in.Headers, hdrs(HeaderPriority, "1", HeaderPriority, "2")...) }, nil, "x-delay-priority given 2 times", CodeDuplicateHeader},
		{"with x-delay-destination", set(HeaderDestination, "t"), nil, "x-delay-destination given on a kafka-scheduler record", CodeInvalidScheduler},
		{"target topic not allowed", nil, func() *Route {
			r := schedRoute(DialectKafkaScheduler)
			r.AllowedDestinations = []string{"videos-*"}
			return r
		}(),
			`scheduler-target-topic "online-videos" matches no pattern of route.allowed_destinations`, CodeInvalidRoute},
		{"target topic without allow_override", nil, func() *Route { r := schedRoute(DialectKafkaScheduler); r.AllowOverride = false; return r }(),
			"x-delay-sink/scheduler-target-topic given, but the route", CodeInvalidRoute},
		{"empty target topic", set(HeaderSchedulerTargetTopic, ""), nil, "scheduler-target-topic is empty", CodeInvalidRoute},
		{"x-delay on a kafka-scheduler-only ingest", func(in *Incoming) { in.Headers = hdrs(HeaderDelay, "5000") }, nil,
			"reads only the kafka-scheduler dialect", CodeInvalidScheduler},
		{"plain record on a kafka-scheduler-only ingest", func(in *Incoming) { in.Headers = nil }, nil, "no scheduler-epoch header", CodeInvalidEpoch},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := schedRecord("vid1-online", epoch(time.Hour))
			if c.in != nil {
				c.in(in)
			}
			r := c.route
			if r == nil {
				r = schedRoute(DialectKafkaScheduler)
			}
			d := parseWith(t, in, r, testLimits)
			mustReject(t, d, c.reason)
			if CodeOf(d.Err) != c.code {
				t.Fatalf("code %q, want %q", CodeOf(d.Err), c.code)
			}
			if d.Message.Replace {
				t.Fatal("a rejected message asks to replace")
			}
		})
	}
}

// On an ingest reading both dialects, each record is read in its own.
func TestParseMixedDialects(t *testing.T) {
	r := schedRoute(DialectDelaybridge, DialectKafkaScheduler)
	m := mustPark(t, parseWith(t, schedRecord("s1", epoch(time.Minute)), r, testLimits))
	if m.ID != "s1" || m.Destination != "online-videos" || !m.Replace {
		t.Fatalf("kafka-scheduler record: %q %q replace=%v", m.ID, m.Destination, m.Replace)
	}
	in := &Incoming{Source: "schedules", Key: []byte("k"), Origin: Origin{Log: "schedules/1", Pos: 1},
		Headers: hdrs(HeaderDelay, "5000", "scheduler-key", "informative")}
	m = mustPark(t, parseWith(t, in, r, testLimits))
	if m.ID != "schedules/1/1" || m.Destination != "fallback" || m.Replace || string(m.Key) != "k" {
		t.Fatalf("delaybridge record: %q %q replace=%v key %q", m.ID, m.Destination, m.Replace, m.Key)
	}
	if v, _ := m.Headers.Get("scheduler-key"); v != "informative" {
		t.Fatalf("an ordinary scheduler-key header was not forwarded: %v", m.Headers)
	}
	// scheduler-* headers on an ingest without the dialect are ordinary
	// headers.
	in = schedRecord("s1", epoch(time.Minute))
	in.Headers = append(in.Headers, Header{Key: HeaderDelay, Value: "1000"})
	m = mustPark(t, parseWith(t, in, schedRoute(), testLimits))
	if m.Destination != "fallback" || m.Headers.Count(HeaderSchedulerEpoch) != 1 || m.Replace {
		t.Fatalf("delaybridge-only ingest: %q %v", m.Destination, m.Headers)
	}
}

func TestParseReplaceHeader(t *testing.T) {
	for v, want := range map[string]bool{"true": true, "TRUE": true, " True ": true, "false": false, "False": false} {
		d := parse(t, &Incoming{Headers: hdrs(HeaderDelay, "1", HeaderReplace, v, "a", "b")})
		m := mustPark(t, d)
		if m.Replace != want {
			t.Errorf("x-delay-replace %q: Replace %v", v, m.Replace)
		}
		if len(m.Headers) != 1 {
			t.Errorf("x-delay-replace forwarded: %v", m.Headers)
		}
	}
	for _, v := range []string{"", "yes", "1", "t", "on"} {
		d := parse(t, &Incoming{Headers: hdrs(HeaderDelay, "1", HeaderReplace, v)})
		mustReject(t, d, "x-delay-replace")
		if CodeOf(d.Err) != CodeInvalidReplace {
			t.Errorf("x-delay-replace %q: code %q", v, CodeOf(d.Err))
		}
	}
	if m := mustPark(t, parse(t, &Incoming{Headers: hdrs(HeaderDelay, "1")})); m.Replace {
		t.Error("Replace without x-delay-replace")
	}
	mustReject(t, parse(t, &Incoming{Headers: hdrs(HeaderDelay, "1", HeaderReplace, "true", HeaderReplace, "true")}), "given 2 times")
}

// PublishedAt is the broker's publish time at its full resolution, capped
// at the moment of ingest, zero when the broker records none: the store
// compares it to decide which of two versions of an ID is newer (Origin).
func TestParsePublishedAt(t *testing.T) {
	pub := testNow.Add(-3 * time.Second)
	m := mustPark(t, parse(t, &Incoming{Headers: hdrs(HeaderDelay, "1"), PublishedAt: pub}))
	if !m.PublishedAt.Equal(pub) {
		t.Fatalf("PublishedAt %v, want %v", m.PublishedAt, pub)
	}
	// A producer's clock a year ahead: capped, and the delay counts from
	// the moment of ingest.
	m = mustPark(t, parse(t, &Incoming{Headers: hdrs(HeaderDelay, "1000"), PublishedAt: testNow.AddDate(1, 0, 0)}))
	if !m.PublishedAt.Equal(testNow) || !m.DueAt.Equal(CeilMillis(testNow.Add(time.Second))) {
		t.Fatalf("future publish time: PublishedAt %v, due %v", m.PublishedAt, m.DueAt)
	}
	m = mustPark(t, parse(t, &Incoming{Headers: hdrs(HeaderDelay, "1")}))
	if !m.PublishedAt.IsZero() || !m.IngestedAt.Equal(nowMs) {
		t.Fatalf("PublishedAt %v, IngestedAt %v", m.PublishedAt, m.IngestedAt)
	}
}
