// Package opstest is the conformance suite of the operations: every
// implementation of ops.Operations (the ops.Service on Redis, the admin
// API's Client through a daemon) runs Run against a real Redis, so that the
// command line's two modes, the admin API and the dashboard's calls give
// the same answers and refuse with the same errors. The idea is the sink and
// ingest suites' (internal/sinktest, internal/ingesttest): one table of
// cases, and a Harness that connects it to one way of running them.
//
// # How to adopt it
//
//	func TestOperations(t *testing.T) {
//		opstest.Run(t, opstest.Harness{
//			Name: "http",
//			// the operations of a Service built from p, however they are reached
//			Open: func(t *testing.T, p ops.Params) ops.Operations { ... },
//		})
//	}
//
// Each case gets a Service's Params on a store of its own (a fresh key
// prefix on one redis-server per Run): the sinks rabbit (RabbitMQ), kafka
// (Kafka) and nats (NATS), known to a daemon; the ingests orders (to
// rabbit, orders.expired, overrides allowed within orders.*) and events (to
// nats, the template fired.{source.2}.oc); and the Limits below. The suite
// waits on nothing but Redis's answers: no sleeping.
package opstest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/brokers/kafkabroker"
	"github.com/delaybridge/delaybridge/pkg/brokers/natsbroker"
	"github.com/delaybridge/delaybridge/pkg/brokers/rabbitbroker"
	"github.com/delaybridge/delaybridge/pkg/destination"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ops"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// Harness connects the suite to one way of running the operations.
type Harness struct {
	Name string
	// Open returns the operations of a Service built from p: the Service
	// itself, or a client of a server of it. It cleans up with t.
	Open func(t *testing.T, p ops.Params) ops.Operations
}

// Limits are the limits of every case's Service.
var Limits = envelope.Limits{MaxDelay: 48 * time.Hour, MaxPayloadBytes: 1 << 20, MaxHeaderBytes: 64 << 10, MaxIDBytes: 200}

// env is one case: its operations, its store, and what the Service woke
// the scheduler for.
type env struct {
	t     *testing.T
	ctx   context.Context
	ops   ops.Operations
	store *store.Store
	// open gives the case a store of its own with limits.max_series
	// maxSeries (0: no bound, as every case starts) and its operations.
	open func(maxSeries int64)

	mu    sync.Mutex
	woken []string
}

var prefixes atomic.Int64

// Run runs every case with the harness, each against a store of its own.
func Run(t *testing.T, h Harness) {
	rs := testenv.Redis(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := &env{t: t, ctx: context.Background()}
			e.open = func(maxSeries int64) {
				e.store = store.New(rs.Client(), store.Options{Prefix: fmt.Sprintf("ops%d", prefixes.Add(1)), Shards: 4, MaxSeries: maxSeries})
				e.ops = h.Open(t, e.params())
			}
			e.open(0)
			c.run(e)
		})
	}
}

func (e *env) params() ops.Params {
	sinks := destination.Sinks{"rabbit": rabbitbroker.Destinations, "kafka": kafkabroker.Destinations, "nats": natsbroker.Destinations}
	routes := map[string]*envelope.Route{
		"orders": {Ingest: "orders", Sink: "rabbit", Destination: "orders.expired", AllowOverride: true,
			AllowedDestinations: []string{"orders.*"}, Sinks: sinks.Lookup},
		"events": {Ingest: "events", Sink: "nats", Destination: "fired.{source.2}.oc", Sinks: sinks.Lookup},
	}
	return ops.Params{
		Store:        e.store,
		Limits:       Limits,
		Destinations: sinks.Lookup,
		Routes:       func(name string) (*envelope.Route, bool) { r, ok := routes[name]; return r, ok },
		Sinks: func() []ops.SinkStatus {
			return []ops.SinkStatus{{Name: "rabbit", Known: true, Rate: 2}, {Name: "kafka", Known: true, MaxRate: 50}, {Name: "nats", Known: true}}
		},
		Notify: func(id string, _ time.Time) {
			e.mu.Lock()
			e.woken = append(e.woken, id)
			e.mu.Unlock()
		},
	}
}

// wasWoken reports whether the Service woke the scheduler for id.
func (e *env) wasWoken(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Contains(e.woken, id)
}

// ---- fixtures and checks ----

// msg is a message of the orders ingest due at due.
func msg(id string, due time.Time) *envelope.Message {
	return &envelope.Message{ID: id, DueAt: due.Truncate(time.Millisecond), Sink: "rabbit", Destination: "orders.expired",
		Body: []byte("body of " + id), Ingest: "orders", IngestedAt: time.Now().Truncate(time.Millisecond)}
}

func (e *env) park(ms ...*envelope.Message) {
	e.t.Helper()
	res, err := e.store.Park(e.ctx, ms)
	if err != nil {
		e.t.Fatal(err)
	}
	for i, r := range res {
		if r != store.Parked {
			e.t.Fatalf("%s not parked: %v", ms[i].ID, r)
		}
	}
}

// reject keeps m as a message rejected at ingest, as the pipeline does.
func (e *env) reject(m *envelope.Message, reason string) {
	e.t.Helper()
	if _, err := e.store.Reject(e.ctx, []store.Rejected{{Message: m, Reason: reason}}); err != nil {
		e.t.Fatal(err)
	}
}

// dieAtSink parks m due now, claims it and marks it dead with reason, as
// the scheduler does when a publish fails for good.
func (e *env) dieAtSink(m *envelope.Message, reason string) {
	e.t.Helper()
	m.DueAt = time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	e.park(m)
	l, err := e.store.Claim(e.ctx, e.store.ShardOf(m.ID), 100, time.Minute, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	if n, err := e.store.MarkDead(e.ctx, l, []store.Failure{{ID: m.ID, Reason: reason}}); err != nil || n != 1 {
		e.t.Fatalf("mark %s dead: %d %v", m.ID, n, err)
	}
}

// stored returns what Redis holds of id.
func (e *env) stored(id string) *store.Info {
	e.t.Helper()
	info, err := e.store.Inspect(e.ctx, id)
	if err != nil {
		e.t.Fatalf("inspect %s in Redis: %v", id, err)
	}
	return info
}

// refused checks that err is an *ops.Error of kind, whose field is field
// (when not "") and whose sentence holds every one of words.
func (e *env) refused(what string, err error, kind error, field string, words ...string) *ops.Error {
	e.t.Helper()
	var oe *ops.Error
	switch {
	case !errors.As(err, &oe):
		e.t.Fatalf("%s: %v (%T), want an *ops.Error of %v", what, err, err, kind)
	case !errors.Is(err, kind):
		e.t.Fatalf("%s: %v is %v, want %v", what, err, oe.Kind, kind)
	case field != "" && oe.Field != field:
		e.t.Errorf("%s: %q names the field %q, want %q", what, oe.Reason, oe.Field, field)
	}
	for _, w := range words {
		if !strings.Contains(oe.Reason, w) {
			e.t.Errorf("%s: %q does not say %q", what, oe.Reason, w)
		}
	}
	return oe
}

func (e *env) ok(what string, err error) {
	e.t.Helper()
	if err != nil {
		e.t.Fatalf("%s: %v", what, err)
	}
}

// near reports whether the RFC 3339 time s is within d of t.
func near(s string, t time.Time, d time.Duration) bool {
	got, err := time.Parse(time.RFC3339Nano, s)
	return err == nil && got.Sub(t) < d && t.Sub(got) < d
}

func intp(n int) *int         { return &n }
func strp(s string) *string   { return &s }
func boolp(b bool) *bool      { return &b }
func scalar(v any) ops.Scalar { b, _ := json.Marshal(v); return b }

// ---- the cases ----

var cases = []struct {
	name string
	run  func(e *env)
}{
	{"InspectAndCancel", inspectAndCancel},
	{"Post", post},
	{"PostEveryOption", postEveryOption},
	{"ViewShowsEveryOption", viewShowsEveryOption},
	{"PostInvalid", postInvalid},
	{"List", list},
	{"RescheduleAndFire", rescheduleAndFire},
	{"Stats", stats},
	{"DeadListDeletePurge", deadListDeletePurge},
	{"MalformedFiltersRefused", malformedFiltersRefused},
	{"LongIDsRefused", longIDsRefused},
	{"RetryDiedAtIngest", retryDiedAtIngest},
	{"RetryDiedAtSink", retryDiedAtSink},
	{"RetryPastMaxSeries", retryPastMaxSeries},
	{"Groups", groups},
	{"Sinks", sinksCase},
}

// inspectAndCancel: a parked message as a view, its content only when
// asked for; cancel removes it; unknown IDs are ErrNotFound, refused ones
// ErrInvalid naming the ID.
func inspectAndCancel(e *env) {
	m := msg("order/42", time.Now().Add(time.Hour))
	m.Headers = envelope.Headers{{Key: "x-trace", Value: "t1"}}
	m.Key = []byte("k42")
	m.Priority = 3
	e.park(m)
	v, err := e.ops.Inspect(e.ctx, "order/42", false)
	e.ok("inspect", err)
	if v.ID != "order/42" || v.State != store.StateScheduled || v.DueAt != envelope.FormatTime(m.DueAt) || v.Sink != "rabbit" ||
		v.Destination != "orders.expired" || v.Priority != 3 || v.Ingest != "orders" || v.Body != nil || v.Headers != nil {
		e.t.Errorf("inspect: %+v", v)
	}
	v, err = e.ops.Inspect(e.ctx, "order/42", true)
	e.ok("inspect with content", err)
	if v.Body == nil || *v.Body != "body of order/42" || v.Key == nil || *v.Key != "k42" || v.Headers["x-trace"] != "t1" {
		e.t.Errorf("inspect with content: %+v", v)
	}
	e.refused("inspect dead", func() error { _, err := e.ops.InspectDead(e.ctx, "order/42", false); return err }(), ops.ErrNotFound, "", "no dead message")
	e.ok("cancel", e.ops.Cancel(e.ctx, "order/42"))
	_, err = e.ops.Inspect(e.ctx, "order/42", false)
	e.refused("inspect cancelled", err, ops.ErrNotFound, "", `"order/42"`, "never parked, already delivered, or cancelled")
	e.refused("cancel again", e.ops.Cancel(e.ctx, "order/42"), ops.ErrNotFound, "")
	_, err = e.ops.Inspect(e.ctx, "a\u202eb", false)
	e.refused("inspect a deceptive ID", err, ops.ErrInvalid, "id", "U+202E")
}

// post: a message scheduled without a broker goes through the ingest
// rules; an ID already known is not parked again.
func post(e *env) {
	before := time.Now()
	v, err := e.ops.Post(e.ctx, &ops.PostRequest{Delay: scalar("1h"), Sink: "kafka", Destination: "orders-topic", Options: envelope.Options{ID: strp("p1")},
		Key: strp("k"), Headers: map[string]string{"x-a": "1"}, Body: strp("hello")})
	e.ok("post", err)
	if v.ID != "p1" || v.Duplicate || !near(v.DueAt, before.Add(time.Hour), 5*time.Second) {
		e.t.Errorf("post: %+v", v)
	}
	sm := e.stored("p1").Message
	if sm.Sink != "kafka" || sm.Destination != "orders-topic" || string(sm.Body) != "hello" || string(sm.Key) != "k" ||
		!slices.Equal(sm.Headers, envelope.Headers{{Key: "x-a", Value: "1"}}) || sm.Ingest != "" {
		e.t.Errorf("stored: %+v", sm)
	}
	if !e.wasWoken("p1") {
		e.t.Error("the scheduler was not woken for the posted message")
	}
	v, err = e.ops.Post(e.ctx, &ops.PostRequest{Delay: scalar(5000), Sink: "kafka", Destination: "other", Options: envelope.Options{ID: strp("p1")}, Body: strp("again")})
	e.ok("post again", err)
	if !v.Duplicate || v.DueAt != envelope.FormatTime(sm.DueAt) || string(e.stored("p1").Message.Body) != "hello" {
		e.t.Errorf("a known ID: %+v", v)
	}
	// A generated ID, a time given as epoch ms, a body in base64.
	at := time.Now().Add(2 * time.Hour).Truncate(time.Millisecond)
	v, err = e.ops.Post(e.ctx, &ops.PostRequest{DeliverAt: scalar(at.UnixMilli()), Sink: "rabbit", Destination: "q", BodyBase64: strp("/wA=")})
	e.ok("post with deliver_at", err)
	if v.ID == "" || v.DueAt != envelope.FormatTime(at) || string(e.stored(v.ID).Message.Body) != "\xff\x00" {
		e.t.Errorf("post with deliver_at: %+v", v)
	}
}

// postEveryOption: every option the headers have, as request fields.
func postEveryOption(e *env) {
	_, err := e.ops.Post(e.ctx, &ops.PostRequest{Delay: scalar("1h"), Sink: "rabbit", Destination: "q", Body: strp("v1"),
		Options: envelope.Options{ID: strp("o1"), Group: strp("order-7"), Priority: intp(7)}})
	e.ok("post with group and priority", err)
	if sm := e.stored("o1").Message; sm.Group != "order-7" || sm.Priority != 7 {
		e.t.Errorf("group and priority: %+v", sm)
	}
	// replace: a newer version replaces the parked one.
	v, err := e.ops.Post(e.ctx, &ops.PostRequest{Delay: scalar("2h"), Sink: "rabbit", Destination: "q2", Body: strp("v2"),
		Options: envelope.Options{ID: strp("o1"), Replace: boolp(true)}})
	e.ok("post with replace", err)
	if sm := e.stored("o1").Message; v.Duplicate || string(sm.Body) != "v2" || sm.Destination != "q2" || v.DueAt != envelope.FormatTime(sm.DueAt) {
		e.t.Errorf("replace: %+v, stored %+v", v, sm)
	}
	// every, with until and count; no delay needed: one interval after now.
	until := time.Now().Add(24 * time.Hour).UTC().Truncate(time.Second)
	v, err = e.ops.Post(e.ctx, &ops.PostRequest{Sink: "rabbit", Destination: "q", Body: strp("tick"),
		Options: envelope.Options{ID: strp("e1"), Every: "30m", Until: until.Format(time.RFC3339), Count: intp(5)}})
	e.ok("post every", err)
	r := e.stored("e1").Message.Recur
	if r == nil || r.Every != 30*time.Minute || r.Count != 5 || !r.Until.Equal(until) || r.N != 1 || !near(v.DueAt, time.Now().Add(30*time.Minute), 5*time.Second) {
		e.t.Errorf("every: %+v %+v", v, r)
	}
	// cron in a zone, first at deliver_at.
	at := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	_, err = e.ops.Post(e.ctx, &ops.PostRequest{DeliverAt: scalar(envelope.FormatTime(at)), Sink: "rabbit", Destination: "q", Body: strp("weekly"),
		Options: envelope.Options{ID: strp("c1"), Cron: "0 9 * * MON", TimeZone: "Europe/Berlin"}})
	e.ok("post cron", err)
	if sm := e.stored("c1").Message; sm.Recur == nil || sm.Recur.Cron != "0 9 * * MON" || sm.Recur.TimeZone != "Europe/Berlin" || !sm.DueAt.Equal(at) {
		e.t.Errorf("cron: %+v", sm)
	}
	iv, err := e.ops.Inspect(e.ctx, "c1", false)
	e.ok("inspect cron", err)
	if iv.Recurrence == nil || iv.Recurrence.Cron != "0 9 * * MON" || iv.Recurrence.TimeZone != "Europe/Berlin" || iv.Recurrence.Occurrence != 1 {
		e.t.Errorf("inspect cron: %+v", iv.Recurrence)
	}
}

// viewShowsEveryOption: each option of the table (envelope.Options) that
// a view shows (its view tag) shows as the request gave it, at that path
// of the view's JSON. The values are given in the form the view writes.
func viewShowsEveryOption(e *env) {
	until := envelope.FormatTime(time.Now().Add(48 * time.Hour).Truncate(time.Second))
	for _, req := range []string{
		`{"delay":"1h","sink":"rabbit","destination":"q","body":"b","id":"view-1","priority":6,"group":"view-group","every":"30m0s","until":"` + until + `","count":4}`,
		`{"delay":"1h","sink":"rabbit","destination":"q","body":"b","id":"view-2","cron":"0 9 * * MON","timezone":"Europe/Berlin"}`,
	} {
		var r ops.PostRequest
		if err := json.Unmarshal([]byte(req), &r); err != nil {
			e.t.Fatal(err)
		}
		v, err := e.ops.Post(e.ctx, &r)
		e.ok("post with options", err)
		iv, err := e.ops.Inspect(e.ctx, v.ID, false)
		e.ok("inspect", err)
		raw, _ := json.Marshal(iv)
		var view map[string]any
		_ = json.Unmarshal(raw, &view)
		var asked map[string]any
		_ = json.Unmarshal([]byte(req), &asked)
		for _, o := range envelope.OptionTable() {
			if _, ok := asked[o.Field]; !ok || o.View == "" {
				continue
			}
			var at any = view
			for _, step := range strings.Split(o.View, ".") {
				m, _ := at.(map[string]any)
				at = m[step]
			}
			want, _ := json.Marshal(asked[o.Field])
			if got, _ := json.Marshal(at); string(got) != string(want) {
				e.t.Errorf("option %s shows at %s of the view as %s, want %s: %s", o.Field, o.View, got, want, raw)
			}
		}
	}
}

// postInvalid: refusals name the request field, in the ingest rules' words
// with the fields' names.
func postInvalid(e *env) {
	valid := func() *ops.PostRequest {
		return &ops.PostRequest{Delay: scalar(1000), Sink: "rabbit", Destination: "q", Body: strp("b")}
	}
	for _, c := range []struct {
		name   string
		change func(r *ops.PostRequest)
		field  string
		words  []string
	}{
		{"delay text", func(r *ops.PostRequest) { r.Delay = scalar("soon") }, "delay", []string{`delay "soon" is neither`}},
		{"both delays", func(r *ops.PostRequest) { r.DeliverAt = scalar(1) }, "delay", []string{"not both"}},
		{"no delay", func(r *ops.PostRequest) { r.Delay = nil }, "delay", []string{"delay or deliver_at is required"}},
		{"over max_delay", func(r *ops.PostRequest) { r.Delay = scalar("72h") }, "delay", []string{"limits.max_delay"}},
		{"unknown sink", func(r *ops.PostRequest) { r.Sink = "nope" }, "sink", []string{`sink "nope" names no configured sink`}},
		{"no destination", func(r *ops.PostRequest) { r.Destination = "" }, "destination", []string{"destination is required"}},
		{"reserved destination", func(r *ops.PostRequest) { r.Sink, r.Destination = "nats", "$JS.API.STREAM.DELETE.X" }, "destination", []string{"$"}},
		{"priority", func(r *ops.PostRequest) { r.Priority = intp(10) }, "priority", []string{"priority"}},
		{"group", func(r *ops.PostRequest) { r.Group = strp("a\tb") }, "group", []string{"control character"}},
		{"every too short", func(r *ops.PostRequest) { r.Delay, r.Every = nil, "10ms" }, "every", []string{"every", "shorter than limits.min_interval 1s"}},
		{"cron", func(r *ops.PostRequest) { r.Cron = "every day" }, "cron", []string{"cron"}},
		{"timezone", func(r *ops.PostRequest) { r.Cron, r.TimeZone = "@daily", "Mars/Olympus" }, "timezone", []string{"IANA"}},
		{"control header", func(r *ops.PostRequest) { r.Headers = map[string]string{"X-Delay": "5"} }, "headers", []string{"control header"}},
		{"no body", func(r *ops.PostRequest) { r.Body = nil }, "body", []string{"body is required"}},
		{"id over max_id_bytes", func(r *ops.PostRequest) { r.ID = strp(strings.Repeat("i", 201)) }, "id", []string{"limits.max_id_bytes"}},
	} {
		r := valid()
		c.change(r)
		_, err := e.ops.Post(e.ctx, r)
		e.refused(c.name, err, ops.ErrInvalid, c.field, c.words...)
	}
	if st, err := e.store.Stats(e.ctx); err != nil || st.Parked != 0 || st.Dead != 0 {
		e.t.Errorf("a refused request left something: %+v %v", st, err)
	}
}

// list: pages in firing order, filters, and refusals naming the parameter.
func list(e *env) {
	now := time.Now()
	for i := range 7 {
		m := msg(fmt.Sprintf("l%d", i), now.Add(time.Duration(i+1)*time.Minute))
		if i%2 == 1 {
			m.Sink = "kafka"
		}
		e.park(m)
	}
	p, err := e.ops.List(e.ctx, ops.ListQuery{Limit: intp(3)})
	e.ok("first page", err)
	if len(p.Messages) != 3 || p.Messages[0].ID != "l0" || p.Messages[2].ID != "l2" || p.NextCursor == nil {
		e.t.Fatalf("first page: %+v", p)
	}
	p, err = e.ops.List(e.ctx, ops.ListQuery{Limit: intp(3), Cursor: *p.NextCursor})
	e.ok("second page", err)
	if len(p.Messages) != 3 || p.Messages[0].ID != "l3" {
		e.t.Fatalf("second page: %+v", p)
	}
	p, err = e.ops.List(e.ctx, ops.ListQuery{Sink: "kafka", DueBefore: envelope.FormatTime(now.Add(5 * time.Minute)), Content: true})
	e.ok("filtered", err)
	if len(p.Messages) != 2 || p.Messages[0].ID != "l1" || p.Messages[1].ID != "l3" || p.Messages[0].Body == nil {
		e.t.Errorf("kafka before +5m: %+v", p.Messages)
	}
	_, err = e.ops.List(e.ctx, ops.ListQuery{Cursor: "forged"})
	e.refused("forged cursor", err, ops.ErrInvalid, "cursor", "cursor")
	_, err = e.ops.List(e.ctx, ops.ListQuery{State: "parked"})
	e.refused("unknown state", err, ops.ErrInvalid, "state", `state "parked"`)
	_, err = e.ops.List(e.ctx, ops.ListQuery{Limit: intp(0)})
	e.refused("limit 0", err, ops.ErrInvalid, "limit", "limit 0")
	_, err = e.ops.List(e.ctx, ops.ListQuery{DueAfter: "yesterday"})
	e.refused("due_after", err, ops.ErrInvalid, "due_after", `due_after "yesterday"`)
}

// rescheduleAndFire: a new due time by delay or time, compare and set, the
// refusals of what is in flight, dead or unknown.
func rescheduleAndFire(e *env) {
	now := time.Now()
	e.park(msg("r1", now.Add(time.Hour)), msg("inflight", now.Add(-time.Minute)))
	if _, err := e.store.Claim(e.ctx, e.store.ShardOf("inflight"), 10, time.Minute, nil); err != nil {
		e.t.Fatal(err)
	}
	e.reject(msg("gone", now), "x-delay is empty")

	v, err := e.ops.Reschedule(e.ctx, "r1", ops.RescheduleRequest{Delay: ops.Text("30m")})
	e.ok("reschedule", err)
	if !near(v.DueAt, now.Add(30*time.Minute), 5*time.Second) || v.DueAt != envelope.FormatTime(e.stored("r1").Message.DueAt) {
		e.t.Errorf("reschedule by delay: %+v", v)
	}
	stale := envelope.FormatTime(now)
	_, err = e.ops.Reschedule(e.ctx, "r1", ops.RescheduleRequest{Delay: ops.Text("1h"), IfDueAt: ops.Text(stale)})
	if oe := e.refused("stale if_due_at", err, ops.ErrConflict, "", "changed meanwhile"); oe.DueAt != v.DueAt {
		e.t.Errorf("the conflict says the due time is %q, want %q", oe.DueAt, v.DueAt)
	}
	_, err = e.ops.Reschedule(e.ctx, "r1", ops.RescheduleRequest{DeliverAt: ops.Text("2001-01-01T00:00:00Z"), IfDueAt: ops.Text(v.DueAt)})
	e.ok("reschedule into the past", err)
	if d := e.stored("r1").Message.DueAt; time.Since(d) > 5*time.Second || time.Until(d) > time.Second {
		e.t.Errorf("into the past: due %v, want now", d)
	}
	_, err = e.ops.Reschedule(e.ctx, "r1", ops.RescheduleRequest{Delay: ops.Text("72h")})
	e.refused("over max_delay", err, ops.ErrInvalid, "delay", "limits.max_delay")
	_, err = e.ops.Reschedule(e.ctx, "inflight", ops.RescheduleRequest{Delay: ops.Text("1h")})
	e.refused("in flight", err, ops.ErrConflict, "", "being published now")
	_, err = e.ops.Reschedule(e.ctx, "gone", ops.RescheduleRequest{Delay: ops.Text("1h")})
	e.refused("dead", err, ops.ErrConflict, "", "is dead", "retry it")
	_, err = e.ops.Reschedule(e.ctx, "nope", ops.RescheduleRequest{Delay: ops.Text("1h")})
	e.refused("unknown", err, ops.ErrNotFound, "")

	e.park(msg("f1", now.Add(time.Hour)))
	e.ok("fire", e.ops.Fire(e.ctx, "f1"))
	if d := e.stored("f1").Message.DueAt; time.Since(d) > 5*time.Second || time.Until(d) > time.Second {
		e.t.Errorf("fired: due %v, want now", d)
	}
	e.refused("fire in flight", e.ops.Fire(e.ctx, "inflight"), ops.ErrConflict, "", "being published now")
	e.refused("fire dead", e.ops.Fire(e.ctx, "gone"), ops.ErrConflict, "", "is dead")
	e.refused("fire unknown", e.ops.Fire(e.ctx, "nope"), ops.ErrNotFound, "")
}

// stats: the counts.
func stats(e *env) {
	now := time.Now()
	e.park(msg("s1", now.Add(-time.Second)), msg("s2", now.Add(time.Hour)), msg("s3", now.Add(48*time.Hour)))
	e.reject(msg("s4", now), "x-delay is empty")
	v, err := e.ops.Stats(e.ctx)
	e.ok("stats", err)
	if v.Parked != 3 || v.Due != 1 || v.Dead != 1 || len(v.Shards) != 4 || v.DueIn.Overdue != 1 || v.DueIn.Later != 1 || v.Forecast.Day != 2 {
		e.t.Errorf("stats: %+v", v)
	}
}

// deadListDeletePurge: the dead list and its filters, delete, and a purge
// that deletes what the filters select, in one call.
func deadListDeletePurge(e *env) {
	now := time.Now()
	for i, m := range []*envelope.Message{msg("d1", now), msg("d2", now), msg("d3", now), msg("d4", now)} {
		if i >= 2 {
			m.Sink, m.Ingest = "kafka", "events"
		}
		e.reject(m, fmt.Sprintf("reason %d", i))
	}
	e.park(msg("alive", now.Add(time.Hour)))
	all, err := e.ops.ListDead(e.ctx, ops.DeadQuery{})
	e.ok("dead list", err)
	if len(all) != 4 {
		e.t.Fatalf("dead list: %+v", all)
	}
	kafka, err := e.ops.ListDead(e.ctx, ops.DeadQuery{DeadFilter: ops.DeadFilter{Sink: "kafka"}, Limit: intp(10)})
	e.ok("dead list of kafka", err)
	if len(kafka) != 2 || kafka[0].Sink != "kafka" || kafka[1].Sink != "kafka" {
		e.t.Errorf("dead list of kafka: %+v", kafka)
	}
	_, err = e.ops.ListDead(e.ctx, ops.DeadQuery{Limit: intp(ops.MaxDeadLimit + 1)})
	e.refused("limit", err, ops.ErrInvalid, "limit", "limit")
	_, err = e.ops.ListDead(e.ctx, ops.DeadQuery{DeadFilter: ops.DeadFilter{DeadAfter: "soon"}})
	e.refused("dead_after", err, ops.ErrInvalid, "dead_after", "dead_after")

	v, err := e.ops.InspectDead(e.ctx, "d1", false)
	e.ok("inspect dead", err)
	if v.State != store.StateDead || v.Reason != "reason 0" {
		e.t.Errorf("inspect dead: %+v", v)
	}
	e.ok("delete dead", e.ops.DeleteDead(e.ctx, "d1"))
	e.refused("delete dead again", e.ops.DeleteDead(e.ctx, "d1"), ops.ErrNotFound, "", "no dead message")
	e.refused("delete a parked one", e.ops.DeleteDead(e.ctx, "alive"), ops.ErrNotFound, "")

	p, err := e.ops.PurgeDead(e.ctx, ops.DeadFilter{Ingest: "events"})
	e.ok("purge events", err)
	if p.Deleted != 2 {
		e.t.Errorf("purge of ingest events deleted %d, want 2", p.Deleted)
	}
	if left, _ := e.ops.ListDead(e.ctx, ops.DeadQuery{}); len(left) != 1 || left[0].ID != "d2" {
		e.t.Errorf("left after the purge: %+v", left)
	}
	p, err = e.ops.PurgeDead(e.ctx, ops.DeadFilter{})
	e.ok("purge all", err)
	if st, _ := e.store.Stats(e.ctx); p.Deleted != 1 || st.Dead != 0 || st.Parked != 1 {
		e.t.Errorf("purge all deleted %d, stats %+v", p.Deleted, st)
	}
}

// malformedFiltersRefused: a filter value no message can have (blank, a
// control character, a group over limits.max_id_bytes) is ErrInvalid
// naming the filter, for the dead list, the purge and the listing, and
// never read as no filter: nothing is purged.
func malformedFiltersRefused(e *env) {
	now := time.Now()
	for _, id := range []string{"d1", "d2", "d3"} {
		e.reject(msg(id, now), "reason")
	}
	for _, c := range []struct {
		field string
		f     ops.DeadFilter
	}{
		{"sink", ops.DeadFilter{Sink: " "}},
		{"destination", ops.DeadFilter{Destination: "\t"}},
		{"ingest", ops.DeadFilter{Ingest: "a\x00b"}},
		{"group", ops.DeadFilter{Group: "g\u202e"}},
		{"group", ops.DeadFilter{Group: strings.Repeat("g", Limits.MaxIDBytes+1)}},
		{"group", ops.DeadFilter{Group: "ok", DeadAfter: "soon"}},
	} {
		field := c.field
		if c.f.DeadAfter != "" {
			field = "dead_after"
		}
		_, err := e.ops.PurgeDead(e.ctx, c.f)
		oe := e.refused(fmt.Sprintf("purge with %+v", c.f), err, ops.ErrInvalid, field)
		if len(oe.Reason) > 300 {
			e.t.Errorf("purge with a %s filter: the reason is %d bytes", field, len(oe.Reason))
		}
		_, err = e.ops.ListDead(e.ctx, ops.DeadQuery{DeadFilter: c.f})
		e.refused(fmt.Sprintf("dead list with %+v", c.f), err, ops.ErrInvalid, field)
		if c.f.DeadAfter == "" {
			_, err = e.ops.List(e.ctx, ops.ListQuery{Sink: c.f.Sink, Destination: c.f.Destination, Ingest: c.f.Ingest, Group: c.f.Group})
			e.refused(fmt.Sprintf("list with %+v", c.f), err, ops.ErrInvalid, field)
		}
	}
	if st, _ := e.store.Stats(e.ctx); st.Dead != 3 {
		e.t.Errorf("a refused purge deleted: %d dead left, want 3", st.Dead)
	}
	if err := ops.EmptyFilter("--group"); !errors.Is(err, ops.ErrInvalid) || !strings.Contains(err.Error(), "--group is given empty") {
		e.t.Errorf("EmptyFilter: %v", err)
	}
}

// longIDsRefused: an ID or a group key longer than limits.max_id_bytes is
// ErrInvalid naming the limit on every operation that takes one, and no
// sentence quotes more than a few dozen bytes of an ID.
func longIDsRefused(e *env) {
	long := strings.Repeat("i", 100<<10)
	short := func(what string, err error, kind error) {
		e.t.Helper()
		oe := e.refused(what, err, kind, "")
		if len(oe.Reason) > 256 || strings.Contains(oe.Reason, strings.Repeat("i", 65)) {
			e.t.Errorf("%s: the reason is %d bytes: %.100s", what, len(oe.Reason), oe.Reason)
		}
		if kind == ops.ErrInvalid && !strings.Contains(oe.Reason, "limits.max_id_bytes") {
			e.t.Errorf("%s: %q does not name limits.max_id_bytes", what, oe.Reason)
		}
	}
	_, err := e.ops.Inspect(e.ctx, long, false)
	short("inspect", err, ops.ErrInvalid)
	_, err = e.ops.InspectDead(e.ctx, long, false)
	short("inspect dead", err, ops.ErrInvalid)
	short("cancel", e.ops.Cancel(e.ctx, long), ops.ErrInvalid)
	short("fire", e.ops.Fire(e.ctx, long), ops.ErrInvalid)
	_, err = e.ops.Reschedule(e.ctx, long, ops.RescheduleRequest{Delay: scalar("1h")})
	short("reschedule", err, ops.ErrInvalid)
	short("delete dead", e.ops.DeleteDead(e.ctx, long), ops.ErrInvalid)
	short("retry dead", e.ops.RetryDead(e.ctx, long, ops.RetryRequest{}), ops.ErrInvalid)
	_, err = e.ops.Group(e.ctx, long, ops.ListQuery{})
	short("group", err, ops.ErrInvalid)
	_, err = e.ops.CancelGroup(e.ctx, long)
	short("cancel group", err, ops.ErrInvalid)
	// At the limit: looked up, and not found in a short sentence.
	atLimit := strings.Repeat("i", Limits.MaxIDBytes)
	_, err = e.ops.Inspect(e.ctx, atLimit, false)
	short("inspect at the limit", err, ops.ErrNotFound)
	_, err = e.ops.Group(e.ctx, atLimit, ops.ListQuery{})
	short("group at the limit", err, ops.ErrNotFound)
}

// retryDiedAtIngest: a message rejected at ingest is read again as its
// ingest read it, through its route (a template expands), due now; what
// still breaks a rule is refused with the rule's reason.
func retryDiedAtIngest(e *env) {
	now := time.Now().Truncate(time.Millisecond)
	// Both delay headers, on the templated route of events.
	both := &envelope.Message{ID: "both", DueAt: now, Sink: "nats", Destination: "fired.{source.2}.oc", Ingest: "events", IngestedAt: now,
		Source: "orders.eu.created", Body: []byte("b"),
		Headers: envelope.Headers{{Key: envelope.HeaderMessageID, Value: "both"}, {Key: envelope.HeaderDelay, Value: "5s"},
			{Key: envelope.HeaderDeliverAt, Value: "2030-01-01T00:00:00Z"}, {Key: "x-trace", Value: "t"}}}
	e.reject(both, "both x-delay and x-deliver-at given; give one")
	before := time.Now()
	e.ok("retry", e.ops.RetryDead(e.ctx, "both", ops.RetryRequest{}))
	info := e.stored("both")
	m := info.Message
	if info.State != store.StateScheduled || info.Attempts != 0 || m.Destination != "fired.eu.oc" || m.Sink != "nats" ||
		!slices.Equal(m.Headers, envelope.Headers{{Key: "x-trace", Value: "t"}}) {
		e.t.Errorf("retried: %s %+v", info.State, m)
	}
	if m.DueAt.Before(before.Add(-time.Second)) || time.Since(m.DueAt) > 5*time.Second || !info.NextAt.Equal(m.DueAt) {
		e.t.Errorf("retried message due %v (next attempt %v), want the retry's time", m.DueAt, info.NextAt)
	}
	if !e.wasWoken("both") {
		e.t.Error("the scheduler was not woken for the retried message")
	}
	e.refused("retry again", e.ops.RetryDead(e.ctx, "both", ops.RetryRequest{}), ops.ErrNotFound, "", "no dead message")

	// A destination the route does not allow: refused until one is given.
	far := msg("far", now)
	far.Headers = envelope.Headers{{Key: envelope.HeaderDelay, Value: "1s"}, {Key: envelope.HeaderDestination, Value: "billing.expired"}}
	e.reject(far, `x-delay-destination "billing.expired" matches no pattern of route.allowed_destinations`)
	e.refused("retry without a destination", e.ops.RetryDead(e.ctx, "far", ops.RetryRequest{}), ops.ErrConflict, "",
		"route.allowed_destinations", "retry it with a valid sink or destination")
	e.refused("retry to another lane", e.ops.RetryDead(e.ctx, "far", ops.RetryRequest{Destination: "billing.other"}), ops.ErrInvalid,
		"destination", "route.allowed_destinations")
	e.ok("retry with a destination", e.ops.RetryDead(e.ctx, "far", ops.RetryRequest{Destination: "orders.late"}))
	if m := e.stored("far").Message; m.Destination != "orders.late" || m.Sink != "rabbit" {
		e.t.Errorf("retried to %s -> %s", m.Sink, m.Destination)
	}

	// A rule the message still breaks.
	prio := msg("prio", now)
	prio.Headers = envelope.Headers{{Key: envelope.HeaderDelay, Value: "1s"}, {Key: envelope.HeaderPriority, Value: "high"}}
	e.reject(prio, `x-delay-priority "high" is not an integer from 0 to 9`)
	e.refused("retry of a bad priority", e.ops.RetryDead(e.ctx, "prio", ops.RetryRequest{}), ops.ErrConflict, "", "x-delay-priority", "still refused")
	if e.stored("prio").State != store.StateDead {
		e.t.Error("a refused retry changed the message")
	}
	e.refused("retry to an unknown sink", e.ops.RetryDead(e.ctx, "prio", ops.RetryRequest{Sink: "nope"}), ops.ErrInvalid, "sink", `"nope"`)
}

// retryDiedAtSink: a message that died for its destination is retried only
// with one given; one that died for another reason keeps its destination;
// both are due now.
func retryDiedAtSink(e *env) {
	unroutable := msg("unroutable", time.Now())
	e.dieAtSink(unroutable, `publish failed 5 times, last: rabbitmq sink rabbit: unroutable: exchange "" has no queue bound for routing key "orders.expired" (returned 312 NO_ROUTE)`)
	e.refused("retry without a destination", e.ops.RetryDead(e.ctx, "unroutable", ops.RetryRequest{}), ops.ErrConflict, "",
		"broker refused", "NO_ROUTE")
	e.refused("retry to a reserved subject", e.ops.RetryDead(e.ctx, "unroutable", ops.RetryRequest{Sink: "nats", Destination: "$KV.orders.x"}),
		ops.ErrInvalid, "destination", "$")
	before := time.Now()
	e.ok("retry with a destination", e.ops.RetryDead(e.ctx, "unroutable", ops.RetryRequest{Destination: "orders.retried"}))
	info := e.stored("unroutable")
	if info.State != store.StateScheduled || info.Attempts != 0 || info.Message.Destination != "orders.retried" ||
		info.Message.DueAt.Before(before.Add(-time.Second)) || time.Since(info.Message.DueAt) > 5*time.Second {
		e.t.Errorf("retried: %s attempts %d %+v", info.State, info.Attempts, info.Message)
	}

	// Its sink is not configured (any more).
	lost := msg("lost", time.Now())
	lost.Sink = "old-rabbit"
	e.dieAtSink(lost, `sink "old-rabbit" is not configured`)
	e.refused("retry to an unconfigured sink", e.ops.RetryDead(e.ctx, "lost", ops.RetryRequest{}), ops.ErrConflict, "", "not configured")
	e.ok("retry with a sink", e.ops.RetryDead(e.ctx, "lost", ops.RetryRequest{Sink: "rabbit"}))
	if m := e.stored("lost").Message; m.Sink != "rabbit" || m.Destination != "orders.expired" {
		e.t.Errorf("retried to %s -> %s", m.Sink, m.Destination)
	}

	// Late, not its destination's fault: retried as it was, due now.
	late := msg("late", time.Now())
	late.Recur = &envelope.Recurrence{Every: time.Hour, Anchor: time.Now().Add(-time.Hour).Truncate(time.Millisecond), N: 2}
	e.dieAtSink(late, "late: due 2026-12-01T10:00:00Z, claimed 2026-12-01T10:05:00Z, more than scheduler.max_lateness 1m0s after (late_policy dead)")
	e.ok("retry of a late one", e.ops.RetryDead(e.ctx, "late", ops.RetryRequest{}))
	m := e.stored("late").Message
	if m.Destination != "orders.expired" || m.Recur == nil || m.Recur.N != 2 || time.Since(m.DueAt) > 5*time.Second {
		e.t.Errorf("retried late one: %+v", m)
	}
	e.refused("retry of a parked one", e.ops.RetryDead(e.ctx, "late", ops.RetryRequest{}), ops.ErrNotFound, "")
}

// retryPastMaxSeries: a dead recurring message is a new series when
// retried: with limits.max_series (one, for the whole store) held by
// another series, on any shard, it is a conflict with the reason and stays
// dead; once that series is cancelled, the retry goes through.
func retryPastMaxSeries(e *env) {
	e.open(1)
	recurring := func(id string) *envelope.Message {
		m := msg(id, time.Now())
		m.Recur = &envelope.Recurrence{Every: time.Hour, Anchor: time.Now().Add(-time.Hour).Truncate(time.Millisecond), N: 2}
		return m
	}
	e.dieAtSink(recurring("tick"), "late: due 2026-12-01T10:00:00Z, claimed 2026-12-01T10:05:00Z, more than scheduler.max_lateness 1m0s after (late_policy dead)")
	other := "tock"
	for i := 0; e.store.ShardOf(other) == e.store.ShardOf("tick"); i++ {
		other = fmt.Sprintf("tock-%d", i) // another shard's
	}
	e.park(recurring(other)) // the store's one series
	e.refused("retry past max_series", e.ops.RetryDead(e.ctx, "tick", ops.RetryRequest{}), ops.ErrConflict, "", "limits.max_series")
	if e.stored("tick").State != store.StateDead {
		e.t.Error("a retry refused for max_series changed the message")
	}
	e.ok("cancel the other series", e.ops.Cancel(e.ctx, other))
	e.ok("retry", e.ops.RetryDead(e.ctx, "tick", ops.RetryRequest{}))
	if info := e.stored("tick"); info.State != store.StateScheduled || info.Message.Recur == nil {
		e.t.Errorf("retried: %s %+v", info.State, info.Message)
	}
}

// groups: a group's size and messages; cancelling it; an empty group is
// not found.
func groups(e *env) {
	now := time.Now()
	for i := range 3 {
		m := msg(fmt.Sprintf("g%d", i), now.Add(time.Duration(i+1)*time.Hour))
		m.Group = "order/9"
		e.park(m)
	}
	e.park(msg("other", now.Add(time.Hour)))
	g, err := e.ops.Group(e.ctx, "order/9", ops.ListQuery{Limit: intp(2)})
	e.ok("group", err)
	if g.Group != "order/9" || g.Count != 3 || len(g.Messages) != 2 || g.NextCursor == nil || g.Messages[0].Group != "order/9" {
		e.t.Errorf("group: %+v", g)
	}
	c, err := e.ops.CancelGroup(e.ctx, "order/9")
	e.ok("cancel group", err)
	if c.Cancelled != 3 || c.Group != "order/9" {
		e.t.Errorf("cancel group: %+v", c)
	}
	_, err = e.ops.Group(e.ctx, "order/9", ops.ListQuery{})
	e.refused("empty group", err, ops.ErrNotFound, "", "no message is filed under group")
	_, err = e.ops.CancelGroup(e.ctx, "order/9")
	e.refused("cancel an empty group", err, ops.ErrNotFound, "")
	if _, err := e.store.Inspect(e.ctx, "other"); err != nil {
		e.t.Errorf("a message of no group was cancelled: %v", err)
	}
}

// sinksCase: the sinks with what the daemon knows; pause and resume kept in
// Redis; an unknown sink is not found.
func sinksCase(e *env) {
	views, err := e.ops.Sinks(e.ctx)
	e.ok("sinks", err)
	if len(views) != 3 || views[0].Name != "kafka" || views[0].MaxRate != 50 || views[2].Name != "rabbit" || views[2].Rate == nil || *views[2].Rate != 2 {
		e.t.Errorf("sinks: %+v", views)
	}
	v, err := e.ops.SetPaused(e.ctx, "rabbit", true)
	e.ok("pause", err)
	if !v.Paused || v.Status != "pausing" { // paused in Redis; this daemon applies it at its refresh
		e.t.Errorf("paused: %+v", v)
	}
	if states, _ := e.store.SinkStates(e.ctx, nil); !states["rabbit"].Paused {
		e.t.Error("not paused in Redis")
	}
	v, err = e.ops.SetPaused(e.ctx, "rabbit", false)
	e.ok("resume", err)
	if v.Paused || v.Status != "ready" {
		e.t.Errorf("resumed: %+v", v)
	}
	one, err := e.ops.Sink(e.ctx, "kafka")
	e.ok("sink", err)
	if one.Name != "kafka" || one.Ready == nil || !*one.Ready {
		e.t.Errorf("sink: %+v", one)
	}
	_, err = e.ops.SetPaused(e.ctx, "nope", true)
	e.refused("pause an unknown sink", err, ops.ErrNotFound, "", "no sink", "kafka, nats, rabbit")
	_, err = e.ops.Sink(e.ctx, "nope")
	e.refused("an unknown sink", err, ops.ErrNotFound, "")
}
