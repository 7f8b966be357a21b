package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ops"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// parkAt parks messages due at the given times through the store and
// fails unless each is parked.
func (e *env) parkAt(ms ...*envelope.Message) {
	e.t.Helper()
	res, err := e.store.Park(context.Background(), ms)
	if err != nil {
		e.t.Fatal(err)
	}
	for i, r := range res {
		if r != store.Parked {
			e.t.Fatalf("%s not parked: %v", ms[i].ID, r)
		}
	}
}

func testMsg(id string, due time.Time) *envelope.Message {
	return &envelope.Message{ID: id, DueAt: due.Truncate(time.Millisecond), Sink: "rabbit", Destination: "q." + id,
		Body: []byte("body " + id), Ingest: "orders-in", IngestedAt: time.Now().Truncate(time.Millisecond)}
}

func (e *env) dueAt(id string) time.Time {
	e.t.Helper()
	info, err := e.store.Inspect(context.Background(), id)
	if err != nil {
		e.t.Fatalf("inspect %s: %v", id, err)
	}
	return info.Message.DueAt
}

// PATCH /v1/messages/{id}: the new due time by delay or deliver_at, with
// the rules of ingest; if_due_at compares and sets; a time that passed
// fires now; beyond max_delay, unknown, in flight and dead are refused.
func TestReschedule(t *testing.T) {
	e := newEnv(t, withLimits(envelope.Limits{MaxDelay: 24 * time.Hour}))
	now := time.Now()
	e.parkAt(testMsg("r1", now.Add(time.Hour)), testMsg("r/2", now.Add(time.Hour)))

	// By delay: due that much from now.
	r := e.do("PATCH", "/v1/messages/r1", `{"delay":"30m"}`)
	e.expect(r, http.StatusOK)
	got := mustTime(t, r.json(t)["due_at"])
	if d := got.Sub(now); d < 30*time.Minute || d > 30*time.Minute+5*time.Second {
		t.Fatalf("delay 30m set due_at %v, %v from now", got, d)
	}
	if !e.dueAt("r1").Equal(got) {
		t.Fatalf("Redis has %v, the answer %v", e.dueAt("r1"), got)
	}
	// By deliver_at, RFC 3339 or epoch ms; an ID with a slash.
	at := now.Add(2 * time.Hour).Truncate(time.Millisecond).UTC()
	for _, body := range []string{`{"deliver_at":"` + at.Format(time.RFC3339Nano) + `"}`, fmt.Sprintf(`{"deliver_at":%d}`, at.UnixMilli())} {
		r = e.do("PATCH", "/v1/messages/r%2F2", body)
		e.expect(r, http.StatusOK)
		if got := mustTime(t, r.json(t)["due_at"]); !got.Equal(at) || !e.dueAt("r/2").Equal(at) {
			t.Fatalf("%s: due_at %v, Redis %v, want %v", body, got, e.dueAt("r/2"), at)
		}
	}
	// if_due_at: a stale one is refused with the due time the message has.
	stale := at.Add(-time.Minute)
	r = e.do("PATCH", "/v1/messages/r%2F2", fmt.Sprintf(`{"delay":"1h","if_due_at":%q}`, stale.Format(time.RFC3339Nano)))
	e.expect(r, http.StatusConflict)
	if cur := mustTime(t, r.json(t)["due_at"]); !cur.Equal(at) || !strings.Contains(r.errorText(t), "changed meanwhile") {
		t.Fatalf("conflict answer: %s", r.body)
	}
	if !e.dueAt("r/2").Equal(at) {
		t.Fatal("a refused compare-and-set changed the due time")
	}
	r = e.do("PATCH", "/v1/messages/r%2F2", fmt.Sprintf(`{"delay":"1h","if_due_at":%d}`, at.UnixMilli()))
	e.expect(r, http.StatusOK)
	// Into the past: due now, by Redis's clock.
	r = e.do("PATCH", "/v1/messages/r1", `{"deliver_at":"2001-01-01T00:00:00Z"}`)
	e.expect(r, http.StatusOK)
	if got := mustTime(t, r.json(t)["due_at"]); r.json(t)["now"] != true || time.Since(got) > 5*time.Second || time.Until(got) > time.Second {
		t.Fatalf("into the past: %s", r.body)
	}
	if st, _ := e.store.Stats(context.Background()); st.Due != 1 {
		t.Fatalf("due %d after a reschedule into the past, want 1", st.Due)
	}
	if notified := e.parkedIDs(); len(notified) != 5 {
		t.Errorf("the scheduler was notified %d times for 5 reschedules: %v", len(notified), notified)
	}

	// Refused, with a reason, nothing changed.
	before := e.dueAt("r/2")
	bad := []struct {
		body   string
		status int
		reason string
	}{
		{`{"delay":"25h"}`, 400, "limits.max_delay"},
		{`{"deliver_at":"2099-01-01T00:00:00Z"}`, 400, "limits.max_delay"},
		{`{"delay":"-5s"}`, 400, "delay \"-5s\" is negative"},
		{`{"delay":"soon"}`, 400, "delay \"soon\" is neither"},
		{`{"deliver_at":"tomorrow"}`, 400, "deliver_at \"tomorrow\""},
		{`{"delay":1000,"deliver_at":5}`, 400, "either delay or deliver_at"},
		{`{}`, 400, "delay or deliver_at is required"},
		{`{"delay":"1m","if_due_at":"yesterday"}`, 400, "if_due_at \"yesterday\""},
		{`{"delay":"1m","dealy":"2m"}`, 400, "unknown field \"dealy\""},
		{`{"delay":"1m","delay":"2m"}`, 400, "given twice"},
		{`{"Delay":"1m"}`, 400, "case-sensitive"},
		{`{"delay":true}`, 400, "delay must be an integer or a string"},
		{``, 400, "empty request body"},
	}
	for _, c := range bad {
		r := e.do("PATCH", "/v1/messages/r%2F2", c.body)
		if r.status != c.status || !strings.Contains(r.errorText(t), c.reason) {
			t.Errorf("PATCH %s: %d %s, want %d with %q", c.body, r.status, r.body, c.status, c.reason)
		}
	}
	if !e.dueAt("r/2").Equal(before) {
		t.Fatal("a refused PATCH changed the due time")
	}
	// Unknown, in flight, dead.
	r = e.do("PATCH", "/v1/messages/nope", `{"delay":"1m"}`)
	e.expect(r, http.StatusNotFound)
	e2 := newEnv(t)
	stateFixture(t, e2) // A, B in flight; C dead
	r = e2.do("PATCH", "/v1/messages/A", `{"delay":"1m"}`)
	if r.status != http.StatusConflict || !strings.Contains(r.errorText(t), "being published") {
		t.Fatalf("in flight: %d %s", r.status, r.body)
	}
	r = e2.do("PATCH", "/v1/messages/C", `{"delay":"1m"}`)
	if r.status != http.StatusConflict || !strings.Contains(r.errorText(t), "is dead") {
		t.Fatalf("dead: %d %s", r.status, r.body)
	}
}

// POST /v1/messages/{id}/fire makes a message due now; GET of an ID that
// ends in /fire still reads that message.
func TestFire(t *testing.T) {
	e := newEnv(t)
	e.parkAt(testMsg("f1", time.Now().Add(time.Hour)), testMsg("job/fire", time.Now().Add(time.Hour)))
	e.expect(e.do("POST", "/v1/messages/f1/fire", ""), http.StatusNoContent)
	if d := time.Since(e.dueAt("f1")); d < 0 || d > 5*time.Second {
		t.Fatalf("fired message due %v ago", d)
	}
	r := e.do("GET", "/v1/messages/job/fire", "")
	e.expect(r, http.StatusOK)
	if r.json(t)["id"] != "job/fire" {
		t.Fatalf("GET job/fire: %s", r.body)
	}
	e.expect(e.do("POST", "/v1/messages/job%2Ffire/fire", ""), http.StatusNoContent)
	e.expect(e.do("POST", "/v1/messages/nope/fire", ""), http.StatusNotFound)
	e2 := newEnv(t)
	stateFixture(t, e2)
	e2.expect(e2.do("POST", "/v1/messages/A/fire", ""), http.StatusConflict)
	e2.expect(e2.do("POST", "/v1/messages/C/fire", ""), http.StatusConflict)
	e2.expect(e2.do("POST", "/v1/messages/F", ""), http.StatusMethodNotAllowed)
}

type listAnswer struct {
	Messages []struct {
		ID    string `json:"id"`
		State string `json:"state"`
		DueAt string `json:"due_at"`
		Sink  string `json:"sink"`
		Group string `json:"group"`
		Held  bool   `json:"held"`
		Body  *string
	} `json:"messages"`
	NextCursor *string `json:"next_cursor"`
}

func (e *env) list(query string) listAnswer {
	e.t.Helper()
	r := e.do("GET", "/v1/messages?"+query, "")
	e.expect(r, http.StatusOK)
	var a listAnswer
	if err := json.Unmarshal(r.body, &a); err != nil {
		e.t.Fatalf("list: %v: %s", err, r.body)
	}
	return a
}

// listIDs pages through GET /v1/messages?query and returns the IDs.
func (e *env) listIDs(query string) []string {
	e.t.Helper()
	var ids []string
	q, _ := url.ParseQuery(query)
	for range 1000 {
		a := e.list(q.Encode())
		for _, m := range a.Messages {
			ids = append(ids, m.ID)
		}
		if a.NextCursor == nil {
			return ids
		}
		q.Set("cursor", *a.NextCursor)
	}
	e.t.Fatal("the listing does not end")
	return nil
}

// GET /v1/messages: in due order, paged by cursor, filtered; bad
// parameters and altered cursors are 400; bodies only with a token.
func TestList(t *testing.T) {
	e := newEnv(t, withToken(testToken))
	base := time.Now().Add(time.Hour).Truncate(time.Second)
	var want []string
	for i := range 25 {
		m := testMsg(fmt.Sprintf("l-%02d", i), base.Add(time.Duration(i)*time.Second))
		if i%5 == 0 {
			m.Group = "five"
		}
		if i%2 == 1 {
			m.Sink = "kafka"
		}
		e.parkAt(m)
		want = append(want, m.ID)
	}
	if got := e.listIDs("limit=4"); !slices.Equal(got, want) {
		t.Fatalf("listing %v, want %v", got, want)
	}
	a := e.list("limit=1000")
	if len(a.Messages) != 25 || a.NextCursor != nil || a.Messages[0].State != "scheduled" || a.Messages[0].Body != nil {
		t.Fatalf("one page: %+v", a)
	}
	if got := e.listIDs("sink=kafka&limit=3"); len(got) != 12 {
		t.Fatalf("sink=kafka: %v", got)
	}
	if got := e.listIDs("group=five"); !slices.Equal(got, []string{"l-00", "l-05", "l-10", "l-15", "l-20"}) {
		t.Fatalf("group=five: %v", got)
	}
	after, before := base.Add(10*time.Second).UTC().Format(time.RFC3339), base.Add(13*time.Second).UnixMilli()
	if got := e.listIDs(fmt.Sprintf("due_after=%s&due_before=%d", after, before)); !slices.Equal(got, want[10:13]) {
		t.Fatalf("range: %v", got)
	}
	if a := e.list("limit=2&body=true"); a.Messages[0].Body == nil || *a.Messages[0].Body != "body l-00" {
		t.Fatalf("body=true: %+v", a.Messages[0])
	}
	bad := []struct{ query, reason string }{
		{"limit=0", "limit 0"},
		{"limit=1001", "from 1 to 1000"},
		{"state=parked", "state \"parked\""},
		{"due_after=soon", "due_after \"soon\""},
		{"recurring=maybe", "recurring=\"maybe\""},
		{"statu=dead", "unknown query parameter \"statu\""},
		{"sink=a&sink=b", "given 2 times"},
		{"cursor=abc", "cursor: "},
		{"body=yes-please", "not a boolean"},
	}
	for _, c := range bad {
		r := e.do("GET", "/v1/messages?"+c.query, "")
		if r.status != http.StatusBadRequest || !strings.Contains(r.errorText(t), c.reason) {
			t.Errorf("?%s: %d %s, want 400 with %q", c.query, r.status, r.body, c.reason)
		}
	}
	// A cursor changed by one character is refused.
	first := e.list("limit=3")
	c := *first.NextCursor
	b := []byte(c)
	if b[len(b)/2] == 'A' { // another valid base64url character
		b[len(b)/2] = 'B'
	} else {
		b[len(b)/2] = 'A'
	}
	r := e.do("GET", "/v1/messages?cursor="+url.QueryEscape(string(b)), "")
	if r.status != http.StatusBadRequest || !strings.Contains(r.errorText(t), "altered") {
		t.Fatalf("tampered cursor: %d %s", r.status, r.body)
	}
	// Without a token, no bodies.
	noToken := newEnv(t)
	r = noToken.do("GET", "/v1/messages?body=true", "")
	if r.status != http.StatusForbidden {
		t.Fatalf("body=true without a token: %d %s", r.status, r.body)
	}
	// Dead messages, by time of death.
	e2 := newEnv(t)
	stateFixture(t, e2)
	dead := e2.list("state=dead")
	if len(dead.Messages) != 3 {
		t.Fatalf("dead: %+v", dead)
	}
	for _, m := range dead.Messages {
		if m.State != "dead" {
			t.Fatalf("dead listing has %+v", m)
		}
	}
	if got := e2.listIDs("state=inflight"); len(got) != 2 {
		t.Fatalf("inflight: %v", got)
	}
}

// A PATCH does not move an occurrence of a series past the series' until
// (it would be an occurrence after it): 400 naming the field and the end;
// to it, it moves.
func TestRescheduleNotPastUntil(t *testing.T) {
	e := newEnv(t)
	due := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	until := due.Add(2 * time.Hour)
	m := testMsg("series", due)
	m.Recur = &envelope.Recurrence{Every: time.Hour, Anchor: due, N: 1, Until: until}
	e.parkAt(m)
	r := e.do("PATCH", "/v1/messages/series", fmt.Sprintf(`{"deliver_at":%q}`, until.Add(time.Minute).Format(time.RFC3339Nano)))
	e.expect(r, http.StatusBadRequest)
	if body := string(r.body); !strings.Contains(body, "deliver_at") || !strings.Contains(body, envelope.FormatTime(until)+" (until)") {
		t.Fatalf("moved past until: %s", body)
	}
	if !e.dueAt("series").Equal(due) {
		t.Fatalf("due %v after a refused move, want %v", e.dueAt("series"), due)
	}
	r = e.do("PATCH", "/v1/messages/series", fmt.Sprintf(`{"deliver_at":%q}`, until.Format(time.RFC3339Nano)))
	e.expect(r, http.StatusOK)
	if !e.dueAt("series").Equal(until) {
		t.Fatalf("due %v after a move to until, want %v", e.dueAt("series"), until)
	}
}

// GET /v1/messages/{id} shows a recurring message's schedule, next time and
// occurrence, its group and whether it is held.
func TestInspectRecurrenceGroupHeld(t *testing.T) {
	e := newEnv(t)
	due := time.Date(2030, 1, 1, 9, 0, 0, 0, time.UTC)
	m := testMsg("every-day", due)
	m.Group = "reports"
	m.Recur = &envelope.Recurrence{Cron: "0 9 * * *", TimeZone: "Europe/Berlin", Anchor: due, N: 3, Count: 10}
	e.parkAt(m)
	r := e.do("GET", "/v1/messages/every-day", "")
	e.expect(r, http.StatusOK)
	var v MessageView
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatal(err)
	}
	rec := v.Recurrence
	if v.Group != "reports" || rec == nil || rec.Occurrence != 3 || rec.Count != 10 || rec.Cron != "0 9 * * *" ||
		rec.TimeZone != "Europe/Berlin" || rec.NextAt != v.DueAt || rec.Missed != "once" ||
		rec.Schedule != "cron 0 9 * * * in Europe/Berlin, 10 times" {
		t.Fatalf("view: %s", r.body)
	}
	if f := mustTime(t, rec.FollowingAt); !f.Equal(time.Date(2030, 1, 2, 8, 0, 0, 0, time.UTC)) {
		t.Fatalf("following_at %v, want 09:00 in Berlin the next day", f)
	}
	// Nor has an occurrence whose series a cancel ended while it was in
	// flight, nor a dead one.
	ended := testMsg("ended", time.Now().Add(-time.Second))
	ended.Recur = &envelope.Recurrence{Every: time.Hour, Anchor: ended.DueAt, N: 1}
	e.parkAt(ended)
	if _, err := e.store.Claim(context.Background(), e.store.ShardOf("ended"), 10, time.Minute, nil); err != nil {
		t.Fatal(err)
	}
	e.expect(e.do("DELETE", "/v1/messages/ended", ""), http.StatusConflict)
	if r := e.do("GET", "/v1/messages/ended", ""); strings.Contains(string(r.body), "following_at") {
		t.Fatalf("occurrence whose series ended: %s", r.body)
	}
	// The last occurrence has no following one.
	last := testMsg("last", due)
	last.Recur = &envelope.Recurrence{Every: time.Hour, Anchor: due.Add(-time.Hour), N: 2, Count: 2}
	e.parkAt(last)
	if r := e.do("GET", "/v1/messages/last", ""); strings.Contains(string(r.body), "following_at") || !strings.Contains(string(r.body), `"every":"1h0m0s"`) {
		t.Fatalf("last occurrence: %s", r.body)
	}
	// Held for its sink.
	held := testMsg("held", time.Now().Add(-time.Second))
	e.parkAt(held)
	states, err := e.store.SinkStates(context.Background(), []string{"rabbit"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Claim(context.Background(), e.store.ShardOf("held"), 10, time.Minute, map[string]int{"rabbit": states["rabbit"].Band}); err != nil {
		t.Fatal(err)
	}
	if r := e.do("GET", "/v1/messages/held", ""); r.json(t)["held"] != true || r.json(t)["state"] != "held" {
		t.Fatalf("held: %s", r.body)
	}
	// ... and listed by its state.
	if r := e.do("GET", "/v1/messages?state=held", ""); r.status != http.StatusOK || !strings.Contains(string(r.body), `"id":"held"`) || strings.Contains(string(r.body), `"id":"last"`) {
		t.Fatalf("GET /v1/messages?state=held: %d %s", r.status, r.body)
	}
}

// GET and DELETE /v1/groups/{key}.
func TestGroupsAPI(t *testing.T) {
	e := newEnv(t)
	base := time.Now().Add(time.Hour)
	for i := range 30 {
		m := testMsg(fmt.Sprintf("o-%02d", i), base.Add(time.Duration(30-i)*time.Second))
		m.Group = "order/42"
		if i >= 20 {
			m.Group = "order-7"
		}
		e.parkAt(m)
	}
	r := e.do("GET", "/v1/groups/order%2F42?limit=5", "")
	e.expect(r, http.StatusOK)
	var g struct {
		Group      string `json:"group"`
		Count      int    `json:"count"`
		Messages   []struct{ ID string }
		NextCursor *string `json:"next_cursor"`
	}
	if err := json.Unmarshal(r.body, &g); err != nil {
		t.Fatal(err)
	}
	if g.Group != "order/42" || g.Count != 20 || len(g.Messages) != 5 || g.Messages[0].ID != "o-19" || g.NextCursor == nil {
		t.Fatalf("group: %s", r.body)
	}
	r = e.do("GET", "/v1/groups/order%2F42?limit=5&cursor="+url.QueryEscape(*g.NextCursor), "")
	e.expect(r, http.StatusOK)
	if !strings.Contains(string(r.body), `"o-14"`) {
		t.Fatalf("second page: %s", r.body)
	}
	e.expect(e.do("GET", "/v1/groups/order%2F42?group=x", ""), http.StatusBadRequest)
	r = e.do("DELETE", "/v1/groups/order%2F42", "")
	e.expect(r, http.StatusOK)
	if r.json(t)["cancelled"] != float64(20) {
		t.Fatalf("cancel: %s", r.body)
	}
	e.expect(e.do("GET", "/v1/groups/order%2F42", ""), http.StatusNotFound)
	e.expect(e.do("DELETE", "/v1/groups/order%2F42", ""), http.StatusNotFound)
	if st, _ := e.store.Stats(context.Background()); st.Parked != 10 {
		t.Fatalf("parked %d after the cancel, want the other group's 10", st.Parked)
	}
	e.expect(e.do("GET", "/v1/groups/a%E2%80%AEb", ""), http.StatusBadRequest) // a bidi override
	e.expect(e.do("GET", "/v1/groups/", ""), http.StatusNotFound)
}

// fakeSinks is the daemon's side of /v1/sinks for tests: its refresh
// applies the pause in Redis, as the scheduler's does.
type fakeSinks struct {
	mu        sync.Mutex
	store     *store.Store
	statuses  []SinkStatus
	refreshed int
}

func (f *fakeSinks) get() []SinkStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.statuses)
}

func (f *fakeSinks) refresh(ctx context.Context) error {
	states, err := f.store.SinkStates(ctx, nil)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refreshed++
	for i := range f.statuses {
		f.statuses[i].Paused = states[f.statuses[i].Name].Paused
	}
	return nil
}

// GET /v1/sinks and POST /v1/sinks/{name}/pause|resume.
func TestSinksAPI(t *testing.T) {
	f := &fakeSinks{statuses: []SinkStatus{
		{Name: "rabbit", Known: true, Rate: 12.5, MaxRate: 500},
		{Name: "kafka", Known: true, Ready: errors.New("dial tcp: connection refused"), Blocked: true},
	}}
	e := newEnv(t, func(p *Params, o *ops.Params, _ *redis.Options) { o.Sinks, o.Refresh = f.get, f.refresh })
	f.store = e.store
	ctx := context.Background()
	var views []ops.SinkView
	r := e.do("GET", "/v1/sinks", "")
	e.expect(r, http.StatusOK)
	if err := json.Unmarshal(r.body, &views); err != nil {
		t.Fatal(err)
	}
	if len(views) != 2 || views[0].Name != "kafka" || views[1].Name != "rabbit" {
		t.Fatalf("sinks: %s", r.body)
	}
	k, rb := views[0], views[1]
	if k.Status != "blocked" || *k.Ready || !strings.Contains(k.Error, "refused") || rb.Status != "ready" || !*rb.Ready ||
		*rb.Rate != 12.5 || rb.MaxRate != 500 || rb.Paused || rb.Due != 0 {
		t.Fatalf("sinks: %s", r.body)
	}
	for _, key := range []string{`"ready"`, `"paused"`, `"due"`, `"rate"`, `"max_rate"`} {
		if !strings.Contains(string(r.body), key) {
			t.Fatalf("no %s in %s", key, r.body)
		}
	}
	// Pause: in Redis, applied at once; the held messages count as due.
	r = e.do("POST", "/v1/sinks/rabbit/pause", "")
	e.expect(r, http.StatusOK)
	if r.json(t)["paused"] != true || r.json(t)["status"] != "paused" || f.refreshed != 1 {
		t.Fatalf("pause: %s (refreshed %d)", r.body, f.refreshed)
	}
	states, err := e.store.SinkStates(ctx, nil)
	if err != nil || !states["rabbit"].Paused {
		t.Fatalf("Redis: %+v %v", states, err)
	}
	e.parkAt(testMsg("p1", time.Now().Add(-time.Second)), testMsg("p2", time.Now().Add(-time.Second)))
	for sh := range e.store.Shards() {
		if _, err := e.store.Claim(ctx, sh, 10, time.Minute, map[string]int{"rabbit": states["rabbit"].Band}); err != nil {
			t.Fatal(err)
		}
	}
	r = e.do("GET", "/v1/sinks/rabbit", "")
	e.expect(r, http.StatusOK)
	if r.json(t)["due"] != float64(2) {
		t.Fatalf("due of the paused sink: %s", r.body)
	}
	r = e.do("POST", "/v1/sinks/rabbit/resume", "")
	e.expect(r, http.StatusOK)
	if r.json(t)["paused"] != false || r.json(t)["status"] != "ready" || f.refreshed != 2 {
		t.Fatalf("resume: %s", r.body)
	}
	// Without the refresh, the instance says it has not applied the change.
	f.mu.Lock()
	f.statuses[0].Paused = true // rabbit
	f.mu.Unlock()
	if r := e.do("GET", "/v1/sinks/rabbit", ""); r.json(t)["status"] != "resuming" {
		t.Fatalf("a pause lifted in Redis, still applied here: %s", r.body)
	}
	if err := e.store.SetPaused(ctx, "kafka", true); err != nil {
		t.Fatal(err)
	}
	if r := e.do("GET", "/v1/sinks/kafka", ""); r.json(t)["status"] != "pausing" {
		t.Fatalf("a pause in Redis, not applied here yet: %s", r.body)
	}
	if states, _ := e.store.SinkStates(ctx, nil); states["rabbit"].Paused {
		t.Fatal("still paused in Redis")
	}
	// Unknown sinks, wrong methods.
	r = e.do("POST", "/v1/sinks/nope/pause", "")
	if r.status != http.StatusNotFound || !strings.Contains(r.errorText(t), "kafka, rabbit") {
		t.Fatalf("unknown sink: %d %s", r.status, r.body)
	}
	e.expect(e.do("GET", "/v1/sinks/rabbit/pause", ""), http.StatusMethodNotAllowed)
	e.expect(e.do("POST", "/v1/sinks", ""), http.StatusMethodNotAllowed)
	e.expect(e.do("POST", "/v1/sinks/rabbit/stop", ""), http.StatusMethodNotAllowed) // GET /v1/sinks/{name} is the only method there
}

// GET /v1/stats has the forecast and the held count.
func TestStatsForecast(t *testing.T) {
	e := newEnv(t)
	now := time.Now()
	e.parkAt(testMsg("a", now.Add(-time.Second)), testMsg("b", now.Add(30*time.Second)), testMsg("c", now.Add(3*time.Minute)),
		testMsg("d", now.Add(30*time.Minute)), testMsg("e", now.Add(5*time.Hour)), testMsg("f", now.Add(48*time.Hour)))
	r := e.do("GET", "/v1/stats", "")
	e.expect(r, http.StatusOK)
	var st struct {
		Forecast map[string]int64 `json:"forecast"`
		Held     *int64           `json:"held"`
	}
	if err := json.Unmarshal(r.body, &st); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"1m": 2, "5m": 3, "1h": 4, "24h": 5, "later": 1}
	if fmt.Sprint(st.Forecast) != fmt.Sprint(want) || st.Held == nil || *st.Held != 0 {
		t.Fatalf("stats: %s", r.body)
	}
}
