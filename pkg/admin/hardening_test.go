package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/jsonlimit"
	"github.com/delaybridge/delaybridge/pkg/ops"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// The hardening tests against the real server (on a real Redis): cross-site
// requests, Host checks, what is readable without a token, pprof, deceptive
// IDs, strict JSON and /readyz. test/ui has the same cross-site attacks from
// a real browser, test/e2e the ones that need the daemon.

func withListen(addr string, allowed ...string) envOption {
	return func(p *Params, o *ops.Params, _ *redis.Options) { p.Listen, p.AllowedHosts = addr, allowed }
}

// raw sends a request with the given headers (Host included) and no token
// unless given among them.
func (e *env) raw(method, path, body string, header map[string]string) response {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, e.url+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	for k, v := range header {
		if k == "Host" {
			req.Host = v
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// deadFixture keeps one rejected message "dead-1" and returns the store's
// dead count.
func deadFixture(t *testing.T, e *env) {
	t.Helper()
	m := &envelope.Message{ID: "dead-1", DueAt: time.Now().Truncate(time.Millisecond), Sink: "rabbit", Destination: "q",
		Body: []byte("b"), IngestedAt: time.Now().Truncate(time.Millisecond)}
	if _, err := e.store.Reject(context.Background(), []store.Rejected{{Message: m, Reason: "x-delay \"soon\""}}); err != nil {
		t.Fatal(err)
	}
}

func (e *env) counts() (parked, dead int64) {
	e.t.Helper()
	st, err := e.store.Stats(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	return st.Parked, st.Dead
}

// TestCrossSiteRequestsRefused: without a token (and with one), a
// state-changing request that a browser marks as cross-origin, or whose body
// is not JSON, changes nothing; the same request from the server's own
// origin, or from a client that is not a browser, works.
func TestCrossSiteRequestsRefused(t *testing.T) {
	for _, token := range []string{"", testToken} {
		t.Run("token="+token, func(t *testing.T) {
			e := newEnv(t, withToken(token), withListen("127.0.0.1:7070"))
			deadFixture(t, e)
			host := strings.TrimPrefix(e.url, "http://")
			auth := map[string]string{}
			if token != "" {
				auth["Authorization"] = "Bearer " + token
			}
			with := func(extra map[string]string) map[string]string {
				h := map[string]string{}
				for k, v := range auth {
					h[k] = v
				}
				for k, v := range extra {
					h[k] = v
				}
				return h
			}
			post := `{"id":"csrf","delay":"1h","sink":"rabbit","destination":"q","body":"x"}`
			refused := []struct {
				name, method, path, body string
				header                   map[string]string
				status                   int
			}{
				{"no-cors text/plain POST", "POST", "/v1/messages", post, map[string]string{
					"Content-Type": "text/plain", "Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}, 403},
				{"same-site but other origin", "POST", "/v1/messages", post, map[string]string{
					"Content-Type": "application/json", "Origin": "http://127.0.0.1:1", "Sec-Fetch-Site": "same-site"}, 403},
				{"old browser: Origin only", "POST", "/v1/messages", post, map[string]string{
					"Content-Type": "application/json", "Origin": "http://evil.example"}, 403},
				{"Origin null", "POST", "/v1/messages", post, map[string]string{"Content-Type": "application/json", "Origin": "null"}, 403},
				{"form post", "POST", "/v1/messages", post, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415},
				{"text/plain without Origin", "POST", "/v1/messages", post, map[string]string{"Content-Type": "text/plain"}, 415},
				{"body without Content-Type", "POST", "/v1/messages", post, nil, 415},
				{"cross-site retry", "POST", "/v1/dead/dead-1/retry", "", map[string]string{
					"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}, 403},
				{"retry with a text body", "POST", "/v1/dead/dead-1/retry", "x", map[string]string{"Content-Type": "text/plain"}, 415},
				{"cross-site delete", "DELETE", "/v1/dead/dead-1", "", map[string]string{"Sec-Fetch-Site": "cross-site"}, 403},
			}
			for _, c := range refused {
				r := e.raw(c.method, c.path, c.body, with(c.header))
				if r.status != c.status {
					t.Errorf("%s: %d, want %d: %s", c.name, r.status, c.status, r.body)
					continue
				}
				r.errorText(t)
			}
			if parked, dead := e.counts(); parked != 0 || dead != 1 {
				t.Fatalf("after the refused requests: parked %d, dead %d; want 0 and 1", parked, dead)
			}
			// The dashboard's own requests, and clients that are not browsers.
			r := e.raw("POST", "/v1/messages", post, with(map[string]string{
				"Content-Type": "application/json; charset=utf-8", "Origin": "http://" + host, "Sec-Fetch-Site": "same-origin"}))
			e.expect(r, 201)
			r = e.raw("POST", "/v1/dead/dead-1/retry", "", with(map[string]string{"Origin": "http://" + host}))
			e.expect(r, 204)
			r = e.raw("DELETE", "/v1/messages/csrf", "", with(nil))
			e.expect(r, 204)
			if parked, dead := e.counts(); parked != 1 || dead != 0 {
				t.Errorf("after the allowed requests: parked %d, dead %d; want 1 and 0", parked, dead)
			}
		})
	}
}

// TestHostGuard: on loopback only the loopback names (and the listen host)
// are answered, on every path, so that a rebound DNS name cannot read
// anything; allowed_hosts replaces them; a public listen address answers
// any Host unless allowed_hosts is set.
func TestHostGuard(t *testing.T) {
	port := strings.TrimPrefix(newEnv(t).url, "http://127.0.0.1:") // any port: only the name is compared
	cases := []struct {
		name    string
		listen  string
		allowed []string
		ok      []string
		refused []string
	}{
		{"loopback default", "127.0.0.1:7070", nil,
			[]string{"127.0.0.1", "127.0.0.1:" + port, "localhost:7070", "LOCALHOST.", "[::1]:7070"},
			[]string{"evil.example:7070", "evil.example", "127.0.0.2:7070", "localhost.evil.example"}},
		{"localhost listen", "localhost:7070", nil, []string{"localhost:7070", "127.0.0.1"}, []string{"rebound.example"}},
		{"allowed_hosts", "127.0.0.1:7070", []string{"admin.example.com"},
			[]string{"admin.example.com", "ADMIN.example.com:443"}, []string{"127.0.0.1", "localhost", "evil.example"}},
		{"public listen", "0.0.0.0:7070", nil, []string{"anything.example", "10.0.0.7:7070"}, nil},
		{"public listen, allowed_hosts", ":7070", []string{"delaybridge.internal", "10.0.0.7"},
			[]string{"delaybridge.internal:7070", "10.0.0.7"}, []string{"evil.example"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, withListen(c.listen, c.allowed...))
			for _, h := range c.ok {
				for _, path := range []string{"/v1/stats", "/healthz"} {
					if r := e.raw("GET", path, "", map[string]string{"Host": h}); r.status != 200 {
						t.Errorf("Host %q %s: %d, want 200: %s", h, path, r.status, r.body)
					}
				}
			}
			for _, h := range c.refused {
				for _, path := range []string{"/v1/stats", "/v1/dead", "/readyz", "/metrics", "/", "/v1/messages/x"} {
					r := e.raw("GET", path, "", map[string]string{"Host": h})
					if r.status != http.StatusForbidden {
						t.Errorf("Host %q %s: %d, want 403: %.200s", h, path, r.status, r.body)
						continue
					}
					if msg := r.errorText(t); !strings.Contains(msg, "admin.allowed_hosts") {
						t.Errorf("Host %q: reason %q does not say what to do", h, msg)
					}
				}
				r := e.raw("POST", "/v1/messages", `{"delay":1,"sink":"rabbit","destination":"q","body":""}`,
					map[string]string{"Host": h, "Content-Type": "application/json"})
				if r.status != http.StatusForbidden {
					t.Errorf("Host %q POST: %d, want 403", h, r.status)
				}
			}
			if parked, _ := e.counts(); parked != 0 {
				t.Errorf("a request with a refused Host parked a message")
			}
		})
	}
}

// TestContentOnlyWithTokenAndAsked: the key and the headers are content,
// like the body: absent unless ?body=true, and ?body=true needs a token.
// The contract's fields are always there.
func TestContentOnlyWithTokenAndAsked(t *testing.T) {
	post := `{"id":"m1","delay":"1h","sink":"rabbit","destination":"q","key":"customer-7",
		"headers":{"authorization":"Bearer for-the-consumer","x-trace":"t1"},"body":"secret body"}`
	secrets := []string{"customer-7", "for-the-consumer", "t1", "secret body", "authorization"}
	contract := []string{"id", "state", "due_at", "sink", "destination", "attempts"}
	check := func(t *testing.T, r response, wantContent bool) {
		t.Helper()
		m := r.json(t)
		for _, k := range contract {
			if _, ok := m[k]; !ok {
				t.Errorf("%s missing: %s", k, r.body)
			}
		}
		for _, s := range secrets {
			if got := strings.Contains(string(r.body), s); got != wantContent {
				t.Errorf("content %q shown: %v, want %v: %s", s, got, wantContent, r.body)
			}
		}
	}
	t.Run("no token", func(t *testing.T) {
		e := newEnv(t)
		e.post(post)
		r := e.do("GET", "/v1/messages/m1", "")
		e.expect(r, 200)
		check(t, r, false)
		r = e.do("GET", "/v1/messages/m1?body=true", "")
		e.expect(r, http.StatusForbidden)
		if strings.Contains(string(r.body), "customer-7") {
			t.Errorf("403 shows content: %s", r.body)
		}
	})
	t.Run("token", func(t *testing.T) {
		e := newEnv(t, withToken(testToken))
		e.post(post)
		r := e.do("GET", "/v1/messages/m1", "")
		e.expect(r, 200)
		check(t, r, false)
		r = e.do("GET", "/v1/messages/m1?body=true", "")
		e.expect(r, 200)
		check(t, r, true)
		if m := r.json(t); m["key"] != "customer-7" || fmt.Sprint(m["headers"]) != "map[authorization:Bearer for-the-consumer x-trace:t1]" {
			t.Errorf("content: %s", r.body)
		}
	})
}

// TestPprofNeedsToken: a server told to serve pprof without a token does
// not serve it (config validation refuses the file before that).
func TestPprofNeedsToken(t *testing.T) {
	e := newEnv(t, func(p *Params, o *ops.Params, _ *redis.Options) { p.Pprof = true })
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/goroutine?debug=2", "/debug/pprof/heap", "/debug/pprof/cmdline"} {
		r := e.doAuth("GET", path, "", "")
		if r.status != http.StatusNotFound {
			t.Errorf("GET %s without a token configured: %d, want 404", path, r.status)
		}
	}
	if !strings.Contains(e.logs.String(), "pprof is not served") {
		t.Errorf("no warning logged:\n%s", e.logs.String())
	}
}

// TestDeceptiveIDsRefused: an ID with a C1 control or a bidi override or
// isolate is refused when posted and when named in a path (400, with the
// character named); one stored before the rule is listed with the
// character escaped in the JSON, and decodes to the same ID.
func TestDeceptiveIDsRefused(t *testing.T) {
	e := newEnv(t, withToken(testToken))
	for _, id := range []string{"invoice-\u202egpj.exe", "a\u0085b", "x\u009b31m", "\u2066order\u2069", "\u202aorder"} {
		// Once as JSON escapes, once as raw UTF-8.
		for _, quoted := range []string{fmt.Sprintf("%q", id), `"` + id + `"`} {
			r := e.do("POST", "/v1/messages", `{"id":`+quoted+`,"delay":"1h","sink":"rabbit","destination":"q","body":""}`)
			e.expect(r, 400)
			if msg := r.errorText(t); !strings.Contains(msg, "id contains the control character U+") {
				t.Errorf("POST id %s: reason %q", quoted, msg)
			}
		}
		esc := url.PathEscape(id)
		for _, rq := range []struct{ method, path string }{
			{"GET", "/v1/messages/" + esc}, {"DELETE", "/v1/messages/" + esc}, {"GET", "/v1/dead/" + esc},
			{"POST", "/v1/dead/" + esc + "/retry"}, {"DELETE", "/v1/dead/" + esc},
		} {
			r := e.do(rq.method, rq.path, "")
			if r.status != 400 {
				t.Errorf("%s %s: %d, want 400", rq.method, rq.path, r.status)
				continue
			}
			if msg := r.errorText(t); !strings.Contains(msg, "control character U+") || !strings.Contains(msg, "the message ID") {
				t.Errorf("%s %s: reason %q", rq.method, rq.path, msg)
			}
		}
	}
	if parked, _ := e.counts(); parked != 0 {
		t.Fatalf("a deceptive ID was parked")
	}
	// Stored by an older version: listed, escaped in the JSON text.
	legacy := "paid-\u202e0001"
	m := &envelope.Message{ID: legacy, DueAt: time.Now().Truncate(time.Millisecond), Sink: "rabbit", Destination: "q"}
	if _, err := e.store.Reject(context.Background(), []store.Rejected{{Message: m, Reason: "old"}}); err != nil {
		t.Fatal(err)
	}
	r := e.do("GET", "/v1/dead", "")
	e.expect(r, 200)
	if strings.ContainsRune(string(r.body), '\u202e') || !strings.Contains(string(r.body), `paid-\u202e0001`) {
		t.Errorf("the dead list shows the override raw: %s", r.body)
	}
	var list []DeadView
	if err := json.Unmarshal(r.body, &list); err != nil || len(list) != 1 || list[0].ID != legacy {
		t.Errorf("escaped ID does not decode to the stored one: %v %+v", err, list)
	}
	// Invisible characters an ID may hold are accepted, and escaped
	// wherever the ID is shown: "victim" followed by a zero-width space
	// does not show as "victim".
	r = e.do("POST", "/v1/messages", `{"id":"victim\u200b","delay":"1h",`+`"sink":"rabbit","destination":"q","body":""}`)
	e.expect(r, 201)
	if strings.ContainsRune(string(r.body), '\u200b') || !strings.Contains(string(r.body), `victim\u200b`) {
		t.Errorf("the answer shows the zero-width space raw: %s", r.body)
	}
	if got := r.json(t)["id"]; got != "victim\u200b" {
		t.Errorf("the escaped ID decodes to %q", got)
	}
}

// TestStrictJSON: exact field names, no repeated key at any depth, valid
// UTF-8 without lone surrogates; nothing of it parked.
func TestStrictJSON(t *testing.T) {
	e := newEnv(t, withToken(testToken))
	const tail = `"sink":"rabbit","destination":"q","body":"x"`
	cases := []struct{ name, body, want string }{
		{"upper-case id", `{"ID":"a","delay":1,` + tail + `}`, `unknown field "ID": field names are case-sensitive; did you mean "id"?`},
		{"mixed-case delay", `{"Delay":1,` + tail + `}`, `did you mean "delay"?`},
		{"mixed-case body", `{"delay":1,"sink":"rabbit","destination":"q","Body":"x"}`, `did you mean "body"?`},
		{"repeated id", `{"id":"a","id":"b","delay":1,` + tail + `}`, `field "id" is given twice`},
		{"repeated delay", `{"delay":"1h","delay":1,` + tail + `}`, `field "delay" is given twice`},
		{"repeated id, once escaped", `{"id":"a","\u0069d":"b","delay":1,` + tail + `}`, `field "id" is given twice`},
		{"escaped upper-case name", `{"\u0049D":"a","delay":1,` + tail + `}`, `did you mean "id"?`},
		{"unknown field", `{"delay":1,"dely":2,` + tail + `}`, `unknown field "dely"; known: body, body_base64, count, cron, delay, deliver_at, destination, every, group, headers, id, key, priority, replace, sink, timezone, until`},
		{"repeated header", `{"delay":1,"headers":{"x-a":"1","x-a":"2"},` + tail + `}`, `field "headers.x-a" is given twice`},
		{"header in two cases", `{"delay":1,"headers":{"x-a":"1","X-A":"2"},` + tail + `}`, `name the same header`},
		{"invalid UTF-8 body", "{\"delay\":1,\"sink\":\"rabbit\",\"destination\":\"q\",\"body\":\"a\xffb\"}", "not valid UTF-8 (at byte 54)"},
		{"invalid UTF-8 header", "{\"delay\":1,\"headers\":{\"x-a\":\"\xc3\"}," + tail + "}", "not valid UTF-8"},
		{"invalid UTF-8 key", "{\"delay\":1,\"headers\":{\"x-\xfe\":\"v\"}," + tail + "}", "not valid UTF-8"},
		{"lone high surrogate", `{"delay":1,"sink":"rabbit","destination":"q","body":"a\ud800b"}`, `lone UTF-16 surrogate \ud800`},
		{"lone low surrogate", `{"delay":1,"sink":"rabbit","destination":"q","body":"\udc00"}`, `lone UTF-16 surrogate \udc00`},
		{"reversed pair", `{"delay":1,"sink":"rabbit","destination":"q","body":"\udc00\ud800"}`, `lone UTF-16 surrogate`},
		{"surrogate in a header", `{"delay":1,"headers":{"x":"\ud83d"},` + tail + `}`, `lone UTF-16 surrogate`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := e.do("POST", "/v1/messages", c.body)
			if r.status != 400 {
				t.Fatalf("%d, want 400: %s", r.status, r.body)
			}
			if msg := r.errorText(t); !strings.Contains(msg, c.want) {
				t.Errorf("reason %q does not contain %q", msg, c.want)
			}
		})
	}
	if parked, _ := e.counts(); parked != 0 {
		t.Fatalf("a refused request parked a message")
	}
	// What stays valid: escapes of real characters, a surrogate pair, an
	// escaped backslash before a "u", and JSON's own escapes in names.
	id := e.post(`{"id":"ok","delay":1,"sink":"rabbit","destination":"q","body":"\ud83d\ude00 \\ud800 \u00e9 \"q\"","headers":{"x-\u0061":"\u00e9"}}`)
	info, err := e.store.Inspect(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(info.Message.Body); got != "😀 \\ud800 é \"q\"" {
		t.Errorf("body %q", got)
	}
	if v, _ := info.Message.Headers.Get("x-a"); v != "é" {
		t.Errorf("headers %v", info.Message.Headers)
	}
}

// TestReadyzAddressesOnlyWithToken: the reason is always there; the
// addresses in it only for a caller with the token.
func TestReadyzAddressesOnlyWithToken(t *testing.T) {
	reason := errors.New("redis: dial tcp 10.1.2.3:6379: connect: connection refused; " +
		"sink out: nats: no servers available for connection (nats://user@nats.internal:4222); " +
		"ingest in: kafka: dial tcp [fd00::7]:9092: i/o timeout")
	e := newEnv(t, withToken(testToken), withReady(func() error { return reason }))
	for _, auth := range []string{"", "Bearer wrong"} {
		r := e.doAuth("GET", "/readyz", "", auth)
		e.expect(r, http.StatusServiceUnavailable)
		got := r.json(t)["error"].(string)
		want := "redis: dial tcp <address>: connect: connection refused; " +
			"sink out: nats: no servers available for connection (nats://<address>); " +
			"ingest in: kafka: dial tcp <address>: i/o timeout"
		if got != want {
			t.Errorf("Authorization %q: reason\n%q, want\n%q", auth, got, want)
		}
	}
	r := e.do("GET", "/readyz", "")
	e.expect(r, http.StatusServiceUnavailable)
	if got := r.json(t)["error"]; got != reason.Error() {
		t.Errorf("with the token: %q", got)
	}
}

func TestRedactAddresses(t *testing.T) {
	for in, want := range map[string]string{
		"redis: dial tcp 127.0.0.1:6379: connect: connection refused":            "redis: dial tcp <address>: connect: connection refused",
		"dial tcp: lookup redis.internal on 10.0.0.2:53: no such host":           "dial tcp: lookup <address> on <address>: no such host",
		"dial tcp [::1]:5672: connection refused":                                "dial tcp <address>: connection refused",
		"amqp://guest:***@rabbit.svc:5672/vhost unreachable":                     "amqp://<address> unreachable",
		"kafka broker kafka-0.kafka.svc.cluster.local:9092 unreachable":          "kafka broker <address> unreachable",
		"MOVED 3999 10.0.0.5:6380":                                               "MOVED 3999 <address>",
		"x509: certificate is valid for a.internal, b.internal, not redis.local": "x509: certificate is valid for other names",
		"connect to fe80::1%eth0 failed":                                         "connect to <address>%eth0 failed",
		"ingest orders: paused: limits.max_parked_messages 1000 reached":         "ingest orders: paused: limits.max_parked_messages 1000 reached",
		"sink out: not connected (last error: nats: timeout)":                    "sink out: not connected (last error: nats: timeout)",
	} {
		if got := redactAddresses(in); got != want {
			t.Errorf("redactAddresses(%q)\n = %q\nwant %q", in, got, want)
		}
	}
	// The configured addresses go whatever their form, as the daemon's own
	// reason names them (a named port, sentinels: the patterns take none
	// for an address), each with the whole name it is a part of; so does a
	// port alone after a host.
	named := []string{"redis.internal:redis", "sentinel-a:sentinel", "sentinel-a:sentinel-tls"}
	numbered := []string{"redis.internal:6379", ":6380"}
	for _, c := range []struct {
		configured []string
		in, want   string
	}{
		{named, "redis: no answer from redis.internal:redis within 1s: context deadline exceeded", "redis: no answer from <address> within 1s: context deadline exceeded"},
		{named, `redis: no answer from master "m" via sentinels [sentinel-a:sentinel-tls sentinel-a:sentinel] within 1s`, `redis: no answer from master "m" via sentinels [<address> <address>] within 1s`},
		{named, "redis: dial tcp 10.0.0.5:6379: connect: connection refused", "redis: dial tcp <address>: connect: connection refused"},
		{named, "dial tcp shard-0.redis.internal:redis: i/o timeout", "dial tcp <address>: i/o timeout"},
		{named, "redis.internal:redis2 goes on as a longer name", "<address> goes on as a longer name"},
		{named, "sentinel-a:sentinel-x:1-sentinel-a:sentinel", "<address>"},
		{numbered, "dial tcp shard-0.redis.internal:6379: i/o timeout", "dial tcp <address>: i/o timeout"},
		{numbered, "sink out: nats.internal:6380 unreachable", "sink out: <address> unreachable"},
		{numbered, "redis: dial tcp :6380: connection refused", "redis: dial tcp <address>: connection refused"},
		{numbered, "redis: no answer from redis.internal:6379.", "redis: no answer from <address>."},
	} {
		if got := redactAddresses(c.in, c.configured...); got != c.want {
			t.Errorf("redactAddresses(%q, %q)\n = %q\nwant %q", c.in, c.configured, got, c.want)
		}
	}
}

// TestNestedBodiesRefused: a body nested past jsonlimit.MaxDepth is a 400
// too_deep on every route that reads one, at a cost in memory linear in
// its size (the decoder once built a path per level, quadratic in the
// depth: a 40 KB body of nested arrays took gigabytes), and the answer
// quotes none of it.
func TestNestedBodiesRefused(t *testing.T) {
	e := newEnv(t, withToken(testToken), withLimits(envelope.Limits{MaxDelay: time.Hour, MaxPayloadBytes: 1 << 20, MaxHeaderBytes: 64 << 10, MaxIDBytes: 200}))
	nest := func(depth int) string {
		return `{"delay":1,"headers":` + strings.Repeat("[", depth) + strings.Repeat("]", depth) + `}`
	}
	routes := []struct{ method, path string }{
		{"POST", "/v1/messages"}, {"PATCH", "/v1/messages/m-1"}, {"POST", "/v1/dead/m-1/retry"},
	}
	for _, rt := range routes {
		for _, depth := range []int{65, 20_000} {
			t.Run(fmt.Sprintf("%s %s depth %d", rt.method, rt.path, depth), func(t *testing.T) {
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				r := e.do(rt.method, rt.path, nest(depth))
				runtime.ReadMemStats(&after)
				if r.status != http.StatusBadRequest {
					t.Fatalf("%d, want 400: %.300s", r.status, r.body)
				}
				if code, _ := r.json(t)["code"].(string); code != "too_deep" {
					t.Errorf("code %q, want too_deep: %s", code, r.body)
				}
				if len(r.body) > 1024 {
					t.Errorf("the answer is %d bytes", len(r.body))
				}
				// The server runs in this process: what it allocated for
				// the request, with the client's copies, stays within a
				// small multiple of the body.
				if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
					t.Errorf("the request allocated %d MB", grew>>20)
				}
			})
		}
	}
	// At the limit it is decoded as usual: the headers field refuses an
	// array, naming the field.
	r := e.do("POST", "/v1/messages", `{"delay":1,"sink":"rabbit","destination":"q","body":"x","headers":`+
		strings.Repeat("[", jsonlimit.MaxDepth-1)+strings.Repeat("]", jsonlimit.MaxDepth-1)+`}`)
	if r.status != http.StatusBadRequest || r.json(t)["code"] != nil {
		t.Fatalf("at the limit: %d %s", r.status, r.body)
	}
	if parked, _ := e.counts(); parked != 0 {
		t.Fatalf("a refused request parked a message")
	}
}

// TestErrorsQuoteLittle: an unknown field name, a wrong value or a path of
// any length is quoted in a few dozen bytes, never echoed whole.
func TestErrorsQuoteLittle(t *testing.T) {
	e := newEnv(t, withToken(testToken))
	long := strings.Repeat("k", 60_000)
	for name, body := range map[string]string{
		"unknown field":      `{"` + long + `":1}`,
		"repeated header":    `{"delay":1,"headers":{"` + long + `":"1","` + long + `":"2"}}`,
		"long number":        `{"delay":"x","priority":` + strings.Repeat("9", 60_000) + `}`,
		"deep unknown field": `{"delay":1,"headers":{"a":{"` + long + `":1}}}`,
		"delay of a type":    `{"delay":{"x":"` + long + `"},"sink":"rabbit","destination":"q","body":"x"}`,
		"deliver_at array":   `{"deliver_at":["` + long + `"],"sink":"rabbit","destination":"q","body":"x"}`,
		"delay":              `{"delay":"` + long + `","sink":"rabbit","destination":"q","body":"x"}`,
		"cron descriptor":    `{"delay":1,"cron":"@` + long + `","sink":"rabbit","destination":"q","body":"x"}`,
		"cron fields":        `{"delay":1,"cron":"` + strings.Repeat("k ", 20_000) + `","sink":"rabbit","destination":"q","body":"x"}`,
		"cron field":         `{"delay":1,"cron":"` + long + ` * * * *","sink":"rabbit","destination":"q","body":"x"}`,
		"every":              `{"delay":1,"every":"` + long + `","sink":"rabbit","destination":"q","body":"x"}`,
		"timezone":           `{"delay":1,"cron":"@hourly","timezone":"` + long + `","sink":"rabbit","destination":"q","body":"x"}`,
		"until":              `{"delay":1,"every":"1h","until":"` + long + `","sink":"rabbit","destination":"q","body":"x"}`,
		"sink":               `{"delay":1,"sink":"` + long + `","destination":"q","body":"x"}`,
		"destination":        `{"delay":1,"sink":"rabbit","destination":"` + long + `","body":"x"}`,
	} {
		t.Run(name, func(t *testing.T) {
			r := e.do("POST", "/v1/messages", body)
			if r.status != http.StatusBadRequest {
				t.Fatalf("%d, want 400: %.300s", r.status, r.body)
			}
			if len(r.body) > 1024 || strings.Contains(string(r.body), strings.Repeat("k", 257)) {
				t.Errorf("the answer is %d bytes: %.300s", len(r.body), r.body)
			}
		})
	}
}

// TestJSONContentTypes: application/json is read whatever its case and
// parameters, and an answer never echoes a Content-Type whole.
func TestJSONContentTypes(t *testing.T) {
	e := newEnv(t, withToken(testToken))
	body := `{"delay":"1h","sink":"rabbit","destination":"q","body":"x"}`
	for _, ct := range []string{"APPLICATION/JSON; charset=" + strings.Repeat("k", 2000), "application/json ;charset=utf-8", "Application/Json"} {
		r := e.raw("POST", "/v1/messages", body, map[string]string{"Content-Type": ct, "Authorization": bearer(testToken)})
		if r.status != http.StatusCreated || strings.Contains(string(r.body), strings.Repeat("k", 257)) {
			t.Errorf("Content-Type %.40s...: %d, %d bytes: %.300s", ct, r.status, len(r.body), r.body)
		}
	}
}

// TestLongIDsRefusedUnechoed: an ID or group key in a path longer than
// limits.max_id_bytes is a 400 on every route that takes one, and no
// answer echoes it: a 100 KB ID once came back whole in a 102 KB 404.
// Other answers that name what was sent (an unknown sink, path, method or
// query parameter, a parameter's value) quote a few dozen bytes of it.
func TestLongIDsRefusedUnechoed(t *testing.T) {
	e := newEnv(t, withToken(testToken), withLimits(envelope.Limits{MaxDelay: time.Hour, MaxPayloadBytes: 1 << 20, MaxHeaderBytes: 64 << 10, MaxIDBytes: 256}))
	long := strings.Repeat("i", 100<<10)
	smallAnswer := func(t *testing.T, r response) {
		t.Helper()
		if len(r.body) >= 1024 || strings.Contains(string(r.body), strings.Repeat("i", 257)) {
			t.Errorf("the answer is %d bytes: %.300s", len(r.body), r.body)
		}
	}
	for _, rt := range []struct{ method, path, body string }{
		{"GET", "/v1/messages/" + long, ""},
		{"PATCH", "/v1/messages/" + long, `{"delay":1000}`},
		{"DELETE", "/v1/messages/" + long, ""},
		{"POST", "/v1/messages/" + long + "/fire", ""},
		{"GET", "/v1/dead/" + long, ""},
		{"DELETE", "/v1/dead/" + long, ""},
		{"POST", "/v1/dead/" + long + "/retry", `{}`},
		{"GET", "/v1/groups/" + long, ""},
		{"DELETE", "/v1/groups/" + long, ""},
	} {
		t.Run(rt.method+" "+strings.Replace(rt.path, long, "{100 KB}", 1), func(t *testing.T) {
			r := e.do(rt.method, rt.path, rt.body)
			if r.status != http.StatusBadRequest {
				t.Fatalf("%d, want 400: %.300s", r.status, r.body)
			}
			if got := r.errorText(t); !strings.Contains(got, "limits.max_id_bytes") {
				t.Errorf("the reason does not name the limit: %q", got)
			}
			smallAnswer(t, r)
		})
	}
	// At the limit an ID is looked up as usual, and its 404 quotes little.
	atLimit := strings.Repeat("i", 256)
	for _, path := range []string{"/v1/messages/" + atLimit, "/v1/dead/" + atLimit, "/v1/groups/" + atLimit} {
		r := e.do("GET", path, "")
		if r.status != http.StatusNotFound {
			t.Fatalf("GET %s...: %d, want 404: %.300s", path[:20], r.status, r.body)
		}
		smallAnswer(t, r)
	}
	for name, rt := range map[string]struct{ method, path string }{
		"unknown sink":            {"GET", "/v1/sinks/" + long},
		"unknown path":            {"GET", "/v2/" + long},
		"method not allowed":      {"PUT", "/v1/messages/" + long},
		"unknown query parameter": {"GET", "/v1/messages?" + long + "=1"},
		"limit not an integer":    {"GET", "/v1/dead?limit=" + long},
		"state":                   {"GET", "/v1/messages?state=" + long},
		"group filter":            {"GET", "/v1/messages?group=" + long},
	} {
		t.Run(name, func(t *testing.T) {
			r := e.do(rt.method, rt.path, "")
			if r.status < 400 {
				t.Fatalf("%d, want an error: %.300s", r.status, r.body)
			}
			smallAnswer(t, r)
		})
	}
}

// TestEmptyFiltersRefused: a filter given empty (?group=) or malformed is
// a 400 naming it on the dead list, the purge and the listings, never "no
// filter": DELETE /v1/dead?group= once purged every dead message.
func TestEmptyFiltersRefused(t *testing.T) {
	e := newEnv(t, withToken(testToken), withLimits(envelope.Limits{MaxDelay: time.Hour, MaxPayloadBytes: 1 << 20, MaxHeaderBytes: 64 << 10, MaxIDBytes: 256}))
	stateFixture(t, e) // three dead messages
	dead := func() int64 {
		t.Helper()
		st, err := e.store.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return st.Dead
	}
	var requests []string
	for _, p := range []string{"sink", "destination", "ingest", "group", "dead_after", "dead_before"} {
		for _, v := range []string{"=", ""} { // ?group= and ?group
			requests = append(requests, "DELETE /v1/dead?"+p+v, "GET /v1/dead?"+p+v)
		}
		requests = append(requests, "DELETE /v1/dead?ingest=orders-in&"+p+"=")
	}
	for _, p := range []string{"sink", "destination", "ingest", "group", "state", "due_after", "due_before", "cursor", "limit", "recurring", "body"} {
		requests = append(requests, "GET /v1/messages?"+p+"=")
	}
	for _, p := range []string{"sink", "destination", "ingest", "state", "cursor", "limit"} {
		requests = append(requests, "GET /v1/groups/g?"+p+"=")
	}
	requests = append(requests, "GET /v1/dead?limit=", "GET /v1/messages/A?body=", "GET /v1/groups/no-such-group?limit=0")
	// Malformed: blank, a control character, a group over max_id_bytes.
	for _, q := range []string{"sink=%20", "destination=%09", "ingest=a%00b", "group=g%E2%80%AE", "group=" + strings.Repeat("g", 257), "dead_after=soon"} {
		requests = append(requests, "DELETE /v1/dead?"+q, "GET /v1/dead?"+q)
	}
	for _, q := range []string{"sink=%20", "group=%01", "group=" + strings.Repeat("g", 257)} {
		requests = append(requests, "GET /v1/messages?"+q)
	}
	for _, req := range requests {
		method, path, _ := strings.Cut(req, " ")
		r := e.do(method, path, "")
		if r.status != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400: %.300s", req, r.status, r.body)
			continue
		}
		if field, _ := r.json(t)["field"].(string); field == "" || !strings.Contains(path, field) {
			t.Errorf("%s: the answer names the field %q: %s", req, field, r.body)
		}
	}
	// Not validly URL-encoded: the value would reach the operation empty.
	for _, req := range []string{"DELETE /v1/dead?ingest=%zz", "DELETE /v1/dead?group=%ZZ", "DELETE /v1/dead?dead_before=%",
		"DELETE /v1/dead?group=a;b", "GET /v1/messages?group=%zz", "GET /v1/messages?state=%", "GET /v1/groups/g?state=%zz"} {
		method, path, _ := strings.Cut(req, " ")
		if r := e.do(method, path, ""); r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "not validly URL-encoded") {
			t.Errorf("%s: %d, want 400 saying the query is not validly URL-encoded: %.300s", req, r.status, r.body)
		}
	}
	// A query of nothing, what a script's empty filters make, is no
	// filter given: refused, not read as none.
	for _, req := range []string{"DELETE /v1/dead?", "DELETE /v1/dead?&", "DELETE /v1/dead?&&&", "GET /v1/messages?&", "GET /v1/dead?"} {
		method, path, _ := strings.Cut(req, " ")
		if r := e.do(method, path, ""); r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "no parameter") {
			t.Errorf("%s: %d, want 400 saying the query has no parameter: %.300s", req, r.status, r.body)
		}
	}
	// A filter in a body is not read: the purge is refused, not made of
	// every dead message.
	for _, body := range []string{`{"group":"none"}`, `{}`} {
		if r := e.do("DELETE", "/v1/dead", body); r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "query") {
			t.Errorf("DELETE /v1/dead with the body %s: %d, want 400 saying filters go in the query: %.300s", body, r.status, r.body)
		}
	}
	if r := e.do("DELETE", "/v1/messages/A", `{"x":1}`); r.status != http.StatusBadRequest {
		t.Errorf("DELETE /v1/messages/A with a body: %d, want 400: %.300s", r.status, r.body)
	}
	if n := dead(); n != 3 {
		t.Fatalf("%d dead messages left after refused purges, want 3", n)
	}
	// A filter with a value still selects, and no filter purges every one.
	e.expect(e.do("DELETE", "/v1/dead?group=none", ""), 200)
	if n := dead(); n != 3 {
		t.Fatalf("a purge of group none left %d, want 3", n)
	}
	r := e.do("DELETE", "/v1/dead", "")
	e.expect(r, 200)
	if n := dead(); n != 0 || r.json(t)["deleted"] != 3.0 {
		t.Fatalf("a purge without filters: %s, %d left", r.body, n)
	}
}

// POST /v1/messages with the ID of an ingest's message is refused (409
// id_taken), and the ingest's message stays as it was: the API is a source
// of its own.
func TestPostOfAnotherSourcesIDRefused(t *testing.T) {
	e := newEnv(t, withToken(testToken))
	m := &envelope.Message{ID: "order-7", DueAt: time.Now().Add(time.Hour).Truncate(time.Millisecond), Ingest: "orders",
		Sink: "rabbit", Destination: "q", Body: []byte("theirs")}
	if _, err := e.store.Park(context.Background(), []*envelope.Message{m}); err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{`{"id":"order-7","delay":1000,"sink":"rabbit","destination":"q","body":"mine"}`,
		`{"id":"order-7","replace":true,"delay":1000,"sink":"rabbit","destination":"q","body":"mine"}`} {
		r := e.do("POST", "/v1/messages", body)
		if r.status != http.StatusConflict || !strings.Contains(r.errorText(t), "id_taken") {
			t.Fatalf("%s: %d %s", body, r.status, r.body)
		}
	}
	info, err := e.store.Inspect(context.Background(), "order-7")
	if err != nil || string(info.Message.Body) != "theirs" {
		t.Fatalf("order-7: %+v %v", info, err)
	}
}

// Redis refusing a command for a state that passes (here a master made a
// replica, READONLY; CLUSTERDOWN, TRYAGAIN, LOADING and MASTERDOWN alike)
// is answered 503 with Retry-After, as a Redis out of reach is: the
// probe of a failover saw 500s.
func TestRedisRefusingForAMomentIs503(t *testing.T) {
	e := newEnv(t)
	master := testenv.Redis(t)
	host, port, _ := strings.Cut(master.Addr, ":")
	if err := e.redis.Client().Do(context.Background(), "REPLICAOF", host, port).Err(); err != nil {
		t.Fatal(err)
	}
	for _, req := range []string{"DELETE /v1/messages/x", "POST /v1/messages", "DELETE /v1/groups/g"} {
		method, path, _ := strings.Cut(req, " ")
		body := ""
		if method == "POST" {
			body = `{"sink":"rabbit","destination":"d","delay":"1h","body":"x"}`
		}
		r := e.do(method, path, body)
		if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" || !strings.Contains(string(r.body), "READONLY") {
			t.Errorf("%s on a master made a replica: %d %q %.300s, want 503 with Retry-After", req, r.status, r.header.Get("Retry-After"), r.body)
		}
	}
}
