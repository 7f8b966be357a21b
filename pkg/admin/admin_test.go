package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/brokers/kafkabroker"
	"github.com/delaybridge/delaybridge/pkg/brokers/rabbitbroker"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/destination"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/metrics"
	"github.com/delaybridge/delaybridge/pkg/ops"
	"github.com/delaybridge/delaybridge/pkg/store"
	"github.com/delaybridge/delaybridge/pkg/tlsutil"
)

const testToken = "s3cret-token"

// env is one admin server on a real Redis.
type env struct {
	t      *testing.T
	redis  *testenv.RedisServer
	store  *store.Store
	server *Server
	url    string
	token  string // sent by do unless overridden
	logs   *syncBuffer

	mu     sync.Mutex
	parked []string // IDs the scheduler was woken for (ops.Params.Notify)
}

// envOption changes the server's Params or the store's Redis client.
type envOption func(*Params, *ops.Params, *redis.Options)

func withToken(tok string) envOption {
	return func(p *Params, o *ops.Params, _ *redis.Options) { p.Token = tok }
}

func withReady(f func() error) envOption {
	return func(p *Params, o *ops.Params, _ *redis.Options) { p.Ready = f }
}

func withLimits(l envelope.Limits) envOption {
	return func(p *Params, o *ops.Params, _ *redis.Options) { o.Limits = l }
}

// withFailFast makes Redis commands fail at once when Redis is down.
func withFailFast() envOption {
	return func(_ *Params, _ *ops.Params, o *redis.Options) { o.MaxRetries, o.DialerRetries = -1, 1 }
}

func newEnv(t *testing.T, opts ...envOption) *env {
	t.Helper()
	rs := testenv.Redis(t)
	e := &env{t: t, redis: rs, logs: &syncBuffer{}}
	log := slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	p := Params{Metrics: metrics.New(), Logger: log}
	op := ops.Params{
		// Every message parked (or rescheduled, fired, retried) wakes
		// the scheduler: the env records which.
		Notify: func(id string, _ time.Time) {
			e.mu.Lock()
			e.parked = append(e.parked, id)
			e.mu.Unlock()
		},
		Destinations: destination.Sinks{"rabbit": rabbitbroker.Destinations, "kafka": kafkabroker.Destinations}.Lookup,
		Logger:       log,
	}
	ro := &redis.Options{Addr: rs.Addr}
	for _, o := range opts {
		o(&p, &op, ro)
	}
	client := redis.NewClient(ro)
	t.Cleanup(func() { _ = client.Close() })
	e.store = store.New(client, store.Options{Prefix: "t", Shards: 4})
	op.Store = e.store
	p.Ops = ops.New(op)
	e.token = p.Token
	e.server = New(p)
	ts := httptest.NewServer(e.server.Handler())
	t.Cleanup(ts.Close)
	e.url = ts.URL
	return e
}

// parkedIDs returns the IDs the scheduler was woken for.
func (e *env) parkedIDs() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.parked)
}

type response struct {
	status int
	header http.Header
	body   []byte
}

// json decodes the body into a map (an object answer).
func (r response) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("answer %d is not a JSON object: %v: %s", r.status, err, r.body)
	}
	return m
}

func (r response) errorText(t *testing.T) string {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("error answer has Content-Type %q, want application/json", ct)
	}
	s, ok := r.json(t)["error"].(string)
	if !ok || s == "" {
		t.Fatalf("answer %d has no error text: %s", r.status, r.body)
	}
	return s
}

// do sends a request with the env's token (when set); path is sent as
// given (escapes included).
func (e *env) do(method, path, body string) response {
	e.t.Helper()
	return e.doAuth(method, path, body, bearer(e.token))
}

func bearer(tok string) string {
	if tok == "" {
		return ""
	}
	return "Bearer " + tok
}

func (e *env) doAuth(method, path, body, auth string) response {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, e.url+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

func (e *env) expect(r response, status int) {
	e.t.Helper()
	if r.status != status {
		e.t.Fatalf("status %d, want %d: %s", r.status, status, r.body)
	}
}

// post schedules a message and returns its ID.
func (e *env) post(body string) string {
	e.t.Helper()
	r := e.do("POST", "/v1/messages", body)
	e.expect(r, http.StatusCreated)
	return r.json(e.t)["id"].(string)
}

func mustTime(t *testing.T, s any) time.Time {
	t.Helper()
	str, _ := s.(string)
	tm, err := time.Parse(time.RFC3339Nano, str)
	if err != nil {
		t.Fatalf("time %v: %v", s, err)
	}
	if !strings.HasSuffix(str, "Z") || len(str) != len("2006-01-02T15:04:05.000Z") {
		t.Fatalf("time %q is not RFC 3339 UTC with milliseconds", str)
	}
	return tm
}

// syncBuffer is what a logger writes while the test reads it.
type syncBuffer = testenv.Output

func TestProbesNeedNoToken(t *testing.T) {
	e := newEnv(t, withToken(testToken))
	e.server.p.Metrics.Retries.WithLabelValues("main").Add(3)

	r := e.doAuth("GET", "/healthz", "", "")
	e.expect(r, 200)
	if got := r.json(t)["status"]; got != "ok" {
		t.Errorf("healthz status %v", got)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("healthz Content-Type %q", ct)
	}

	r = e.doAuth("GET", "/readyz", "", "")
	e.expect(r, 200)
	if got := r.json(t)["status"]; got != "ready" {
		t.Errorf("readyz status %v", got)
	}

	r = e.doAuth("GET", "/metrics", "", "")
	e.expect(r, 200)
	if !strings.Contains(string(r.body), `delaybridge_retries_total{sink="main"} 3`) {
		t.Errorf("metrics lack delaybridge_retries_total:\n%.2000s", r.body)
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("metrics Content-Type %q", ct)
	}

	r = e.doAuth("HEAD", "/healthz", "", "")
	e.expect(r, 200)
}

func TestReadyzNotReady(t *testing.T) {
	var mu sync.Mutex
	reason := errors.New("sink rabbit: dial tcp 127.0.0.1:5673: connection refused")
	e := newEnv(t, withReady(func() error {
		mu.Lock()
		defer mu.Unlock()
		return reason
	}))
	r := e.do("GET", "/readyz", "")
	e.expect(r, http.StatusServiceUnavailable)
	m := r.json(t)
	// Without a token configured, the reason stays and the address goes
	// (TestReadyzAddressesOnlyWithToken has the rest).
	if m["status"] != "not ready" || m["error"] != "sink rabbit: dial tcp <address>: connection refused" {
		t.Errorf("readyz answer %s", r.body)
	}
	mu.Lock()
	reason = nil
	mu.Unlock()
	e.expect(e.do("GET", "/readyz", ""), 200)
	// Probes ask every few seconds: "not ready" is an answer, not a failed
	// request, and must not fill the log with warnings.
	if strings.Contains(e.logs.String(), "level=WARN") {
		t.Errorf("a 503 from /readyz was logged at warn:\n%s", e.logs.String())
	}
}

func TestAuth(t *testing.T) {
	e := newEnv(t, withToken(testToken))
	id := e.post(`{"delay":60000,"sink":"rabbit","destination":"q","body":"x"}`)
	requests := []struct {
		method, path, body string
		ok                 int
	}{
		{"GET", "/v1/messages/" + id, "", 200},
		{"DELETE", "/v1/messages/unknown", "", 404},
		{"POST", "/v1/messages", `{"delay":1,"sink":"rabbit","destination":"q","body":""}`, 201},
		{"GET", "/v1/stats", "", 200},
		{"GET", "/v1/dead", "", 200},
		{"GET", "/v1/dead/unknown", "", 404},
		{"POST", "/v1/dead/unknown/retry", "", 404},
		{"DELETE", "/v1/dead/unknown", "", 404},
		{"GET", "/v1/nothing-here", "", 404},
	}
	for _, rq := range requests {
		t.Run(rq.method+" "+rq.path, func(t *testing.T) {
			for _, auth := range []string{"", "Bearer wrong", "Bearer " + testToken + "x", "Basic " + testToken, "Bearer", testToken} {
				r := e.doAuth(rq.method, rq.path, rq.body, auth)
				if r.status != http.StatusUnauthorized {
					t.Fatalf("Authorization %q: status %d, want 401: %s", auth, r.status, r.body)
				}
				if !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
					t.Errorf("Authorization %q: WWW-Authenticate %q", auth, r.header.Get("WWW-Authenticate"))
				}
				r.errorText(t)
			}
			for _, auth := range []string{"Bearer " + testToken, "bearer " + testToken} {
				r := e.doAuth(rq.method, rq.path, rq.body, auth)
				if r.status != rq.ok {
					t.Fatalf("Authorization %q: status %d, want %d: %s", auth, r.status, rq.ok, r.body)
				}
			}
		})
	}
	// Without the token, the answer is 401 whatever else is wrong with the
	// request: a body that is not JSON (curl -d sends a form's type), or a
	// page of another origin.
	for _, h := range []map[string]string{
		{"Content-Type": "application/x-www-form-urlencoded"},
		{"Content-Type": "application/json", "Origin": "https://elsewhere.example", "Sec-Fetch-Site": "cross-site"},
	} {
		req, err := http.NewRequest("POST", e.url+"/v1/messages", strings.NewReader(`{"delay":1,"sink":"rabbit","destination":"q"}`))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("POST /v1/messages without the token, %v: %d, want 401", h, resp.StatusCode)
		}
	}
	if strings.Contains(e.logs.String(), testToken) {
		t.Errorf("the token appears in the log")
	}
}

func TestNoTokenConfigured(t *testing.T) {
	e := newEnv(t)
	e.expect(e.doAuth("GET", "/v1/stats", "", ""), 200)
	// A client sending a token to a server without one is served too.
	e.expect(e.doAuth("GET", "/v1/stats", "", "Bearer whatever"), 200)
}

func TestPostAndGet(t *testing.T) {
	e := newEnv(t, withToken(testToken))
	before := time.Now().Truncate(time.Millisecond)
	r := e.do("POST", "/v1/messages", `{
		"id": "order-42", "delay": 60000, "sink": "rabbit", "destination": "orders.expired",
		"key": "k1", "headers": {"content-type": "application/json", "X-Trace": "abc"},
		"body": "{\"order\":42}", "priority": 7}`)
	after := time.Now()
	e.expect(r, http.StatusCreated)
	m := r.json(t)
	if m["id"] != "order-42" {
		t.Errorf("id %v", m["id"])
	}
	due := mustTime(t, m["due_at"])
	if due.Before(before.Add(time.Minute)) || due.After(after.Add(time.Minute)) {
		t.Errorf("due_at %v not 60 s after the request (%v .. %v)", due, before, after)
	}
	if loc := r.header.Get("Location"); loc != "/v1/messages/order-42" {
		t.Errorf("Location %q", loc)
	}
	if got := e.parkedIDs(); len(got) != 1 || got[0] != "order-42" {
		t.Errorf("Park called with %v", got)
	}

	// What was stored.
	info, err := e.store.Inspect(context.Background(), "order-42")
	if err != nil {
		t.Fatal(err)
	}
	sm := info.Message
	if sm.Ingest != "" || sm.IngestedAt.Before(before) || sm.IngestedAt.After(after) {
		t.Errorf("ingest %q ingested at %v", sm.Ingest, sm.IngestedAt)
	}
	if string(sm.Body) != `{"order":42}` || string(sm.Key) != "k1" || sm.Priority != 7 || !sm.DueAt.Equal(due) {
		t.Errorf("stored %+v", sm)
	}
	wantHeaders := envelope.Headers{{Key: "X-Trace", Value: "abc"}, {Key: "content-type", Value: "application/json"}}
	if !slices.Equal(sm.Headers, wantHeaders) {
		t.Errorf("stored headers %v, want %v", sm.Headers, wantHeaders)
	}

	r = e.do("GET", "/v1/messages/order-42?body=true", "")
	e.expect(r, 200)
	g := r.json(t)
	want := map[string]any{
		"id": "order-42", "state": "scheduled", "due_at": m["due_at"], "sink": "rabbit",
		"destination": "orders.expired", "attempts": 0.0, "ingest": "", "priority": 7.0,
		"size": float64(info.EncodedSize), "key": "k1",
		"headers": map[string]any{"content-type": "application/json", "X-Trace": "abc"}, "body": `{"order":42}`,
	}
	for k, v := range want {
		if fmt.Sprint(g[k]) != fmt.Sprint(v) {
			t.Errorf("GET %s = %v, want %v", k, g[k], v)
		}
	}
	for _, k := range []string{"body_base64", "key_base64", "next_attempt_at", "dead_at", "reason", "last_error"} {
		if _, ok := g[k]; ok {
			t.Errorf("GET has %s: %s", k, r.body)
		}
	}
	if g["size"].(float64) <= float64(len(`{"order":42}`)) {
		t.Errorf("size %v", g["size"])
	}
	mustTime(t, g["ingested_at"])
}

func TestPostDueForms(t *testing.T) {
	e := newEnv(t)
	check := func(body string, want func(time.Time, time.Time) time.Time) {
		t.Helper()
		before := time.Now()
		r := e.do("POST", "/v1/messages", body)
		after := time.Now()
		e.expect(r, 201)
		got := mustTime(t, r.json(t)["due_at"])
		lo, hi := want(before, after), want(after, after)
		if got.Before(lo) || got.After(hi) {
			t.Errorf("%s: due_at %v, want %v .. %v", body, got, lo, hi)
		}
		info, err := e.store.Inspect(context.Background(), r.json(t)["id"].(string))
		if err != nil || !info.Message.DueAt.Equal(got) {
			t.Errorf("%s: stored due %v (%v), answered %v", body, info.Message.DueAt, err, got)
		}
	}
	plus := func(d time.Duration) func(time.Time, time.Time) time.Time {
		return func(now, _ time.Time) time.Time { return envelope.CeilMillis(now.Add(d)) }
	}
	at := func(t time.Time) func(time.Time, time.Time) time.Time {
		return func(time.Time, time.Time) time.Time { return t }
	}
	check(`{"delay":5000,"sink":"rabbit","destination":"q","body":""}`, plus(5*time.Second))
	check(`{"delay":"5000","sink":"rabbit","destination":"q","body":""}`, plus(5*time.Second))
	check(`{"delay":"1500ms","sink":"rabbit","destination":"q","body":""}`, plus(1500*time.Millisecond))
	// A fraction of a millisecond rounds up, as JavaScript publishers send it.
	check(`{"delay":1.5,"sink":"rabbit","destination":"q","body":""}`, plus(2*time.Millisecond))
	check(`{"delay":"1h30m","sink":"kafka","destination":"t","body":""}`, plus(90*time.Minute))
	check(`{"delay":0,"sink":"rabbit","destination":"q","body":""}`, plus(0))
	future := time.Now().Add(48 * time.Hour).UTC().Truncate(time.Millisecond)
	check(`{"deliver_at":"`+future.Format(time.RFC3339Nano)+`","sink":"rabbit","destination":"q","body":""}`, at(future))
	check(fmt.Sprintf(`{"deliver_at":%d,"sink":"rabbit","destination":"q","body":""}`, future.UnixMilli()), at(future))
	check(fmt.Sprintf(`{"deliver_at":"%d","sink":"rabbit","destination":"q","body":""}`, future.UnixMilli()), at(future))
	// A due time in the past is accepted: published at once.
	past := time.Date(2020, 1, 2, 3, 4, 5, 678e6, time.UTC)
	check(`{"deliver_at":"2020-01-02T04:04:05.678+01:00","sink":"rabbit","destination":"q","body":""}`, at(past))
	// An explicit null counts as absent.
	check(`{"delay":"1s","deliver_at":null,"sink":"rabbit","destination":"q","body":""}`, plus(time.Second))
}

func TestPostGeneratedID(t *testing.T) {
	e := newEnv(t)
	id1 := e.post(`{"delay":1000,"sink":"rabbit","destination":"q","body":"a"}`)
	id2 := e.post(`{"delay":1000,"sink":"rabbit","destination":"q","body":"a"}`)
	for _, id := range []string{id1, id2} {
		if _, err := uuid.Parse(id); err != nil {
			t.Errorf("generated id %q: %v", id, err)
		}
	}
	if id1 == id2 {
		t.Errorf("same generated id twice: %s", id1)
	}
}

func TestPostDuplicate(t *testing.T) {
	e := newEnv(t)
	r1 := e.do("POST", "/v1/messages", `{"id":"dup","delay":"1h","sink":"rabbit","destination":"q","body":"first"}`)
	e.expect(r1, 201)
	r2 := e.do("POST", "/v1/messages", `{"id":"dup","delay":"2h","sink":"kafka","destination":"t","body":"second"}`)
	e.expect(r2, 201)
	m := r2.json(t)
	if m["id"] != "dup" || m["duplicate"] != true {
		t.Errorf("duplicate answer %s", r2.body)
	}
	if m["due_at"] != r1.json(t)["due_at"] {
		t.Errorf("duplicate due_at %v, want the parked one %v", m["due_at"], r1.json(t)["due_at"])
	}
	if _, ok := r1.json(t)["duplicate"]; ok {
		t.Errorf("first answer says duplicate: %s", r1.body)
	}
	info, err := e.store.Inspect(context.Background(), "dup")
	if err != nil || string(info.Message.Body) != "first" || info.Message.Sink != "rabbit" {
		t.Errorf("the duplicate changed the parked message: %+v %v", info, err)
	}
}

func TestPostInvalid(t *testing.T) {
	e := newEnv(t, withLimits(envelope.Limits{MaxDelay: time.Hour, MaxPayloadBytes: 32, MaxHeaderBytes: 40, MaxIDBytes: 16}))
	// valid returns a valid request with the fields of override replaced
	// (a nil value deletes the field).
	valid := func(override map[string]any) string {
		m := map[string]any{"delay": 1000, "sink": "rabbit", "destination": "q", "body": "hi"}
		for k, v := range override {
			if v == nil {
				delete(m, k)
			} else {
				m[k] = v
			}
		}
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	cases := []struct {
		name, body, want string
	}{
		{"both delays", valid(map[string]any{"deliver_at": "2030-01-01T00:00:00Z"}), "not both"},
		{"no delay", valid(map[string]any{"delay": nil}), "delay or deliver_at is required"},
		{"delay text", valid(map[string]any{"delay": "soon"}), `delay "soon" is neither`},
		{"delay negative", valid(map[string]any{"delay": -5}), "negative"},
		{"delay negative duration", valid(map[string]any{"delay": "-5s"}), "negative"},
		{"delay bool", valid(map[string]any{"delay": true}), "delay must be an integer or a string"},
		{"delay object", valid(map[string]any{"delay": map[string]any{}}), "delay must be an integer or a string"},
		{"delay empty", valid(map[string]any{"delay": ""}), "delay is empty"},
		{"delay over max", valid(map[string]any{"delay": "2h"}), "limits.max_delay"},
		{"deliver_at text", valid(map[string]any{"delay": nil, "deliver_at": "tomorrow"}), `deliver_at "tomorrow" is neither`},
		{"deliver_at negative", valid(map[string]any{"delay": nil, "deliver_at": -1}), "before 1970"},
		{"deliver_at over max", valid(map[string]any{"delay": nil, "deliver_at": time.Now().Add(2 * time.Hour).UTC().Format(time.RFC3339)}), "limits.max_delay"},
		{"deliver_at array", valid(map[string]any{"delay": nil, "deliver_at": []int{1}}), "deliver_at must be an integer or a string"},
		{"no sink", valid(map[string]any{"sink": nil}), "sink is required"},
		{"blank sink", valid(map[string]any{"sink": "  "}), "sink is required"},
		{"unknown sink", valid(map[string]any{"sink": "nope"}), `sink "nope" names no configured sink`},
		{"sink number", valid(map[string]any{"sink": 3}), `field "sink" must be a string`},
		{"no destination", valid(map[string]any{"destination": nil}), "destination is required"},
		{"destination newline", valid(map[string]any{"destination": "a\nb"}), "destination contains"},
		{"empty id", valid(map[string]any{"id": ""}), "id is empty"},
		{"long id", valid(map[string]any{"id": strings.Repeat("i", 17)}), "limits.max_id_bytes 16"},
		{"control char id", valid(map[string]any{"id": "a\tb"}), "control character"},
		{"DEL in id", valid(map[string]any{"id": "a\x7fb"}), "control character"},
		{"control header", valid(map[string]any{"headers": map[string]string{"x-delay": "5"}}), `"x-delay" is a control header`},
		{"control header case", valid(map[string]any{"headers": map[string]string{"X-Delay-Sink": "kafka"}}), "control header"},
		{"message id header", valid(map[string]any{"headers": map[string]string{"x-message-id": "a"}}), "control header"},
		{"empty header name", valid(map[string]any{"headers": map[string]string{"": "a"}}), "header name is empty"},
		{"bad header name", valid(map[string]any{"headers": map[string]string{"a b": "a"}}), "contains a space"},
		{"bad header value", valid(map[string]any{"headers": map[string]string{"a": "x\r\ny"}}), "NUL, CR or LF"},
		{"header value number", valid(map[string]any{"headers": map[string]any{"a": 1}}), "must be an object of strings, not one with a value of type number"},
		{"headers too large", valid(map[string]any{"headers": map[string]string{"a": strings.Repeat("v", 40)}}), "limits.max_header_bytes 40"},
		{"no body", valid(map[string]any{"body": nil}), "body is required"},
		{"body and base64", valid(map[string]any{"body_base64": "aGk="}), "not both"},
		{"bad base64", valid(map[string]any{"body": nil, "body_base64": "!!!"}), "body_base64 is not standard base64"},
		{"body too large", valid(map[string]any{"body": strings.Repeat("b", 33)}), "limits.max_payload_bytes 32"},
		{"base64 body too large", valid(map[string]any{"body": nil, "body_base64": strings.Repeat("AAAA", 11)}), "body is 33 bytes"},
		{"body number", valid(map[string]any{"body": 5}), `field "body" must be a string`},
		{"priority", valid(map[string]any{"priority": 10}), `priority "10" is not an integer from 0 to 9`},
		{"unknown field", valid(map[string]any{"delay_ms": 5}), `unknown field "delay_ms"`},
		{"invalid json", `{"delay":`, "not valid JSON"},
		{"trailing data", valid(nil) + `{}`, "exactly one JSON object"},
		{"array", `[1,2]`, "must be a JSON object"},
		{"empty body", ``, "empty request body"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := e.do("POST", "/v1/messages", c.body)
			if r.status != http.StatusBadRequest {
				t.Fatalf("status %d, want 400: %s (request %s)", r.status, r.body, c.body)
			}
			if got := r.errorText(t); !strings.Contains(got, c.want) {
				t.Errorf("error %q does not contain %q", got, c.want)
			}
		})
	}

	// Over the request cap: 413; at it, read (and here refused for its
	// body, over max_payload_bytes).
	limit := int(e.server.ops.Limits().MaxDocumentBytes())
	huge := valid(map[string]any{"body": strings.Repeat("b", limit)})
	r := e.do("POST", "/v1/messages", huge)
	e.expect(r, http.StatusRequestEntityTooLarge)
	if got := r.errorText(t); !strings.Contains(got, fmt.Sprintf("request body over %d bytes", limit)) {
		t.Errorf("413: %q", got)
	}
	atLimit := valid(map[string]any{"body": strings.Repeat("b", limit-1000)})
	atLimit += strings.Repeat(" ", limit-len(atLimit))
	e.expect(e.do("POST", "/v1/messages", atLimit), http.StatusBadRequest)
	patch := `{"delay":"1s"}`
	e.expect(e.do("PATCH", "/v1/messages/none", patch+strings.Repeat(" ", 64<<10-len(patch))), http.StatusNotFound)
	r = e.do("PATCH", "/v1/messages/none", patch+strings.Repeat(" ", 64<<10+1-len(patch)))
	e.expect(r, http.StatusRequestEntityTooLarge)
	if got := r.errorText(t); !strings.Contains(got, "over 65536 bytes") || strings.Contains(got, "max_payload_bytes") {
		t.Errorf("413 of a PATCH: %q", got)
	}

	// The valid request itself is accepted, and nothing else was parked.
	e.expect(e.do("POST", "/v1/messages", valid(nil)), 201)
	st, err := e.store.Stats(context.Background())
	if err != nil || st.Parked != 1 || st.Dead != 0 {
		t.Errorf("after the invalid requests: %+v %v", st, err)
	}
	if got := e.parkedIDs(); len(got) != 1 {
		t.Errorf("Park called with %v", got)
	}
}

func TestBodyOnlyWithToken(t *testing.T) {
	t.Run("token", func(t *testing.T) {
		e := newEnv(t, withToken(testToken))
		text := e.post(`{"id":"text","delay":"1h","sink":"rabbit","destination":"q","body":"héllo <b>"}`)
		bin := e.post(`{"id":"bin","delay":"1h","sink":"rabbit","destination":"q","body_base64":"/wAB"}`)
		empty := e.post(`{"id":"empty","delay":"1h","sink":"rabbit","destination":"q","body":""}`)

		g := e.do("GET", "/v1/messages/"+text+"?body=true", "")
		e.expect(g, 200)
		if m := g.json(t); m["body"] != "héllo <b>" || m["body_base64"] != nil {
			t.Errorf("text body: %s", g.body)
		}
		g = e.do("GET", "/v1/messages/"+bin+"?body=1", "")
		e.expect(g, 200)
		if m := g.json(t); m["body_base64"] != "/wAB" || m["body"] != nil {
			t.Errorf("binary body: %s", g.body)
		}
		g = e.do("GET", "/v1/messages/"+empty+"?body=true", "")
		e.expect(g, 200)
		if m := g.json(t); m["body"] != "" {
			t.Errorf("empty body: %s", g.body)
		}
		for _, q := range []string{"", "?body=false"} {
			g = e.do("GET", "/v1/messages/"+text+q, "")
			e.expect(g, 200)
			if m := g.json(t); m["body"] != nil || m["body_base64"] != nil {
				t.Errorf("body served without ?body=true (%q): %s", q, g.body)
			}
		}
		g = e.do("GET", "/v1/messages/"+text+"?body=maybe", "")
		e.expect(g, 400)
		g.errorText(t)
		if strings.Contains(e.logs.String(), "héllo") {
			t.Errorf("a body appears in the log")
		}
	})
	t.Run("no token", func(t *testing.T) {
		e := newEnv(t)
		id := e.post(`{"delay":"1h","sink":"rabbit","destination":"q","body":"secret"}`)
		g := e.do("GET", "/v1/messages/"+id+"?body=true", "")
		e.expect(g, http.StatusForbidden)
		if msg := g.errorText(t); !strings.Contains(msg, "admin.token") {
			t.Errorf("403 reason %q", msg)
		}
		if strings.Contains(string(g.body), "secret") {
			t.Errorf("403 leaks the body")
		}
		g = e.do("GET", "/v1/messages/"+id, "")
		e.expect(g, 200)
		if strings.Contains(string(g.body), "secret") {
			t.Errorf("body served: %s", g.body)
		}
	})
}

func TestMessageNotFoundAndDelete(t *testing.T) {
	e := newEnv(t)
	r := e.do("GET", "/v1/messages/nope", "")
	e.expect(r, 404)
	r.errorText(t)
	r = e.do("DELETE", "/v1/messages/nope", "")
	e.expect(r, 404)
	r.errorText(t)

	id := e.post(`{"delay":"1h","sink":"rabbit","destination":"q","body":"x"}`)
	r = e.do("DELETE", "/v1/messages/"+id, "")
	e.expect(r, 204)
	if len(r.body) != 0 {
		t.Errorf("204 with a body: %q", r.body)
	}
	if _, err := e.store.Inspect(context.Background(), id); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("after DELETE, Inspect: %v", err)
	}
	e.expect(e.do("GET", "/v1/messages/"+id, ""), 404)
	e.expect(e.do("DELETE", "/v1/messages/"+id, ""), 404)

	r = e.do("GET", "/v1/messages/", "")
	e.expect(r, 404)
	r.errorText(t)
}

func TestIDsWithReservedCharacters(t *testing.T) {
	e := newEnv(t, withToken(testToken))
	ids := []string{"orders/3/1234", "a b?c#d%e&f=g+h", "x/../y", "p//q", "ünïcode/ø", "ends/", "/starts"}
	for _, id := range ids {
		body, _ := json.Marshal(map[string]any{"id": id, "delay": "1h", "sink": "rabbit", "destination": "q", "body": "b"})
		r := e.do("POST", "/v1/messages", string(body))
		e.expect(r, 201)
		if got := r.json(t)["id"]; got != id {
			t.Fatalf("posted id %q, answered %v", id, got)
		}
		loc := r.header.Get("Location")
		g := e.do("GET", loc, "")
		e.expect(g, 200)
		if got := g.json(t)["id"]; got != id {
			t.Errorf("GET %s: id %v, want %q", loc, got, id)
		}
		esc := url.PathEscape(id)
		if loc != "/v1/messages/"+esc {
			t.Errorf("Location %q, want /v1/messages/%s", loc, esc)
		}
	}
	// Unencoded slashes work too for IDs like Kafka's topic/partition/offset.
	g := e.do("GET", "/v1/messages/orders/3/1234", "")
	e.expect(g, 200)
	if got := g.json(t)["id"]; got != "orders/3/1234" {
		t.Errorf("id %v", got)
	}
	// Unencoded, IDs with empty or dot segments reach the handler as they
	// are (no path cleaning, no redirect).
	for _, id := range []string{"p//q", "x/../y", "/starts", "ends/"} {
		g := e.do("GET", "/v1/messages/"+id, "")
		e.expect(g, 200)
		if got := g.json(t)["id"]; got != id {
			t.Errorf("GET /v1/messages/%s: id %v", id, got)
		}
	}
	e.expect(e.do("DELETE", "/v1/messages/orders%2F3%2F1234", ""), 204)
	e.expect(e.do("GET", "/v1/messages/orders/3/1234", ""), 404)
	e.expect(e.do("DELETE", "/v1/messages/"+url.PathEscape("a b?c#d%e&f=g+h"), ""), 204)
}

// stateFixture parks messages in every state:
//
//	inflight: A, B (claimed, lease 1 min)
//	dead:     C (claimed, then given up), R (rejected at ingest), "job/retry"
//	due:      D, E (due 10 s ago)
//	not due:  F, G (due in an hour)
func stateFixture(t *testing.T, e *env) (leases map[int]*store.Lease) {
	t.Helper()
	ctx := context.Background()
	now := time.Now()
	msg := func(id string, due time.Time) *envelope.Message {
		return &envelope.Message{ID: id, DueAt: due.Truncate(time.Millisecond), Sink: "rabbit", Destination: "q." + id,
			Body: []byte("body " + id), Ingest: "orders-in", IngestedAt: now.Truncate(time.Millisecond)}
	}
	park := func(ms ...*envelope.Message) {
		t.Helper()
		res, err := e.store.Park(ctx, ms)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			if r != store.Parked {
				t.Fatalf("%s not parked: %v", ms[i].ID, r)
			}
		}
	}
	park(msg("A", now.Add(-time.Minute)), msg("B", now.Add(-time.Minute)), msg("C", now.Add(-time.Minute)), msg("job/retry", now.Add(-time.Minute)))
	leases = map[int]*store.Lease{}
	claimed := map[string]bool{}
	for shard := 0; shard < e.store.Shards(); shard++ {
		c, err := e.store.Claim(ctx, shard, 100, time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		leases[shard] = c
		for _, m := range c.Messages {
			claimed[m.ID] = true
		}
	}
	if len(claimed) != 4 {
		t.Fatalf("claimed %v", claimed)
	}
	for _, id := range []string{"C", "job/retry"} {
		n, err := e.store.MarkDead(ctx, leases[e.store.ShardOf(id)], []store.Failure{{ID: id, Reason: "sink rabbit: NO_ROUTE for " + id}})
		if err != nil || n != 1 {
			t.Fatalf("Dead %s: %d %v", id, n, err)
		}
	}
	park(msg("D", now.Add(-10*time.Second)), msg("E", now.Add(-10*time.Second)), msg("F", now.Add(time.Hour)), msg("G", now.Add(time.Hour)))
	ids, err := e.store.Reject(ctx, []store.Rejected{{Message: msg("R", now), Reason: "x-delay \"soon\" is neither integer milliseconds"}})
	if err != nil || ids[0] != "R" {
		t.Fatalf("Reject: %v %v", ids, err)
	}
	return leases
}

func TestStats(t *testing.T) {
	e := newEnv(t, withToken(testToken))
	// Empty first: nothing due, zero age, every shard listed.
	r := e.do("GET", "/v1/stats", "")
	e.expect(r, 200)
	var empty struct {
		Parked, Due, Dead   int64
		OldestDueAgeSeconds float64 `json:"oldest_due_age_seconds"`
		Shards              []struct{ Shard, Parked, Due, Dead int64 }
	}
	if err := json.Unmarshal(r.body, &empty); err != nil {
		t.Fatal(err)
	}
	if empty.Parked != 0 || empty.Due != 0 || empty.Dead != 0 || empty.OldestDueAgeSeconds != 0 || len(empty.Shards) != 4 {
		t.Errorf("empty stats %s", r.body)
	}

	stateFixture(t, e)
	r = e.do("GET", "/v1/stats", "")
	e.expect(r, 200)
	m := r.json(t)
	for _, k := range []string{"parked", "due", "dead", "oldest_due_age_seconds", "shards"} {
		if _, ok := m[k]; !ok {
			t.Errorf("stats lack %q: %s", k, r.body)
		}
	}
	var st struct {
		Parked, Due, Dead   int64
		OldestDueAgeSeconds float64 `json:"oldest_due_age_seconds"`
		Shards              []struct{ Shard, Parked, Due, Dead int64 }
	}
	if err := json.Unmarshal(r.body, &st); err != nil {
		t.Fatal(err)
	}
	// parked: A B (inflight) D E (due) F G; due: D E; dead: C R job/retry.
	if st.Parked != 6 || st.Due != 2 || st.Dead != 3 {
		t.Errorf("stats parked %d due %d dead %d, want 6 2 3: %s", st.Parked, st.Due, st.Dead, r.body)
	}
	if st.OldestDueAgeSeconds < 9 || st.OldestDueAgeSeconds > 120 {
		t.Errorf("oldest_due_age_seconds %v, want about 10", st.OldestDueAgeSeconds)
	}
	want := make([]struct{ Shard, Parked, Due, Dead int64 }, 4)
	for i := range want {
		want[i].Shard = int64(i)
	}
	for _, id := range []string{"A", "B", "D", "E", "F", "G"} {
		want[e.store.ShardOf(id)].Parked++
	}
	for _, id := range []string{"D", "E"} {
		want[e.store.ShardOf(id)].Due++
	}
	for _, id := range []string{"C", "R", "job/retry"} {
		want[e.store.ShardOf(id)].Dead++
	}
	if !slices.Equal(st.Shards, want) {
		t.Errorf("shards %+v, want %+v", st.Shards, want)
	}
	// due_in: A and B are in flight (lease a minute ahead), D and E due,
	// F and G due in an hour (now at the request is a little later).
	var dueIn struct {
		DueIn map[string]int64 `json:"due_in"`
	}
	if err := json.Unmarshal(r.body, &dueIn); err != nil {
		t.Fatal(err)
	}
	wantDueIn := map[string]int64{"overdue": 2, "minute": 2, "hour": 2, "day": 0, "later": 0}
	if !maps.Equal(dueIn.DueIn, wantDueIn) {
		t.Errorf("due_in %v, want %v", dueIn.DueIn, wantDueIn)
	}
}

func TestMessageStates(t *testing.T) {
	e := newEnv(t)
	leases := stateFixture(t, e)

	g := e.do("GET", "/v1/messages/A", "")
	e.expect(g, 200)
	a := g.json(t)
	if a["state"] != "inflight" || a["attempts"] != 1.0 || a["ingest"] != "orders-in" || a["destination"] != "q.A" {
		t.Errorf("A: %s", g.body)
	}
	if next := mustTime(t, a["next_attempt_at"]); !next.Equal(leases[e.store.ShardOf("A")].Expiry()) {
		t.Errorf("A next_attempt_at %v, want the lease expiry", next)
	}

	g = e.do("GET", "/v1/messages/C", "")
	e.expect(g, 200)
	c := g.json(t)
	if c["state"] != "dead" || c["reason"] != "sink rabbit: NO_ROUTE for C" || c["attempts"] != 1.0 {
		t.Errorf("C: %s", g.body)
	}
	mustTime(t, c["dead_at"])
	if _, ok := c["next_attempt_at"]; ok {
		t.Errorf("dead C has next_attempt_at: %s", g.body)
	}

	g = e.do("GET", "/v1/messages/F", "")
	e.expect(g, 200)
	if f := g.json(t); f["state"] != "scheduled" || f["attempts"] != 0.0 || f["next_attempt_at"] != nil {
		t.Errorf("F: %s", g.body)
	}

	// A failed attempt: scheduled again with the last error.
	retryAt := time.Now().Add(time.Minute).Truncate(time.Millisecond)
	shard := e.store.ShardOf("B")
	if n, err := e.store.Retry(context.Background(), leases[shard], []store.RetryAt{{ID: "B", At: retryAt, Reason: "sink rabbit: connection reset"}}); err != nil || n != 1 {
		t.Fatalf("Retry: %d %v", n, err)
	}
	g = e.do("GET", "/v1/messages/B", "")
	e.expect(g, 200)
	b := g.json(t)
	if b["state"] != "scheduled" || b["attempts"] != 1.0 || b["last_error"] != "sink rabbit: connection reset" {
		t.Errorf("B: %s", g.body)
	}
	if next := mustTime(t, b["next_attempt_at"]); !next.Equal(retryAt) {
		t.Errorf("B next_attempt_at %v, want %v", next, retryAt)
	}
}

func TestDead(t *testing.T) {
	e := newEnv(t, withToken(testToken))
	stateFixture(t, e)

	r := e.do("GET", "/v1/dead", "")
	e.expect(r, 200)
	var list []map[string]any
	if err := json.Unmarshal(r.body, &list); err != nil {
		t.Fatalf("dead list is not a JSON array: %v: %s", err, r.body)
	}
	byID := map[string]map[string]any{}
	for _, d := range list {
		byID[d["id"].(string)] = d
	}
	if len(list) != 3 || byID["C"] == nil || byID["R"] == nil || byID["job/retry"] == nil {
		t.Fatalf("dead list %s", r.body)
	}
	if d := byID["C"]; d["reason"] != "sink rabbit: NO_ROUTE for C" || d["sink"] != "rabbit" || d["destination"] != "q.C" ||
		d["ingest"] != "orders-in" || d["attempts"] != 1.0 || d["size"].(float64) <= 0 {
		t.Errorf("dead C: %v", d)
	}
	if d := byID["R"]; !strings.Contains(d["reason"].(string), "soon") || d["attempts"] != 0.0 {
		t.Errorf("dead R: %v", d)
	}
	for _, d := range list {
		mustTime(t, d["dead_at"])
	}
	for i := 1; i < len(list); i++ {
		if mustTime(t, list[i]["dead_at"]).After(mustTime(t, list[i-1]["dead_at"])) {
			t.Errorf("dead list not newest first: %s", r.body)
		}
	}

	r = e.do("GET", "/v1/dead?limit=1", "")
	e.expect(r, 200)
	if err := json.Unmarshal(r.body, &list); err != nil || len(list) != 1 {
		t.Errorf("limit=1: %s", r.body)
	}
	for _, q := range []string{"0", "-1", "abc", "10001"} {
		r = e.do("GET", "/v1/dead?limit="+q, "")
		e.expect(r, 400)
		r.errorText(t)
	}
	e.expect(e.do("GET", "/v1/dead?limit=10000", ""), 200)

	// GET /v1/dead/{id} serves dead messages only.
	g := e.do("GET", "/v1/dead/C", "")
	e.expect(g, 200)
	if g.json(t)["state"] != "dead" {
		t.Errorf("GET /v1/dead/C: %s", g.body)
	}
	e.expect(e.do("GET", "/v1/dead/A", ""), 404)

	// Retry: C died because the broker refused its destination: only with
	// another one (or the same one given again); then scheduled, due now.
	r = e.do("POST", "/v1/dead/C/retry", "")
	e.expect(r, 409)
	if msg := r.errorText(t); !strings.Contains(msg, "NO_ROUTE") || !strings.Contains(msg, "destination") {
		t.Errorf("retry of C without a destination: %s", msg)
	}
	r = e.do("POST", "/v1/dead/C/retry", `{"destination":""}`) // empty is not "the message's own"
	e.expect(r, 400)
	if msg := r.errorText(t); !strings.Contains(msg, `"destination" is empty`) {
		t.Errorf("retry of C with an empty destination: %s", msg)
	}
	before := time.Now().Add(-time.Second)
	r = e.do("POST", "/v1/dead/C/retry", `{"destination":"q.C2"}`)
	e.expect(r, 204)
	g = e.do("GET", "/v1/messages/C", "")
	e.expect(g, 200)
	c := g.json(t)
	if c["state"] != "scheduled" || c["attempts"] != 0.0 || c["reason"] != nil || c["dead_at"] != nil || c["destination"] != "q.C2" {
		t.Errorf("C after retry: %s", g.body)
	}
	if due := mustTime(t, c["due_at"]); due.Before(before) || due.After(time.Now().Add(time.Second)) || c["next_attempt_at"] != nil {
		t.Errorf("C after retry is due at %v (next attempt %v), want now", due, c["next_attempt_at"])
	}
	e.expect(e.do("POST", "/v1/dead/C/retry", ""), 404)
	e.expect(e.do("POST", "/v1/dead/unknown/retry", ""), 404)
	e.expect(e.do("POST", "/v1/dead/A/retry", ""), 404) // in flight, not dead

	// An ID ending in "/retry": its own slash is encoded.
	e.expect(e.do("POST", "/v1/dead/job%2Fretry/retry", `{"destination":"q.job"}`), 204)
	g = e.do("GET", "/v1/messages/job%2Fretry", "")
	e.expect(g, 200)
	if g.json(t)["state"] != "scheduled" {
		t.Errorf("job/retry after retry: %s", g.body)
	}

	// Delete: only dead ones.
	e.expect(e.do("DELETE", "/v1/dead/R", ""), 204)
	if _, err := e.store.Inspect(context.Background(), "R"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("R after delete: %v", err)
	}
	e.expect(e.do("DELETE", "/v1/dead/R", ""), 404)
	e.expect(e.do("DELETE", "/v1/dead/F", ""), 404)
	if info, err := e.store.Inspect(context.Background(), "F"); err != nil || info.State != store.StateScheduled {
		t.Errorf("DELETE /v1/dead/F touched scheduled F: %v %v", info, err)
	}

	r = e.do("GET", "/v1/dead", "")
	e.expect(r, 200)
	if strings.TrimSpace(string(r.body)) != "[]" {
		t.Errorf("dead list after retry and delete: %s", r.body)
	}
	st, err := e.store.Stats(context.Background())
	if err != nil || st.Dead != 0 || st.Parked != 8 {
		t.Errorf("stats after retry and delete: %+v %v", st, err)
	}
}

func TestMethodsAndUnknownPaths(t *testing.T) {
	e := newEnv(t)
	cases := []struct{ method, path, allow string }{
		{"PUT", "/v1/messages/x", "DELETE, GET, HEAD, PATCH"},
		{"PUT", "/v1/messages", "GET, HEAD, POST"},
		{"PUT", "/v1/groups/g", "DELETE, GET, HEAD"},
		{"DELETE", "/v1/stats", "GET, HEAD"},
		{"POST", "/v1/dead", "DELETE, GET, HEAD"},
		{"GET", "/v1/dead/x/retry", "POST"},
		{"POST", "/v1/dead/x", "DELETE, GET, HEAD"},
		{"POST", "/healthz", "GET, HEAD"},
		{"DELETE", "/readyz", "GET, HEAD"},
		{"POST", "/metrics", "GET, HEAD"},
		{"POST", "/", "GET, HEAD"}, // the dashboard page (package ui)
	}
	for _, c := range cases {
		r := e.do(c.method, c.path, "")
		if r.status != http.StatusMethodNotAllowed || r.header.Get("Allow") != c.allow {
			t.Errorf("%s %s: %d Allow %q, want 405 Allow %q", c.method, c.path, r.status, r.header.Get("Allow"), c.allow)
			continue
		}
		r.errorText(t)
	}
	for _, p := range []string{"/nope", "/ui/nope.js", "/v1", "/v1/nope", "/healthz/x"} {
		r := e.do("GET", p, "")
		if r.status != 404 {
			t.Errorf("GET %s: %d, want 404", p, r.status)
			continue
		}
		r.errorText(t)
	}
}

func TestRedisDown(t *testing.T) {
	e := newEnv(t, withFailFast())
	e.redis.Kill()
	for _, rq := range []struct{ method, path, body string }{
		{"GET", "/v1/stats", ""},
		{"GET", "/v1/messages/x", ""},
		{"GET", "/v1/dead", ""},
		{"POST", "/v1/messages", `{"delay":1,"sink":"rabbit","destination":"q","body":"x"}`},
	} {
		r := e.do(rq.method, rq.path, rq.body)
		if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" {
			t.Errorf("%s %s with Redis down: %d, Retry-After %q, want 503 with Retry-After: %s", rq.method, rq.path, r.status, r.header.Get("Retry-After"), r.body)
			continue
		}
		if text := r.errorText(t); !strings.Contains(text, "is Redis up") || !strings.Contains(text, "may or may not have been made") {
			t.Errorf("%s %s with Redis down: %q, want what was done and what to check", rq.method, rq.path, text)
		}
	}
	logs := e.logs.String()
	if !strings.Contains(logs, "level=WARN") || !strings.Contains(logs, "status=503") {
		t.Errorf("503 not logged at warn:\n%s", logs)
	}
}

func TestRequestLog(t *testing.T) {
	e := newEnv(t, withToken(testToken))
	e.post(`{"id":"logged","delay":"1h","sink":"rabbit","destination":"q","body":"top-secret-body"}`)
	e.expect(e.do("GET", "/v1/messages/logged?body=true", ""), 200)
	logs := e.logs.String()
	if !strings.Contains(logs, "level=DEBUG") || !strings.Contains(logs, "path=/v1/messages/logged") || !strings.Contains(logs, "status=201") {
		t.Errorf("requests not logged at debug:\n%s", logs)
	}
	if strings.Contains(logs, "WARN") || strings.Contains(logs, "INFO") {
		t.Errorf("successful requests logged above debug:\n%s", logs)
	}
	for _, secret := range []string{testToken, "top-secret-body"} {
		if strings.Contains(logs, secret) {
			t.Errorf("log contains %q:\n%s", secret, logs)
		}
	}
}

func TestStartAddrShutdown(t *testing.T) {
	rs := testenv.Redis(t)
	st := store.New(rs.Client(), store.Options{Prefix: "t", Shards: 4})
	s := New(Params{Listen: "127.0.0.1:0", Store: st})
	if s.Addr() != "" {
		t.Errorf("Addr before Start: %q", s.Addr())
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	addr := s.Addr()
	if addr == "" || strings.HasSuffix(addr, ":0") {
		t.Fatalf("Addr %q", addr)
	}
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("healthz on %s: %d", addr, resp.StatusCode)
	}

	// The port is taken: Start fails.
	other := New(Params{Listen: addr, Store: st})
	if err := other.Start(); err == nil {
		_ = other.Shutdown(context.Background())
		t.Fatalf("second Start on %s succeeded", addr)
	} else if !strings.Contains(err.Error(), "admin.listen") {
		t.Errorf("error does not name admin.listen: %v", err)
	}
	if err := other.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown of an unstarted server: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
		resp.Body.Close()
		t.Errorf("still serving after Shutdown")
	}
}

func TestMetricsDisabled(t *testing.T) {
	s := New(Params{})
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 404 || rec.Header().Get("Content-Type") != "application/json" {
		t.Errorf("/metrics without Metrics: %d %q", rec.Code, rec.Header().Get("Content-Type"))
	}
}

// With a certificate the admin server speaks HTTPS only.
func TestServeTLS(t *testing.T) {
	certs := testenv.NewCerts(t, "client")
	cfg, err := tlsutil.Server(config.ServerTLS{CertFile: certs.ServerCert, KeyFile: certs.ServerKey})
	if err != nil {
		t.Fatal(err)
	}
	s := New(Params{Listen: "127.0.0.1:0", TLS: cfg, Token: "tok"})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	clientTLS, err := tlsutil.Client(config.TLS{Enabled: true, CAFile: certs.CAFile})
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS}, Timeout: 10 * time.Second}
	resp, err := c.Get("https://" + s.Addr() + "/healthz")
	if err != nil {
		t.Fatalf("https: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("https healthz: %d", resp.StatusCode)
	}
	if resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + s.Addr() + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("plain HTTP answered 200 on the TLS port")
		}
	}
}

// Profiles are served only when asked for, and behind the token.
func TestPprof(t *testing.T) {
	on := New(Params{Listen: "127.0.0.1:0", Token: "tok", Pprof: true})
	off := New(Params{Listen: "127.0.0.1:0", Token: "tok"})
	for _, c := range []struct {
		srv  *Server
		auth string
		want int
	}{{on, "Bearer tok", 200}, {on, "", 401}, {off, "Bearer tok", 404}} {
		req := httptest.NewRequest(http.MethodGet, "/debug/pprof/", nil)
		req.Host = "127.0.0.1" // the listen host: allowed
		if c.auth != "" {
			req.Header.Set("Authorization", c.auth)
		}
		rec := httptest.NewRecorder()
		c.srv.Handler().ServeHTTP(rec, req)
		if rec.Code != c.want {
			t.Errorf("pprof %v with %q: %d, want %d", c.srv.p.Pprof, c.auth, rec.Code, c.want)
		}
	}
}

// A path spelled with percent-encoded letters reaches the same handlers
// and needs the same token.
func TestTokenCannotBeBypassedByEncoding(t *testing.T) {
	e := newEnv(t, withToken(testToken))
	for _, c := range []struct{ method, path string }{
		{"GET", "/%761/stats"}, {"GET", "/%761/dead"}, {"POST", "/%761/messages"}, {"GET", "/%76%31/stats"},
	} {
		r := e.doAuth(c.method, c.path, `{}`, "")
		if r.status != http.StatusUnauthorized {
			t.Errorf("%s %s without a token: %d, want 401", c.method, c.path, r.status)
		}
	}
	pp := New(Params{Listen: "127.0.0.1:0", Token: "tok", Pprof: true})
	req := httptest.NewRequest(http.MethodGet, "/%64ebug/pprof/", nil)
	req.Host = "localhost"
	rec := httptest.NewRecorder()
	pp.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusUnauthorized {
		t.Errorf("/%%64ebug/pprof/ without a token: %d, want 401", rec.Code)
	}
}

// TestPostSharesTheIngestRules sends the same invalid messages once as an
// ingest would hand them to envelope.Parse and once through POST
// /v1/messages: both paths reject each one with the same reason (the API
// names its fields where the ingest names headers), so a rule changed in
// envelope changes both, and a rule written again in the API would show
// here as a different reason.
func TestPostSharesTheIngestRules(t *testing.T) {
	lim := envelope.Limits{MaxDelay: time.Hour, MaxPayloadBytes: 32, MaxHeaderBytes: 60, MaxIDBytes: 16}
	e := newEnv(t, withLimits(lim))
	sinkExists := destination.Sinks{"rabbit": rabbitbroker.Destinations, "kafka": kafkabroker.Destinations}.Lookup
	cases := []struct {
		name    string
		headers envelope.Headers // as an ingested message carries them
		body    string
		sink    string
		dest    string
		request map[string]any // the same message as a POST
	}{
		{"delay not a duration", envelope.Headers{{Key: "x-delay", Value: "soon"}}, "b", "rabbit", "q",
			map[string]any{"delay": "soon"}},
		{"negative delay", envelope.Headers{{Key: "x-delay", Value: "-5s"}}, "b", "rabbit", "q",
			map[string]any{"delay": "-5s"}},
		{"delay over max_delay", envelope.Headers{{Key: "x-delay", Value: "2h"}}, "b", "rabbit", "q",
			map[string]any{"delay": "2h"}},
		{"deliver_at not a time", envelope.Headers{{Key: "x-deliver-at", Value: "tomorrow"}}, "b", "rabbit", "q",
			map[string]any{"deliver_at": "tomorrow"}},
		{"id with a control character", envelope.Headers{{Key: "x-delay", Value: "1s"}, {Key: "x-message-id", Value: "a\tb"}}, "b", "rabbit", "q",
			map[string]any{"delay": "1s", "id": "a\tb"}},
		{"id over max_id_bytes", envelope.Headers{{Key: "x-delay", Value: "1s"}, {Key: "x-message-id", Value: strings.Repeat("i", 17)}}, "b", "rabbit", "q",
			map[string]any{"delay": "1s", "id": strings.Repeat("i", 17)}},
		{"priority out of range", envelope.Headers{{Key: "x-delay", Value: "1s"}, {Key: "x-delay-priority", Value: "10"}}, "b", "rabbit", "q",
			map[string]any{"delay": "1s", "priority": 10}},
		{"unknown sink", envelope.Headers{{Key: "x-delay", Value: "1s"}}, "b", "nope", "q",
			map[string]any{"delay": "1s", "sink": "nope"}},
		{"destination with a newline", envelope.Headers{{Key: "x-delay", Value: "1s"}}, "b", "rabbit", "a\nb",
			map[string]any{"delay": "1s", "destination": "a\nb"}},
		{"body over max_payload_bytes", envelope.Headers{{Key: "x-delay", Value: "1s"}}, strings.Repeat("b", 33), "rabbit", "q",
			map[string]any{"delay": "1s", "body": strings.Repeat("b", 33)}},
		{"headers over max_header_bytes", envelope.Headers{{Key: "x-delay", Value: "1s"}, {Key: "h", Value: strings.Repeat("v", 60)}}, "b", "rabbit", "q",
			map[string]any{"delay": "1s", "headers": map[string]string{"h": strings.Repeat("v", 60)}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := &envelope.Incoming{Headers: c.headers, Body: []byte(c.body)}
			route := &envelope.Route{Ingest: "in", Sink: c.sink, Destination: c.dest, Sinks: sinkExists}
			d := envelope.Parse(in, route, lim, time.Now(), nil)
			if d.Action != envelope.Reject {
				t.Fatalf("ingest: %v, want a rejection", d.Action)
			}
			req := map[string]any{"sink": c.sink, "destination": c.dest, "body": c.body}
			for k, v := range c.request {
				req[k] = v
			}
			body, err := json.Marshal(req)
			if err != nil {
				t.Fatal(err)
			}
			r := e.do("POST", "/v1/messages", string(body))
			if r.status != http.StatusBadRequest {
				t.Fatalf("POST: status %d, want 400: %s", r.status, r.body)
			}
			if got, want := r.errorText(t), ops.FieldNames(d.Err.Error()); got != want {
				t.Errorf("POST rejects with %q, the ingest with %q", got, d.Err)
			}
		})
	}
}
