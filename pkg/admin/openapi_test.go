package admin

// The OpenAPI document (generated from the code, openapi.go) against the
// server: every route the server registers is documented with its
// parameters and statuses, and every documented operation is served
// (TestOpenAPIRoutes); then real requests, valid and invalid, go to the
// real handlers on a real Redis and every request and answer is validated
// against the document with kin-openapi (TestOpenAPIAnswers), until every
// status of every route has been seen; openapi.json is the document as
// generated (TestOpenAPIFileIsGenerated).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/metrics"
	"github.com/delaybridge/delaybridge/pkg/ops"
	"github.com/delaybridge/delaybridge/pkg/store"
)

func init() {
	// The dashboard's files and multipart ranges are text to the
	// validator: their schemas are plain strings.
	for _, ct := range []string{"text/html", "text/css", "text/javascript", "image/svg+xml", "multipart/byteranges"} {
		openapi3filter.RegisterBodyDecoder(ct, openapi3filter.PlainBodyDecoder)
	}
}

// loadOpenAPI parses and validates the embedded document.
func loadOpenAPI(t *testing.T) *openapi3.T {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(OpenAPI())
	if err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("openapi.json is not a valid OpenAPI 3 document: %v", err)
	}
	return doc
}

// routeProblems compares the server's routes with the document, both ways:
// each route is an operation with the same path parameters, query
// parameters and statuses, and each operation is a route.
func routeProblems(doc *openapi3.T, routes []Route) []string {
	var problems []string
	served := map[string]bool{}
	for _, rt := range routes {
		key := rt.Method + " " + rt.Path
		served[key] = true
		item := doc.Paths.Value(rt.Path)
		if item == nil {
			problems = append(problems, key+": the path is not in the document")
			continue
		}
		op := item.GetOperation(rt.Method)
		if op == nil {
			problems = append(problems, key+": the method is not in the document")
			continue
		}
		query, path := docParams(item, op)
		if want := templateParams(rt.Path); !slices.Equal(path, want) {
			problems = append(problems, fmt.Sprintf("%s: path parameters %v documented, the route has %v", key, path, want))
		}
		if want := slices.Sorted(slices.Values(rt.Query)); !slices.Equal(query, want) {
			problems = append(problems, fmt.Sprintf("%s: query parameters %v documented, the route reads %v", key, query, want))
		}
		var documented []int
		for code := range op.Responses.Map() {
			var n int
			if _, err := fmt.Sscan(code, &n); err != nil {
				problems = append(problems, fmt.Sprintf("%s: response %q is not a status code", key, code))
				continue
			}
			documented = append(documented, n)
		}
		slices.Sort(documented)
		if !slices.Equal(documented, rt.Statuses) {
			problems = append(problems, fmt.Sprintf("%s: statuses %v documented, the route answers %v", key, documented, rt.Statuses))
		}
		secured := tokenRequired(doc, op)
		if needs := strings.HasPrefix(rt.Path, "/v1/") || strings.HasPrefix(rt.Path, "/debug/"); needs != secured {
			problems = append(problems, fmt.Sprintf("%s: documented with security %v, the route needs the token: %v", key, secured, needs))
		}
	}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			if !served[method+" "+path] {
				problems = append(problems, method+" "+path+": documented, not served")
			}
		}
	}
	slices.Sort(problems)
	return problems
}

// tokenRequired reports whether the document requires the bearer token
// for op: a security requirement, none of them empty (an empty one makes
// the token optional, as on /readyz).
func tokenRequired(doc *openapi3.T, op *openapi3.Operation) bool {
	reqs := doc.Security
	if op.Security != nil {
		reqs = *op.Security
	}
	return len(reqs) > 0 && !slices.ContainsFunc(reqs, func(r openapi3.SecurityRequirement) bool { return len(r) == 0 })
}

// docParams returns an operation's query and path parameter names, sorted.
func docParams(item *openapi3.PathItem, op *openapi3.Operation) (query, path []string) {
	for _, p := range append(slices.Clone(item.Parameters), op.Parameters...) {
		switch p.Value.In {
		case openapi3.ParameterInQuery:
			query = append(query, p.Value.Name)
		case openapi3.ParameterInPath:
			path = append(path, p.Value.Name)
		}
	}
	slices.Sort(query)
	slices.Sort(path)
	return query, path
}

var (
	templateParam = regexp.MustCompile(`\{([^}]+)\}`)
	quotedParam   = regexp.MustCompile(`\\\{[^}]+\\\}`)
)

func templateParams(path string) []string {
	var out []string
	for _, m := range templateParam.FindAllStringSubmatch(path, -1) {
		out = append(out, m[1])
	}
	slices.Sort(out)
	return out
}

// Every route is documented with its parameters and statuses, and every
// documented operation is served.
func TestOpenAPIRoutes(t *testing.T) {
	doc := loadOpenAPI(t)
	s := New(Params{Listen: "127.0.0.1:0", Token: "tok", Pprof: true, Metrics: metrics.New()})
	routes := s.Routes()
	if len(routes) < 30 {
		t.Fatalf("only %d routes recorded", len(routes))
	}
	for _, p := range routeProblems(doc, routes) {
		t.Error(p)
	}
}

// The comparison catches a route, a parameter or a status missing from the
// document, and an operation the server does not have.
func TestOpenAPIDriftIsCaught(t *testing.T) {
	routes := New(Params{Listen: "127.0.0.1:0", Token: "tok", Pprof: true, Metrics: metrics.New()}).Routes()
	// path is the document's path item, which this test changes.
	path := func(doc *openapi3.T, p string) *openapi3.PathItem {
		item := doc.Paths.Value(p)
		if item == nil {
			t.Fatalf("openapi.json has no path %s: this test needs it", p)
		}
		return item
	}
	for _, c := range []struct {
		name   string
		change func(doc *openapi3.T)
		want   string
	}{
		{"route", func(doc *openapi3.T) { path(doc, "/v1/messages/{id}/fire").Post = nil },
			"POST /v1/messages/{id}/fire: the method is not in the document"},
		{"path", func(doc *openapi3.T) { doc.Paths.Delete("/v1/stats") },
			"GET /v1/stats: the path is not in the document"},
		{"query parameter", func(doc *openapi3.T) {
			op := path(doc, "/v1/dead").Get
			op.Parameters = op.Parameters[:0]
		}, "GET /v1/dead: query parameters [] documented, the route reads [dead_after dead_before destination group ingest limit sink]"},
		{"path parameter", func(doc *openapi3.T) { path(doc, "/v1/groups/{key}").Delete.Parameters = nil },
			"DELETE /v1/groups/{key}: path parameters [] documented, the route has [key]"},
		{"status", func(doc *openapi3.T) { path(doc, "/v1/messages/{id}").Patch.Responses.Delete("409") },
			"PATCH /v1/messages/{id}: statuses [200 400 401 403 404 413 415 500 503] documented, the route answers [200 400 401 403 404 409 413 415 500 503]"},
		{"operation not served", func(doc *openapi3.T) {
			path(doc, "/v1/stats").Put = path(doc, "/v1/stats").Get
		}, "PUT /v1/stats: documented, not served"},
		{"security", func(doc *openapi3.T) { path(doc, "/v1/sinks").Get.Security = &openapi3.SecurityRequirements{} },
			"GET /v1/sinks: documented with security false, the route needs the token: true"},
	} {
		doc, err := openapi3.NewLoader().LoadFromData(OpenAPI())
		if err != nil {
			t.Fatal(err)
		}
		c.change(doc)
		if got := routeProblems(doc, routes); !slices.Contains(got, c.want) {
			t.Errorf("%s removed: problems %q, want %q among them", c.name, got, c.want)
		}
	}
}

// docExpect is what the document says of a request: kin-openapi's
// ValidateRequest must accept it, must refuse it, or either (a rule the
// document cannot express, such as the Host guard).
type docExpect int

const (
	docAccepts docExpect = iota
	docRefuses
	docEither
)

// withoutToken marks the context of a request to a server without a
// token, which needs none.
type withoutToken struct{}

// call is one request of TestOpenAPIAnswers and the status it must get.
type call struct {
	method, path, body string
	// header is sent as given; "Host" sets the Host, "Authorization" ""
	// sends none (by default the env's token is sent). A body is sent as
	// application/json unless Content-Type is given.
	header map[string]string
	status int
	doc    docExpect
}

// apiChecker sends calls and validates each request and answer against
// the document, remembering which status of which operation it saw.
type apiChecker struct {
	t    *testing.T
	doc  *openapi3.T
	opts *openapi3filter.Options

	mu   sync.Mutex
	seen map[string]bool // "METHOD /template STATUS"
}

func newAPIChecker(t *testing.T) *apiChecker {
	c := &apiChecker{t: t, doc: loadOpenAPI(t), seen: map[string]bool{}}
	c.opts = &openapi3filter.Options{
		IncludeResponseStatus:             true,
		RejectWhenRequestBodyNotSpecified: true,
		AuthenticationFunc: func(ctx context.Context, in *openapi3filter.AuthenticationInput) error {
			if ctx.Value(withoutToken{}) != nil {
				return nil // the server has no token: /v1/ is open
			}
			scheme, tok, _ := strings.Cut(in.RequestValidationInput.Request.Header.Get("Authorization"), " ")
			if !strings.EqualFold(scheme, "Bearer") || tok == "" {
				return errors.New("no bearer token")
			}
			return nil
		},
	}
	return c
}

// operation finds the documented operation of a request: among the
// templates that match the escaped path (a parameter is any run of
// characters, slashes included, as the server routes them) and document
// the method, the one with the most fixed characters. params are the
// parameters, unescaped.
func (c *apiChecker) operation(method, escapedPath string) (tpl string, op *openapi3.Operation, params map[string]string) {
	best := -1
	for path, item := range c.doc.Paths.Map() {
		o := item.GetOperation(method)
		if o == nil {
			continue
		}
		names := templateParam.FindAllStringSubmatch(path, -1)
		// QuoteMeta escapes the braces: replace the quoted form.
		re := "^" + quotedParam.ReplaceAllString(regexp.QuoteMeta(path), "(.*)") + "$"
		m := regexp.MustCompile(re).FindStringSubmatch(escapedPath)
		if m == nil {
			continue
		}
		// More fixed characters win; at a tie, the path without a
		// parameter ("/debug/pprof/" over "/debug/pprof/{profile}").
		score := 2 * len(templateParam.ReplaceAllString(path, ""))
		if len(names) == 0 {
			score++
		}
		if score <= best {
			continue
		}
		best, tpl, op, params = score, path, o, map[string]string{}
		for i, n := range names {
			v, err := url.PathUnescape(m[i+1])
			if err != nil {
				v = m[i+1]
			}
			params[n[1]] = v
		}
	}
	return tpl, op, params
}

// request builds the request of a call on base (the env's URL), with token.
func (k call) request(t *testing.T, base, token string) *http.Request {
	t.Helper()
	var body io.Reader
	if k.body != "" {
		body = strings.NewReader(k.body)
	}
	req, err := http.NewRequest(k.method, base+k.path, body)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if k.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for name, v := range k.header {
		switch {
		case name == "Host":
			req.Host = v
		case v == "":
			req.Header.Del(name)
		default:
			req.Header.Set(name, v)
		}
	}
	return req
}

var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// do sends a call to e and checks it: the request against the document as
// k.doc says, the status, and the answer (status, headers, body) against
// the operation's documented response. It returns the answer.
func (c *apiChecker) do(e *env, k call) response {
	t := c.t
	t.Helper()
	name := k.method + " " + k.path
	req := k.request(t, e.url, e.token)
	tpl, op, params := c.operation(k.method, req.URL.EscapedPath())
	if op == nil {
		t.Errorf("%s: no documented operation matches", name)
		return response{}
	}
	route := &routers.Route{Spec: c.doc, Path: tpl, PathItem: c.doc.Paths.Value(tpl), Method: k.method, Operation: op}
	in := &openapi3filter.RequestValidationInput{Request: k.request(t, e.url, e.token), PathParams: params, Route: route, Options: c.opts}
	ctx := context.Background()
	if e.server.p.Token == "" {
		ctx = context.WithValue(ctx, withoutToken{}, true)
	}
	err := openapi3filter.ValidateRequest(ctx, in)
	switch {
	case k.doc == docAccepts && err != nil:
		t.Errorf("%s: the document refuses a request the server takes: %v", name, err)
	case k.doc == docRefuses && err == nil:
		t.Errorf("%s: the document accepts a request the server refuses (%d)", name, k.status)
	}

	resp, err := noRedirects.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	r := response{status: resp.StatusCode, header: resp.Header, body: body}
	if r.status != k.status {
		t.Errorf("%s: status %d, want %d: %.300s", name, r.status, k.status, body)
	}
	if op.Responses.Status(r.status) == nil {
		t.Errorf("%s: status %d is not documented for %s %s", name, r.status, k.method, tpl)
		return r
	}
	c.mu.Lock()
	c.seen[fmt.Sprintf("%s %s %d", k.method, tpl, r.status)] = true
	c.mu.Unlock()
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: r.status, Header: r.header, Options: c.opts}
	out.SetBodyBytes(body)
	if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
		t.Errorf("%s: the answer %d does not match the document: %v\n%.500s", name, r.status, err, body)
	}
	return r
}

// concrete is a path of the template with a parameter value that exists in
// the fixtures.
func concrete(tpl string) string {
	return strings.NewReplacer("{id}", "F", "{key}", "order%2F42", "{name}", "rabbit", "{profile}", "heap").Replace(tpl)
}

// validBody is a request body each route with one takes.
func validBody(method, tpl string) string {
	switch {
	case method == http.MethodPost && tpl == "/v1/messages":
		return `{"delay":"1h","sink":"rabbit","destination":"q","body":"b"}`
	case method == http.MethodPatch:
		return `{"delay":"2h"}`
	}
	return ""
}

// Real requests to the real handlers on a real Redis, valid and invalid,
// for every route: every request is checked against the document (the
// document refuses what it can tell is invalid), and every answer (status,
// headers, body) is validated against the documented response; an
// undocumented status fails. In the end every status of every route must
// have been seen.
func TestOpenAPIAnswers(t *testing.T) {
	c := newAPIChecker(t)
	ctx := context.Background()

	sinks := &fakeSinks{statuses: []SinkStatus{
		{Name: "rabbit", Known: true, Rate: 1.5, MaxRate: 100},
		{Name: "kafka", Known: true, Ready: errors.New("dial tcp: connection refused"), Blocked: true},
		{Name: "eu west/1%", Known: false},
	}}
	var storeFull atomic.Bool
	e := newEnv(t, withToken(testToken), withListen("127.0.0.1:7070"),
		withLimits(envelope.Limits{MaxPayloadBytes: 4096, MaxHeaderBytes: 4096}),
		func(p *Params, o *ops.Params, _ *redis.Options) {
			o.Sinks, o.Refresh, p.Pprof = sinks.get, sinks.refresh, true
			o.Capacity = func(_ context.Context, n int) (int, func(), error) {
				if storeFull.Load() {
					return 0, nil, fmt.Errorf("%w: 10 messages parked, limits.max_parked_messages is 10: waiting for firing to make room", store.ErrFull)
				}
				return n, func() {}, nil
			}
		})
	sinks.store = e.store
	stateFixture(t, e) // inflight A B; dead C R job/retry; due D E; in an hour F G
	now := time.Now()
	for i, id := range []string{"g1", "g2", "g3"} {
		m := testMsg(id, now.Add(time.Duration(i+2)*time.Hour))
		m.Group = "order/42"
		e.parkAt(m)
	}
	recurring := testMsg("every-day", time.Date(2030, 1, 1, 9, 0, 0, 0, time.UTC))
	recurring.Recur = &envelope.Recurrence{Cron: "0 9 * * *", TimeZone: "Europe/Berlin", Anchor: recurring.DueAt, N: 2, Count: 10,
		Until: time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)}
	binary := testMsg("bin", now.Add(time.Hour))
	binary.Key, binary.Body = []byte{0xfe, 0x01}, []byte{0xff, 0x00, 0x01}
	binary.Headers = envelope.Headers{{Key: "content-type", Value: "application/octet-stream"}}
	held := testMsg("held", now.Add(-time.Second))
	held.Sink = "kafka"
	e.parkAt(recurring, binary, held)
	states, err := e.store.SinkStates(ctx, []string{"kafka", "rabbit"})
	if err != nil {
		t.Fatal(err)
	}
	bands := map[string]int{"kafka": states["kafka"].Band, "rabbit": states["rabbit"].Band}
	if _, err := e.store.Claim(ctx, e.store.ShardOf("held"), 10, time.Minute, bands); err != nil {
		t.Fatal(err)
	}

	a := func(method, path, body string, status int) call {
		return call{method: method, path: path, body: body, status: status}
	}
	refused := func(k call) call { k.doc = docRefuses; return k }
	either := func(k call) call { k.doc = docEither; return k }
	with := func(k call, header ...string) call {
		k.header = map[string]string{}
		for i := 0; i+1 < len(header); i += 2 {
			k.header[header[i]] = header[i+1]
		}
		return k
	}

	// Probes, this document, metrics.
	c.do(e, a("GET", "/healthz", "", 200))
	c.do(e, a("GET", "/readyz", "", 200))
	if r := c.do(e, a("GET", "/openapi.json", "", 200)); !bytes.Equal(r.body, OpenAPI()) {
		t.Error("/openapi.json is not the generated document")
	}
	c.do(e, with(a("GET", "/openapi.json", "", 200), "Authorization", "")) // no token needed
	c.do(e, a("GET", "/metrics", "", 200))

	// The dashboard: the page and each asset, with conditional and range
	// requests (http.ServeContent).
	for _, path := range []string{"/", "/ui/app.css", "/ui/app.js", "/ui/favicon.svg"} {
		r := c.do(e, with(a("GET", path, "", 200), "Authorization", ""))
		etag := r.header.Get("ETag")
		c.do(e, with(a("GET", path, "", 304), "If-None-Match", etag))
		c.do(e, with(a("GET", path, "", 206), "Range", "bytes=0-9"))
		c.do(e, with(a("GET", path, "", 206), "Range", "bytes=0-1,4-5"))
		c.do(e, with(a("GET", path, "", 416), "Range", "bytes=99999999-"))
		c.do(e, with(a("GET", path, "", 412), "If-Match", `"0000000000000000"`))
	}

	// POST /v1/messages.
	full := `{"id":"orders/3/1234","delay":"1h","sink":"rabbit","destination":"q","key":"42","headers":{"x-a":"1"},"body":"{\"order\":42}","priority":5}`
	r := c.do(e, a("POST", "/v1/messages", full, 201))
	if r.header.Get("Location") != "/v1/messages/orders%2F3%2F1234" {
		t.Errorf("Location %q", r.header.Get("Location"))
	}
	c.do(e, a("POST", "/v1/messages", full, 201)) // duplicate
	c.do(e, a("POST", "/v1/messages", `{"deliver_at":"2030-01-01T00:00:00Z","sink":"kafka","destination":"t","body_base64":"/wA=","id":null}`, 201))
	c.do(e, a("POST", "/v1/messages", `{"delay":5000,"sink":"rabbit","destination":"q","body":""}`, 201))
	c.do(e, a("POST", "/v1/messages", `{"id":"F","delay":5000,"sink":"rabbit","destination":"q","body":"squat"}`, 409)) // an ingest's ID: id_taken
	storeFull.Store(true)
	if r := c.do(e, a("POST", "/v1/messages", `{"delay":5000,"sink":"rabbit","destination":"q","body":"x"}`, 503)); r.header.Get("Retry-After") != "1" ||
		!strings.Contains(string(r.body), "max_parked_messages") {
		t.Errorf("POST at the store's limit: Retry-After %q, %s", r.header.Get("Retry-After"), r.body)
	}
	storeFull.Store(false)
	c.do(e, refused(a("POST", "/v1/messages", `{"delay":"1h","sink":"rabbit","destination":"q","body":"b","nope":1}`, 400)))
	c.do(e, refused(a("POST", "/v1/messages", `{"delay":"1h","destination":"q","body":"b"}`, 400)))
	c.do(e, refused(a("POST", "/v1/messages", `{"delay":"1h","sink":"rabbit","destination":"q","body":"b","priority":10}`, 400)))
	c.do(e, refused(a("POST", "/v1/messages", `[1]`, 400)))
	c.do(e, refused(a("POST", "/v1/messages", `{"delay":true,"sink":"rabbit","destination":"q","body":"b"}`, 400)))
	c.do(e, a("POST", "/v1/messages", `{"delay":"1h","deliver_at":1,"sink":"rabbit","destination":"q","body":"b"}`, 400))
	c.do(e, a("POST", "/v1/messages", `{"delay":"banana","sink":"rabbit","destination":"q","body":"b"}`, 400))
	c.do(e, a("POST", "/v1/messages", `{"delay":"1h","sink":"nope","destination":"q","body":"b"}`, 400))
	c.do(e, either(a("POST", "/v1/messages", `{"delay":"1h","sink":"rabbit","destination":"q","body":"`+strings.Repeat("x", 100<<10)+`"}`, 413)))

	// GET /v1/messages.
	r = c.do(e, a("GET", "/v1/messages?limit=2", "", 200))
	var page struct {
		NextCursor *string `json:"next_cursor"`
	}
	if err := json.Unmarshal(r.body, &page); err != nil || page.NextCursor == nil {
		t.Fatalf("first page: %v %s", err, r.body)
	}
	c.do(e, a("GET", "/v1/messages?limit=2&cursor="+url.QueryEscape(*page.NextCursor), "", 200))
	c.do(e, a("GET", "/v1/messages?state=scheduled&sink=rabbit&destination=q.F&ingest=orders-in&due_after=2020-01-01T00:00:00Z&due_before=4102444800000", "", 200))
	c.do(e, a("GET", "/v1/messages?state=dead", "", 200))
	c.do(e, a("GET", "/v1/messages?state=inflight&body=true", "", 200))
	c.do(e, a("GET", "/v1/messages?group=order%2F42&recurring=false", "", 200))
	c.do(e, a("GET", "/v1/messages?recurring=true&body=true", "", 200))
	c.do(e, refused(a("GET", "/v1/messages?limit=0", "", 400)))
	c.do(e, refused(a("GET", "/v1/messages?limit=1001", "", 400)))
	c.do(e, refused(a("GET", "/v1/messages?state=parked", "", 400)))
	c.do(e, refused(a("GET", "/v1/messages?recurring=maybe", "", 400)))
	c.do(e, a("GET", "/v1/messages?nope=1", "", 400)) // unknown parameters: the document cannot refuse them
	c.do(e, a("GET", "/v1/messages?cursor=forged", "", 400))
	c.do(e, a("GET", "/v1/messages?due_after=yesterday", "", 400))

	// GET /v1/messages/{id}, in every state and shape.
	for _, id := range []string{"F", "A", "C", "R", "D", "held", "every-day", "g1", "orders%2F3%2F1234", "orders/3/1234", "job%2Fretry"} {
		c.do(e, a("GET", "/v1/messages/"+id, "", 200))
		c.do(e, a("GET", "/v1/messages/"+id+"?body=true", "", 200))
	}
	if r := c.do(e, a("GET", "/v1/messages/bin?body=true", "", 200)); !strings.Contains(string(r.body), `"body_base64":"/wAB"`) {
		t.Errorf("binary body: %s", r.body)
	}
	c.do(e, a("GET", "/v1/messages/bin?body=false", "", 200))
	c.do(e, refused(a("GET", "/v1/messages/F?body=maybe", "", 400)))
	c.do(e, a("GET", "/v1/messages/a%E2%80%AEb", "", 400)) // a bidi override
	c.do(e, a("GET", "/v1/messages/%01", "", 400))
	c.do(e, a("GET", "/v1/messages/unknown", "", 404))
	c.do(e, refused(a("GET", "/v1/messages/", "", 404)))

	// PATCH, fire, DELETE.
	c.do(e, a("PATCH", "/v1/messages/F", `{"delay":"2h"}`, 200))
	c.do(e, a("PATCH", "/v1/messages/G", `{"deliver_at":"2001-01-01T00:00:00Z","if_due_at":null}`, 200)) // passed: now
	due := e.dueAt("F")
	c.do(e, a("PATCH", "/v1/messages/F", fmt.Sprintf(`{"deliver_at":%d,"if_due_at":%q}`, due.Add(time.Hour).UnixMilli(), envelope.FormatTime(due)), 200))
	if r := c.do(e, a("PATCH", "/v1/messages/F", `{"delay":1000,"if_due_at":"2001-01-01T00:00:00Z"}`, 409)); !strings.Contains(string(r.body), `"due_at"`) {
		t.Errorf("409 without the current due_at: %s", r.body)
	}
	c.do(e, a("PATCH", "/v1/messages/A", `{"delay":"1h"}`, 409)) // in flight
	c.do(e, a("PATCH", "/v1/messages/C", `{"delay":"1h"}`, 409)) // dead
	c.do(e, a("PATCH", "/v1/messages/unknown", `{"delay":"1h"}`, 404))
	c.do(e, a("PATCH", "/v1/messages/F", `{}`, 400))
	c.do(e, refused(a("PATCH", "/v1/messages/F", `{"dely":"1h"}`, 400)))
	c.do(e, refused(a("PATCH", "/v1/messages/F", `{"delay":[1]}`, 400)))
	c.do(e, a("PATCH", "/v1/messages/%01", `{"delay":"1h"}`, 400))
	c.do(e, refused(a("PATCH", "/v1/messages/", `{"delay":"1h"}`, 404)))
	c.do(e, either(a("PATCH", "/v1/messages/F", `{"delay":"`+strings.Repeat("1", 70<<10)+`"}`, 413)))
	c.do(e, a("POST", "/v1/messages/D/fire", "", 204))
	c.do(e, a("POST", "/v1/messages/held/fire", "", 204))
	c.do(e, a("POST", "/v1/messages/A/fire", "", 409))
	c.do(e, a("POST", "/v1/messages/unknown/fire", "", 404))
	c.do(e, a("POST", "/v1/messages/%01/fire", "", 400))
	c.do(e, refused(a("POST", "/v1/messages//fire", "", 404)))
	if r := c.do(e, a("DELETE", "/v1/messages/A", "", 409)); r.header.Get("Retry-After") != "1" { // in flight: it may be published
		t.Errorf("409 of a cancel in flight: Retry-After %q, want 1", r.header.Get("Retry-After"))
	}
	c.do(e, a("DELETE", "/v1/messages/E", "", 204))
	c.do(e, a("DELETE", "/v1/messages/E", "", 404))
	c.do(e, a("DELETE", "/v1/messages/%01", "", 400))
	c.do(e, refused(a("DELETE", "/v1/messages/", "", 404)))

	// Stats, history, dead messages.
	c.do(e, a("GET", "/v1/stats", "", 200))
	e.server.history.take(time.Now())
	e.server.p.Metrics.FireLateness.WithLabelValues("rabbit").Observe(0.01)
	e.server.history.take(time.Now())
	c.do(e, a("GET", "/v1/history", "", 200))
	c.do(e, a("GET", "/v1/dead", "", 200))
	c.do(e, a("GET", "/v1/dead?limit=1", "", 200))
	c.do(e, refused(a("GET", "/v1/dead?limit=0", "", 400)))
	c.do(e, refused(a("GET", "/v1/dead?limit=x", "", 400)))
	c.do(e, a("GET", "/v1/dead/C", "", 200))
	c.do(e, a("GET", "/v1/dead/C?body=true", "", 200))
	c.do(e, a("GET", "/v1/dead/F", "", 404)) // not dead
	c.do(e, a("GET", "/v1/dead/%01", "", 400))
	c.do(e, refused(a("GET", "/v1/dead/", "", 404)))
	c.do(e, a("POST", "/v1/dead/job%2Fretry/retry", "", 409)) // it died for its destination (NO_ROUTE)
	c.do(e, refused(a("POST", "/v1/dead/job%2Fretry/retry", `{"destination":"q.other","nope":1}`, 400)))
	c.do(e, a("POST", "/v1/dead/job%2Fretry/retry", `{"destination":"q.other"}`, 204))
	c.do(e, a("POST", "/v1/dead/job%2Fretry/retry", "", 404))
	c.do(e, a("POST", "/v1/dead/R/retry", `{"sink":"nope"}`, 400))
	c.do(e, a("POST", "/v1/dead/a%E2%80%AEb/retry", "", 400))
	c.do(e, refused(a("POST", "/v1/dead//retry", "", 404)))
	c.do(e, either(a("POST", "/v1/dead/C/retry", `{"destination":"`+strings.Repeat("d", 70<<10)+`"}`, 413)))
	c.do(e, a("DELETE", "/v1/dead/R", "", 204))
	c.do(e, a("DELETE", "/v1/dead/F", "", 404))
	c.do(e, a("DELETE", "/v1/dead/%01", "", 400))
	c.do(e, refused(a("DELETE", "/v1/dead/", "", 404)))
	c.do(e, a("GET", "/v1/dead?sink=rabbit&ingest=orders-in&dead_after=2020-01-01T00:00:00Z", "", 200))
	c.do(e, a("GET", "/v1/dead?dead_before=yesterday", "", 400))
	c.do(e, a("DELETE", "/v1/dead?sink=nope", "", 200))
	c.do(e, a("DELETE", "/v1/dead?dead_after=yesterday", "", 400))
	c.do(e, a("DELETE", "/v1/dead?ingest=orders-in", "", 200))

	// Groups.
	c.do(e, a("GET", "/v1/groups/order%2F42", "", 200))
	c.do(e, a("GET", "/v1/groups/order%2F42?limit=1&body=true&state=scheduled", "", 200))
	c.do(e, a("GET", "/v1/groups/order%2F42?group=x", "", 400))
	c.do(e, refused(a("GET", "/v1/groups/order%2F42?limit=-1", "", 400)))
	c.do(e, a("GET", "/v1/groups/a%E2%80%AEb", "", 400))
	c.do(e, a("GET", "/v1/groups/nobody", "", 404))
	c.do(e, refused(a("GET", "/v1/groups/", "", 404)))
	c.do(e, a("DELETE", "/v1/groups/order%2F42", "", 200))
	c.do(e, a("DELETE", "/v1/groups/order%2F42", "", 404))
	c.do(e, a("DELETE", "/v1/groups/%01", "", 400))

	// Sinks.
	c.do(e, a("GET", "/v1/sinks", "", 200))
	for _, name := range []string{"rabbit", "kafka", "eu%20west%2F1%25"} {
		c.do(e, a("GET", "/v1/sinks/"+name, "", 200))
		c.do(e, a("POST", "/v1/sinks/"+name+"/pause", "", 200))
		c.do(e, a("GET", "/v1/sinks", "", 200))
		c.do(e, a("POST", "/v1/sinks/"+name+"/resume", "", 200))
	}
	c.do(e, a("GET", "/v1/sinks/nope", "", 404))
	c.do(e, a("POST", "/v1/sinks/nope/pause", "", 404))
	c.do(e, a("POST", "/v1/sinks/nope/resume", "", 404))

	// pprof: Go's handlers, documented as Go serves them.
	c.do(e, a("GET", "/debug/pprof/", "", 200))
	c.do(e, a("GET", "/debug/pprof/heap", "", 200))
	c.do(e, a("GET", "/debug/pprof/goroutine?debug=1", "", 200))
	c.do(e, a("GET", "/debug/pprof/heap?gc=1&debug=2", "", 200))
	c.do(e, a("GET", "/debug/pprof/allocs?seconds=1", "", 200))
	c.do(e, refused(a("GET", "/debug/pprof/heap?seconds=x", "", 400)))
	c.do(e, a("GET", "/debug/pprof/nope", "", 404))
	c.do(e, a("GET", "/debug/pprof/cmdline", "", 200))
	c.do(e, a("GET", "/debug/pprof/symbol", "", 200))
	c.do(e, a("POST", "/debug/pprof/symbol", "", 200))
	if err := pprof.StartCPUProfile(io.Discard); err != nil {
		t.Fatal(err)
	}
	c.do(e, a("GET", "/debug/pprof/profile?seconds=1", "", 500))
	pprof.StopCPUProfile()
	c.do(e, a("GET", "/debug/pprof/profile?seconds=1", "", 200))
	if err := trace.Start(io.Discard); err != nil {
		t.Fatal(err)
	}
	c.do(e, a("GET", "/debug/pprof/trace?seconds=0.1", "", 500))
	trace.Stop()
	c.do(e, a("GET", "/debug/pprof/trace?seconds=0.1", "", 200))

	// The guards, on every route: a Host not allowed; no token; a
	// cross-origin state change; a body that is not JSON.
	for _, rt := range e.server.Routes() {
		path := concrete(rt.Path)
		c.do(e, either(with(a(rt.Method, path, "", 403), "Host", "evil.example")))
		if slices.Contains(rt.Statuses, 401) {
			c.do(e, refused(with(a(rt.Method, path, "", 401), "Authorization", "")))
			c.do(e, either(with(a(rt.Method, path, "", 401), "Authorization", "Bearer wrong"))) // the document cannot know the token
		}
		if slices.Contains(rt.Statuses, 415) {
			c.do(e, either(with(a(rt.Method, path, validBody(rt.Method, rt.Path), 403), "Sec-Fetch-Site", "cross-site")))
			c.do(e, refused(with(a(rt.Method, path, "x=1", 415), "Content-Type", "application/x-www-form-urlencoded")))
		}
	}

	// A method a path does not have: 405 with the documented methods.
	for path, item := range c.doc.Paths.Map() {
		if strings.HasPrefix(path, "/debug/") {
			continue // Go's handlers answer every method
		}
		var allow []string
		for m := range item.Operations() {
			allow = append(allow, m)
			if m == http.MethodGet {
				allow = append(allow, http.MethodHead)
			}
		}
		if path == "/v1/messages/{id}/fire" {
			// Only a POST names the action; other methods reach the
			// message "F/fire".
			allow = []string{"DELETE", "GET", "HEAD", "PATCH"}
		}
		slices.Sort(allow)
		r := e.doAuth(http.MethodPut, concrete(path), "", bearer(testToken))
		if r.status != http.StatusMethodNotAllowed || r.header.Get("Allow") != strings.Join(allow, ", ") {
			t.Errorf("PUT %s: %d Allow %q, want 405 Allow %q", path, r.status, r.header.Get("Allow"), strings.Join(allow, ", "))
			continue
		}
		r.errorText(t)
	}

	// Without a token, content is refused (403) and /readyz hides addresses.
	open := newEnv(t)
	grouped := testMsg("o1", now.Add(time.Hour))
	grouped.Group = "order/42"
	open.parkAt(grouped)
	deadFixture(t, open)
	c.do(open, a("GET", "/v1/messages/o1?body=true", "", 403))
	c.do(open, a("GET", "/v1/messages?body=true", "", 403))
	c.do(open, a("GET", "/v1/dead/dead-1?body=true", "", 403))
	c.do(open, a("GET", "/v1/groups/order%2F42?body=true", "", 403))
	c.do(open, a("GET", "/v1/messages/o1", "", 200))

	// Not ready: 503 with the reason, with and without the token.
	notReady := func() error { return errors.New("redis 10.0.0.1:6379: connection refused") }
	for _, tok := range []string{"", testToken} {
		c.do(newEnv(t, withToken(tok), withReady(notReady)), a("GET", "/readyz", "", 503))
	}

	// Redis down: every route that reads it answers 503 (try again);
	// Redis answering an error (here: the user may run no command), 500.
	downSinks := &fakeSinks{statuses: []SinkStatus{{Name: "rabbit", Known: true}}}
	down := newEnv(t, withToken(testToken), withFailFast(), func(p *Params, o *ops.Params, _ *redis.Options) { o.Sinks = downSinks.get })
	down.redis.Kill()
	refusing := newEnv(t, withToken(testToken), withFailFast(), func(p *Params, o *ops.Params, _ *redis.Options) { o.Sinks = downSinks.get })
	if err := refusing.redis.Client().Do(context.Background(), "ACL", "SETUSER", "default", "-@all").Err(); err != nil {
		t.Fatal(err)
	}
	for _, rt := range down.server.Routes() {
		if slices.Contains(rt.Statuses, 500) && !strings.HasPrefix(rt.Path, "/debug/") {
			c.do(down, a(rt.Method, concrete(rt.Path), validBody(rt.Method, rt.Path), 503))
			c.do(refusing, a(rt.Method, concrete(rt.Path), validBody(rt.Method, rt.Path), 500))
		}
	}

	// Every status of every route was seen.
	for _, rt := range e.server.Routes() {
		for _, st := range rt.Statuses {
			if !c.seen[fmt.Sprintf("%s %s %d", rt.Method, rt.Path, st)] {
				t.Errorf("%s %s: status %d never seen", rt.Method, rt.Path, st)
			}
		}
	}
}

// Every route with a parameter hands its handler the parameter unescaped
// and whole: IDs, group keys and sink names with '/', '%', spaces, "//",
// dot segments, and IDs that end like an action (".../fire",
// ".../retry"), sent URL-encoded, and the slash-only ones also as they are.
func TestPathParametersUnescaped(t *testing.T) {
	ids := []string{"a/b", "100%", "with space", "p//q", "x/../y", "ends/", "/starts", "job/fire", "job/retry", "q?x=1#f"}
	sinks := &fakeSinks{}
	for _, id := range ids {
		sinks.statuses = append(sinks.statuses, SinkStatus{Name: id, Known: true})
	}
	e := newEnv(t, func(p *Params, o *ops.Params, _ *redis.Options) { o.Sinks, o.Refresh = sinks.get, sinks.refresh })
	sinks.store = e.store
	ctx := context.Background()
	for _, id := range ids {
		spellings := []string{url.PathEscape(id)}
		if !strings.ContainsAny(id, "% ?#") {
			spellings = append(spellings, id)
		}
		for _, sp := range spellings {
			m := testMsg(id, time.Now().Add(time.Hour))
			m.Group = id
			e.parkAt(m)
			if r := e.do("GET", "/v1/messages/"+sp, ""); r.status != 200 || r.json(t)["id"] != id {
				t.Errorf("GET /v1/messages/%s: %d %s", sp, r.status, r.body)
			}
			if r := e.do("PATCH", "/v1/messages/"+sp, `{"delay":"2h"}`); r.status != 200 || r.json(t)["id"] != id {
				t.Errorf("PATCH /v1/messages/%s: %d %s", sp, r.status, r.body)
			}
			if r := e.do("POST", "/v1/messages/"+sp+"/fire", ""); r.status != 204 || time.Until(e.dueAt(id)) > time.Minute {
				t.Errorf("POST /v1/messages/%s/fire: %d %s", sp, r.status, r.body)
			}
			if r := e.do("GET", "/v1/groups/"+sp, ""); r.status != 200 || r.json(t)["group"] != id {
				t.Errorf("GET /v1/groups/%s: %d %s", sp, r.status, r.body)
			}
			if r := e.do("DELETE", "/v1/groups/"+sp, ""); r.status != 200 || r.json(t)["group"] != id {
				t.Errorf("DELETE /v1/groups/%s: %d %s", sp, r.status, r.body)
			}
			e.parkAt(testMsg(id, time.Now().Add(time.Hour)))
			if r := e.do("DELETE", "/v1/messages/"+sp, ""); r.status != 204 {
				t.Errorf("DELETE /v1/messages/%s: %d %s", sp, r.status, r.body)
			}
			if _, err := e.store.Reject(ctx, []store.Rejected{{Message: testMsg(id, time.Now()), Reason: "test"}}); err != nil {
				t.Fatal(err)
			}
			if sp == "job/retry" {
				// Under /v1/dead/ a trailing "/retry" is the action, for
				// every method: this ID's slash must be encoded there.
				e.expect(e.do("GET", "/v1/dead/"+sp, ""), http.StatusMethodNotAllowed)
			} else if r := e.do("GET", "/v1/dead/"+sp, ""); r.status != 200 || r.json(t)["id"] != id {
				t.Errorf("GET /v1/dead/%s: %d %s", sp, r.status, r.body)
			}
			if r := e.do("POST", "/v1/dead/"+url.PathEscape(id)+"/retry", ""); r.status != 204 {
				t.Errorf("POST /v1/dead/%s/retry: %d %s", url.PathEscape(id), r.status, r.body)
			}
			if r := e.do("DELETE", "/v1/messages/"+sp, ""); r.status != 204 { // the retried one
				t.Errorf("DELETE /v1/messages/%s after the retry: %d %s", sp, r.status, r.body)
			}
			if r := e.do("GET", "/v1/sinks/"+sp, ""); r.status != 200 || r.json(t)["name"] != id {
				t.Errorf("GET /v1/sinks/%s: %d %s", sp, r.status, r.body)
			}
			if r := e.do("POST", "/v1/sinks/"+url.PathEscape(id)+"/pause", ""); r.status != 200 || r.json(t)["name"] != id || r.json(t)["paused"] != true {
				t.Errorf("POST /v1/sinks/%s/pause: %d %s", url.PathEscape(id), r.status, r.body)
			}
		}
	}
}

var update = flag.Bool("update", false, "rewrite openapi.json from the code")

// openapi.json is what the code generates (a copy for readers and tools:
// the server serves OpenAPI itself). After a change of a route or a type,
//
//	go test ./pkg/admin -run TestOpenAPIFileIsGenerated -update
//
// rewrites it.
func TestOpenAPIFileIsGenerated(t *testing.T) {
	if *update {
		if err := os.WriteFile("openapi.json", OpenAPI(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	file, err := os.ReadFile("openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(file, OpenAPI()) {
		t.Error("openapi.json is not what the code generates; run\n  go test ./pkg/admin -run TestOpenAPIFileIsGenerated -update\nand review the diff")
	}
}
