package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// send calls the admin API with a JSON body and decodes a 2xx answer into
// v (when non-nil).
func (d *daemon) send(method, path, body string, v any) (int, string) {
	d.t.Helper()
	req, err := http.NewRequest(method, d.admin+path, strings.NewReader(body))
	if err != nil {
		d.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if v != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(b, v); err != nil {
			d.t.Fatalf("%s %s: %v in %s", method, path, err, b)
		}
	}
	return resp.StatusCode, string(b)
}

type messageView struct {
	ID         string `json:"id"`
	State      string `json:"state"`
	DueAt      string `json:"due_at"`
	Group      string `json:"group"`
	Held       bool   `json:"held"`
	Recurrence *struct {
		Schedule   string `json:"schedule"`
		Occurrence int    `json:"occurrence"`
		NextAt     string `json:"next_at"`
		Count      int    `json:"count"`
	} `json:"recurrence"`
}

// listAll pages through GET /v1/messages?query.
func (d *daemon) listAll(query string) []messageView {
	d.t.Helper()
	q, _ := url.ParseQuery(query)
	var out []messageView
	for range 10000 {
		var page struct {
			Messages   []messageView `json:"messages"`
			NextCursor *string       `json:"next_cursor"`
		}
		if code, body := d.get("/v1/messages?"+q.Encode(), &page); code != http.StatusOK {
			d.t.Fatalf("list: %d %s", code, body)
		}
		out = append(out, page.Messages...)
		if page.NextCursor == nil {
			return out
		}
		q.Set("cursor", *page.NextCursor)
	}
	d.t.Fatal("the listing does not end")
	return nil
}

// TestRecurringEndToEnd: a series by
// x-delay-every and x-delay-count fires its occurrences on the schedule,
// numbered, inspect shows the schedule, the next time and the occurrence;
// cancel ends a series; schedules that cannot work are dead with a clear
// reason.
func TestRecurringEndToEnd(t *testing.T) {
	e := newNATSEnv(t, "", "")
	e.publish("delayed.r", []byte("r"), "x-message-id", "three", "x-delay", "300", "x-delay-every", "1s", "x-delay-count", "3")
	e.publish("delayed.r", []byte("r"), "x-message-id", "endless", "x-delay", "300", "x-delay-every", "1s")
	e.waitFired(10*time.Second, "three", "endless")

	// Inspect between occurrences: the second is parked.
	var v messageView
	testenv.Eventually(t, 5*time.Second, func() bool {
		code, _ := e.d.get("/v1/messages/three", &v)
		return code == http.StatusOK && v.Recurrence != nil && v.Recurrence.Occurrence == 2
	}, "occurrence 2 not parked")
	if r := v.Recurrence; r.Schedule != "every 1s, 3 times" || r.NextAt != v.DueAt || r.Count != 3 {
		t.Fatalf("inspect: %+v %+v", v, r)
	}
	if ids := e.d.listAll("recurring=true"); len(ids) != 2 {
		t.Fatalf("recurring listing: %+v", ids)
	}
	// Cancel ends the endless series: nothing of it is left to fire.
	// (409 while an occurrence is being published: again, as Retry-After says.)
	testenv.Eventually(t, 10*time.Second, func() bool {
		code, body := e.d.do(http.MethodDelete, "/v1/messages/endless", nil)
		if code != http.StatusNoContent && code != http.StatusConflict {
			t.Fatalf("cancel: %d %s", code, body)
		}
		return code == http.StatusNoContent
	}, "the series stayed in flight")
	cancelledAfter := len(e.firedCopies("endless"))

	// The three occurrences, numbered, each exactly 1 s after the previous.
	testenv.Eventually(t, 10*time.Second, func() bool { return len(e.firedCopies("three")) == 3 }, "three occurrences")
	copies := e.firedCopies("three")
	first := copies[0].due
	for i, c := range copies {
		if n := c.headers.Get(envelope.HeaderOccurrence); n != strconv.Itoa(i+1) {
			t.Fatalf("copy %d has occurrence %q", i, n)
		}
		if want := first.Add(time.Duration(i) * time.Second); !c.due.Equal(want) {
			t.Fatalf("occurrence %d due %v, want %v (no drift)", i+1, c.due, want)
		}
		if c.at.Before(c.due) {
			t.Fatalf("occurrence %d published %v before its due time %v", i+1, c.at, c.due)
		}
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		code, _ := e.d.get("/v1/messages/three", nil)
		return code == http.StatusNotFound
	}, "the series did not end after its count")
	if code, _ := e.d.get("/v1/messages/endless", nil); code != http.StatusNotFound {
		t.Fatalf("cancelled series still known: %d", code)
	}
	if n := len(e.firedCopies("endless")); n > cancelledAfter+1 { // one may have been in flight
		t.Fatalf("the cancelled series fired %d times after the cancel", n-cancelledAfter)
	}

	// Bad schedules: dead, each with its reason.
	bad := map[string][]string{
		"cron-never":   {"x-delay-cron", "0 0 30 2 *"},
		"every-0s":     {"x-delay-every", "0s"},
		"count-0":      {"x-delay-every", "1m", "x-delay-count", "0"},
		"count-neg":    {"x-delay-every", "1m", "x-delay-count", "-2"},
		"until-before": {"x-delay-every", "1h", "x-delay", "2h", "x-delay-until", time.Now().Add(time.Hour).UTC().Format(time.RFC3339)},
		"cron-and-tz":  {"x-delay-cron", "0 9 * * *", "x-delay-timezone", "Mars/Olympus"},
	}
	reasons := map[string]string{
		"cron-never": "never fires", "every-0s": "shorter than limits.min_interval 1s", "count-0": "at least 1", "count-neg": "at least 1",
		"until-before": "before the first occurrence", "cron-and-tz": "not an IANA time zone",
	}
	for id, h := range bad {
		e.publish("delayed.r", nil, append([]string{"x-message-id", id}, h...)...)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		got := map[string]string{}
		for _, d := range e.d.dead() {
			got[d.ID] = d.Reason
		}
		for id, want := range reasons {
			if !strings.Contains(got[id], want) {
				return false
			}
		}
		return true
	}, "bad schedules not dead with their reasons: %v", lazyDeadOf(e.d))
}

type lazyDead func() string

func (l lazyDead) String() string { return l() }

func lazyDeadOf(d *daemon) lazyDead {
	return func() string { return fmt.Sprint(d.dead()) }
}

// TestRescheduleFireEndToEnd through the real
// binary: a reschedule into the past and a fire now deliver at once, a
// compare-and-set reschedule delivers at its new time, limits and altered
// cursors are refused, and the forecast gauges agree with /v1/stats.
func TestRescheduleFireEndToEnd(t *testing.T) {
	e := newNATSEnv(t, "", "")
	for _, id := range []string{"past", "fire", "moved", "stays"} {
		e.publish("delayed.f", []byte(id), "x-message-id", id, "x-delay", "1h")
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return e.d.stats().Parked == 4 }, "not parked")

	start := time.Now()
	if code, body := e.d.send(http.MethodPatch, "/v1/messages/past", `{"deliver_at":"2001-01-01T00:00:00Z"}`, nil); code != http.StatusOK {
		t.Fatalf("PATCH into the past: %d %s", code, body)
	}
	if code, body := e.d.send(http.MethodPost, "/v1/messages/fire/fire", "", nil); code != http.StatusNoContent {
		t.Fatalf("fire: %d %s", code, body)
	}
	var v messageView
	e.d.get("/v1/messages/moved", &v)
	var moved struct {
		DueAt string `json:"due_at"`
	}
	if code, body := e.d.send(http.MethodPatch, "/v1/messages/moved", fmt.Sprintf(`{"delay":700,"if_due_at":%q}`, v.DueAt), &moved); code != http.StatusOK {
		t.Fatalf("PATCH with if_due_at: %d %s", code, body)
	}
	if code, body := e.d.send(http.MethodPatch, "/v1/messages/moved", fmt.Sprintf(`{"delay":700,"if_due_at":%q}`, v.DueAt), nil); code != http.StatusConflict || !strings.Contains(body, moved.DueAt) {
		t.Fatalf("stale if_due_at: %d %s", code, body)
	}
	e.waitFired(5*time.Second, "past", "fire")
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("fired %v after the request, want about at once", d)
	}
	e.waitFired(5*time.Second, "moved")
	c := e.firedCopies("moved")[0]
	if want, _ := time.Parse(time.RFC3339Nano, moved.DueAt); !c.due.Equal(want) || c.at.Before(want) {
		t.Fatalf("moved fired at %v with due %v, want due %v", c.at, c.due, want)
	}
	// Refused, clearly.
	for _, bad := range []struct{ method, path, body, want string }{
		{http.MethodPatch, "/v1/messages/stays", `{"delay":"9000h"}`, "limits.max_delay"},
		{http.MethodPatch, "/v1/messages/stays", `{"delay":"-1s"}`, "negative"},
		{http.MethodPatch, "/v1/messages/past", `{"delay":"1s"}`, "no message with ID"},
		{http.MethodGet, "/v1/messages?cursor=AQJCeW91LWhhdmUtYmVlbi1wd25lZA", "", "cursor"},
		{http.MethodPost, "/v1/sinks/nope/pause", "", "is configured; the sinks are: out"},
	} {
		code, body := e.d.send(bad.method, bad.path, bad.body, nil)
		if code < 400 || code >= 500 || !strings.Contains(body, bad.want) {
			t.Errorf("%s %s %s: %d %s, want 4xx with %q", bad.method, bad.path, bad.body, code, body, bad.want)
		}
	}
	if len(e.firedCopies("stays")) != 0 {
		t.Fatal("a refused reschedule fired the message")
	}

	// The forecast: /v1/stats and the gauges of the same scrape's Stats.
	var st struct {
		Forecast map[string]int64 `json:"forecast"`
		Held     int64            `json:"held"`
	}
	if code, body := e.d.get("/v1/stats", &st); code != http.StatusOK {
		t.Fatalf("stats: %d %s", code, body)
	}
	if st.Forecast["1h"] != 1 || st.Forecast["1m"] != 0 || st.Forecast["24h"] != 1 || st.Forecast["later"] != 0 {
		t.Fatalf("forecast %v, want the one message due within the hour", st.Forecast)
	}
	fams := e.d.metrics()
	for w, n := range st.Forecast {
		if got, ok := metricValue(fams, "delaybridge_forecast_messages", map[string]string{"window": w}); !ok || int64(got) != n {
			t.Errorf("delaybridge_forecast_messages{window=%q} = %v (%v), /v1/stats %d", w, got, ok, n)
		}
	}
	if got, ok := metricValue(fams, "delaybridge_held_messages", nil); !ok || got != 0 {
		t.Errorf("delaybridge_held_messages = %v (%v)", got, ok)
	}
}

// clusterNATSConfig is a daemon on a Redis Cluster with a NATS ingest and
// sink.
const clusterNATSConfig = `
redis: {addrs: ["%s"], cluster: true, key_prefix: ops}
admin: {listen: "%%ADMIN%%"}
scheduler: {max_sleep: 250ms}
ingest:
  - name: in
    nats: {url: "%s", subject: "delayed.>", stream: DELAYED}
    route: {sink: out, destination: fired.x}
sinks:
  - name: out
    nats: {url: "%s", jetstream: true}
`

// TestGroupsAndBrowseOnCluster runs the daemon on
// a 3-master Redis Cluster, where a group's messages and a listing's shards
// live on different masters: x-delay-group files them, the listing pages
// through them in due order, GET /v1/groups counts them, a control message
// cancels one group and DELETE /v1/groups another.
func TestGroupsAndBrowseOnCluster(t *testing.T) {
	cluster := testenv.RedisCluster(t, 3)
	ns := testenv.NATS(t)
	nc, err := nats.Connect(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	for name, subj := range map[string]string{"DELAYED": "delayed.>", "FIRED": "fired.>"} {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subj}}); err != nil {
			t.Fatal(err)
		}
	}
	d := startDaemon(t, fmt.Sprintf(clusterNATSConfig, strings.Join(cluster.Addrs, `", "`), ns.URL, ns.URL))
	publish := func(id string, headers ...string) {
		m := nats.NewMsg("delayed.x")
		m.Header.Set("x-message-id", id)
		for i := 0; i+1 < len(headers); i += 2 {
			m.Header.Set(headers[i], headers[i+1])
		}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	base := time.Now().Add(2 * time.Hour).Truncate(time.Second)
	type parked struct {
		at time.Time
		id string
	}
	var want []parked
	for i := range 300 {
		id := fmt.Sprintf("o-%03d", i)
		group := []string{"order-1", "order-2", "order-3"}[i%3]
		at := base.Add(time.Duration((i*7919)%600) * time.Second)
		publish(id, "x-deliver-at", at.UTC().Format(time.RFC3339), "x-delay-group", group)
		want = append(want, parked{at, id})
	}
	testenv.Eventually(t, 15*time.Second, func() bool { return d.stats().Parked == 300 }, "not parked")

	// The listing: every message once, in due order, then ID.
	sort.Slice(want, func(i, j int) bool {
		if !want[i].at.Equal(want[j].at) {
			return want[i].at.Before(want[j].at)
		}
		return want[i].id < want[j].id
	})
	var wantIDs []string
	for _, p := range want {
		wantIDs = append(wantIDs, p.id)
	}
	var got []string
	for _, m := range d.listAll("limit=37") {
		got = append(got, m.ID)
	}
	if !slices.Equal(got, wantIDs) {
		t.Fatalf("listing on the cluster:\n got %v\nwant %v", got, wantIDs)
	}
	var g1 []string
	for _, m := range d.listAll("group=order-1&limit=10") {
		if m.Group != "order-1" {
			t.Fatalf("group filter listed %+v", m)
		}
		g1 = append(g1, m.ID)
	}
	if len(g1) != 100 {
		t.Fatalf("group order-1 lists %d", len(g1))
	}
	var group struct {
		Count int `json:"count"`
	}
	if code, body := d.get("/v1/groups/order-1", &group); code != http.StatusOK || group.Count != 100 {
		t.Fatalf("GET group: %d %s", code, body)
	}

	// Cancel by control message, then by the API.
	publish("cancel-1", "x-delay-cancel-group", "order-1")
	testenv.Eventually(t, 10*time.Second, func() bool { return d.stats().Parked == 200 }, "group order-1 not cancelled")
	if code, _ := d.get("/v1/groups/order-1", nil); code != http.StatusNotFound {
		t.Fatalf("cancelled group still answers %d", code)
	}
	var cancelled struct {
		Cancelled int `json:"cancelled"`
	}
	if code, body := d.send(http.MethodDelete, "/v1/groups/order-2", "", &cancelled); code != http.StatusOK || cancelled.Cancelled != 100 {
		t.Fatalf("DELETE group: %d %s", code, body)
	}
	if s := d.stats(); s.Parked != 100 {
		t.Fatalf("parked %d, want the 100 of order-3", s.Parked)
	}
	for _, m := range d.listAll("limit=1000") {
		if m.Group != "order-3" {
			t.Fatalf("after the cancels the listing has %+v", m)
		}
	}
}

// TestPauseHoldsForEveryInstanceAndRestart: a pause
// made through one instance stops the others firing too, survives a
// restart, shows the held messages as due, and resume delivers them.
func TestPauseHoldsForEveryInstanceAndRestart(t *testing.T) {
	e := newNATSEnv(t, "", "")
	b := startDaemon(t, e.config(""))
	type sinkView struct {
		Name   string `json:"name"`
		Status string `json:"status"`
		Ready  *bool  `json:"ready"`
		Paused bool   `json:"paused"`
		Due    int64  `json:"due"`
	}
	sinkOf := func(d *daemon) sinkView {
		var vs []sinkView
		if code, body := d.get("/v1/sinks", &vs); code != http.StatusOK || len(vs) != 1 {
			t.Fatalf("GET /v1/sinks: %d %s", code, body)
		}
		return vs[0]
	}
	if s := sinkOf(b); s.Status != "ready" || s.Ready == nil || !*s.Ready || s.Paused {
		t.Fatalf("before the pause: %+v", s)
	}
	if code, body := e.d.send(http.MethodPost, "/v1/sinks/out/pause", "", nil); code != http.StatusOK {
		t.Fatalf("pause: %d %s", code, body)
	}
	// The other instance applies it within its refresh interval.
	testenv.Eventually(t, 5*time.Second, func() bool { return sinkOf(b).Status == "paused" }, "the other instance does not apply the pause")
	var ids []string
	for i := range 20 {
		id := fmt.Sprintf("p-%02d", i)
		ids = append(ids, id)
		e.publish("delayed.p", []byte(id), "x-message-id", id, "x-delay", "0")
	}
	// Both instances hold them (whichever claims): due, waiting for the sink.
	testenv.Eventually(t, 10*time.Second, func() bool { return sinkOf(b).Due == 20 }, "the messages are not held: %v", lazySink(func() any { return sinkOf(b) }))
	if s := sinkOf(b); !s.Paused || s.Status != "paused" {
		t.Fatalf("the other instance: %+v", s)
	}
	b.stop()
	b.start()
	if s := sinkOf(b); !s.Paused || s.Due != 20 {
		t.Fatalf("after a restart: %+v", s)
	}
	e.mu.Lock()
	fired := len(e.fired)
	e.mu.Unlock()
	if fired != 0 {
		t.Fatalf("%d messages fired to a paused sink", fired)
	}
	if code, body := b.send(http.MethodPost, "/v1/sinks/out/resume", "", nil); code != http.StatusOK {
		t.Fatalf("resume: %d %s", code, body)
	}
	e.waitFired(10*time.Second, ids...)
	testenv.Eventually(t, 5*time.Second, func() bool {
		s := sinkOf(e.d)
		return !s.Paused && s.Due == 0 && s.Status == "ready"
	}, "the first instance does not see the resume: %v", lazySink(func() any { return sinkOf(e.d) }))
}

type lazySink func() any

func (l lazySink) String() string { return fmt.Sprint(l()) }

// TestMaxRateSharedByThreeDaemons: three daemons on one
// Redis release ~3,000 due messages to a NATS sink with max_rate 500 at
// about 500/s together, as the consumer measures it, not 1,500/s.
func TestMaxRateSharedByThreeDaemons(t *testing.T) {
	e := newNATSEnv(t, "", "")
	cfg := strings.Replace(e.config(""), "jetstream: true}", "jetstream: true}\n    max_rate: 500", 1)
	e.d.stop()
	ds := []*daemon{startDaemon(t, cfg), startDaemon(t, cfg), startDaemon(t, cfg)}

	const n = 3000
	var msgs []*envelope.Message
	now := time.Now().Truncate(time.Millisecond)
	for i := range n {
		msgs = append(msgs, &envelope.Message{ID: fmt.Sprintf("rate-%04d", i), DueAt: now, Sink: "out", Destination: "fired.rate", Body: []byte("r")})
	}
	st := store.New(e.redis.Client(), store.Options{Prefix: "e2e", Shards: 16})
	if _, err := st.Park(context.Background(), msgs); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return len(e.fired) == n
	}, "not every message fired")
	var at []time.Time
	e.mu.Lock()
	for _, cs := range e.fired {
		for _, c := range cs {
			at = append(at, c.at)
		}
	}
	e.mu.Unlock()
	sort.Slice(at, func(i, j int) bool { return at[i].Before(at[j]) })
	// The rate between the 10th and the 90th percentile of arrivals leaves
	// out the start (one slot's burst) and the tail.
	lo, hi := n/10, 9*n/10
	rate := float64(hi-lo) / at[hi].Sub(at[lo]).Seconds()
	total := float64(len(at)-1) / at[len(at)-1].Sub(at[0]).Seconds()
	var published []float64
	for _, d := range ds {
		v, _ := metricValue(d.metrics(), "delaybridge_sink_published_total", map[string]string{"sink": "out"})
		published = append(published, v)
	}
	t.Logf("3 daemons, max_rate 500: %d messages released at %.0f/s (middle 80%%), %.0f/s overall over %v; published per daemon %v",
		len(at), rate, total, at[len(at)-1].Sub(at[0]).Round(time.Millisecond), published)
	if rate < 350 || rate > 650 {
		t.Fatalf("released at %.0f/s, want about 500/s shared by the three", rate)
	}
	for i, p := range published {
		if p == 0 {
			t.Errorf("daemon %d published nothing: the limit was not shared but taken by one", i)
		}
	}
}

// A restart with another max_rate reaches the messages already waiting for
// a slot of the old one, and the instances still running the old value
// follow it: 20 messages due at once at 0.1/s have slots over 190 s; one
// of two daemons restarted at 1000/s, they are all published within
// seconds, where the old slots (or the other daemon, giving new ones at
// its 0.1/s) would have held them for minutes.
func TestNewMaxRateReachesTheWaiting(t *testing.T) {
	e := newNATSEnv(t, "", "")
	withRate := func(r string) string {
		return strings.Replace(e.config(""), "jetstream: true}", "jetstream: true}\n    max_rate: "+r, 1)
	}
	e.d.stop()
	slow := startDaemon(t, withRate("0.1"))
	other := startDaemon(t, withRate("0.1"))
	defer other.stop()

	const n = 20
	var msgs []*envelope.Message
	now := time.Now().Truncate(time.Millisecond)
	for i := range n {
		msgs = append(msgs, &envelope.Message{ID: fmt.Sprintf("slow-%02d", i), DueAt: now, Sink: "out", Destination: "fired.rate", Body: []byte("r")})
	}
	st := store.New(e.redis.Client(), store.Options{Prefix: "e2e", Shards: 16})
	if _, err := st.Park(context.Background(), msgs); err != nil {
		t.Fatal(err)
	}
	fired := func() int {
		e.mu.Lock()
		defer e.mu.Unlock()
		return len(e.fired)
	}
	// Every message claimed: the first published, the others waiting for
	// slots 10 s apart.
	testenv.Eventually(t, 30*time.Second, func() bool {
		page, err := st.Browse(context.Background(), store.BrowseQuery{})
		return err == nil && fired() >= 1 && len(page.Messages)+fired() == n && slotted(t, page) == len(page.Messages)
	}, "the messages did not all get slots at 0.1/s")
	slow.stop()
	restarted := time.Now()
	startDaemon(t, withRate("1000"))
	testenv.Eventually(t, 60*time.Second, func() bool { return fired() == n },
		"the messages kept the slots of the previous max_rate (0.1/s: up to 190 s)")
	t.Logf("all %d published %v after one of two daemons restarted at 1000/s", n, time.Since(restarted).Round(time.Millisecond))
	var sinks []map[string]any
	if code, body := other.get("/v1/sinks", &sinks); code != 200 || len(sinks) != 1 || sinks[0]["max_rate"] != 1000.0 {
		t.Fatalf("the daemon started at 0.1/s shows max_rate %v (%d %s), want the 1000 in force", sinks, code, body)
	}
}

// slotted counts the messages of a page that wait for a max_rate slot: due,
// their next attempt later than their due time.
func slotted(t *testing.T, page *store.Page) (n int) {
	t.Helper()
	for _, m := range page.Messages {
		if m.State == store.StateScheduled && m.Message != nil && m.NextAt.After(m.Message.DueAt) {
			n++
		}
	}
	return n
}
