package admin

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/http/pprof"
	"slices"
	"strings"

	"github.com/danielgtaylor/huma/v2"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/delaybridge/delaybridge/pkg/admin/ui"
)

// Route is one operation the server answers, as Routes reports it and the
// OpenAPI document describes it.
type Route struct {
	Method string // GET, POST, PATCH or DELETE; a GET route answers HEAD too
	// Path is the template, as the OpenAPI document writes it:
	// "/v1/messages/{id}/fire". A parameter is the rest of the path up to
	// the template's fixed suffix, slashes included.
	Path string
	// Query names the query parameters the route reads.
	Query []string
	// Statuses are every status the route can answer: its own, those of
	// its path parameter (400 for an ID or group key that is refused, 404
	// for an empty or unknown one: paramStatuses) and those of the
	// guards in front of it (403 for a Host not allowed, 401 under /v1/
	// and /debug/ when a token is configured, 403 for a cross-origin
	// state-changing request, 415 for one with a body that is not JSON).
	// A method the path does not have answers 405 with Allow.
	Statuses []int
}

// op is one operation of the API: a row of the table below. The server
// registers it (with its handler, handlers.go), the Client calls it
// (client.go), the document describes it.
type op struct {
	id, method, path string
	tag              string
	summary, desc    string
	status           int   // the answer when it succeeds
	errors           []int // its own error statuses (register adds those of the guards and the path parameter)
	body             bodyKind

	// ownMethodOnly, for a path with a fixed suffix after its parameter
	// (an action: /fire, /retry, /pause), says that the suffix names the
	// action only for the operation's own method. Otherwise it names it
	// for every method, and another method answers 405 (GET
	// /v1/dead/x/retry). POST /v1/messages/{id}/fire is the one such
	// action: no other POST goes to a message, so GET, PATCH and DELETE of
	// an ID that ends in "/fire" reach that message as it is.
	ownMethodOnly bool
	tokenOptional bool  // /readyz: no token needed, more said with it
	bodyOn        []int // error statuses answered with the success answer's body (/readyz's 503)
	raw           bool  // served by a handler of its own (not JSON through huma)
}

type bodyKind int

const (
	bodyNone    bodyKind = iota
	bodyMessage          // a message: bounded by limits (envelope.Limits.MaxDocumentBytes)
	bodySmall            // a few short fields
)

const (
	get, post, patch, del = http.MethodGet, http.MethodPost, http.MethodPatch, http.MethodDelete
	// The statuses of an operation that reads Redis (500 when it cannot),
	// that refuses a request (400), and of one that serves content only
	// with a token (403: ?body=true without one).
	failed, bad, noToken = http.StatusInternalServerError, http.StatusBadRequest, http.StatusForbidden
)

// The operations of the JSON API. Adding one is a row here, a method of
// pkg/ops and a handler of a few lines (handlers.go); the document comes
// from their types.
var (
	opHealthz = op{id: "healthz", method: get, path: "/healthz", tag: "probes", status: 200,
		summary: "200 while the process runs."}
	opReadyz = op{id: "readyz", method: get, path: "/readyz", tag: "probes", status: 200, errors: []int{503}, bodyOn: []int{503}, tokenOptional: true,
		summary: "200 once Redis and every ingest and sink are connected, else 503 with the reason.",
		desc: "Needs no token; with a valid token the reason names the addresses of Redis and the brokers. " +
			"Warnings, ready or not, list what does not stop the daemon but should be fixed: a Redis master that keeps nothing on disk."}

	opListMessages = op{id: "listMessages", method: get, path: "/v1/messages", tag: "messages", status: 200, errors: []int{bad, noToken, failed},
		summary: "A page of messages in the order they fire, across every shard.",
		desc: "Filters on sink, destination, ingest, group or recurring examine a bounded number of messages per page " +
			"(10 x limit): a page may then be short, even empty, and still have a next_cursor."}
	opPostMessage = op{id: "postMessage", method: post, path: "/v1/messages", tag: "messages", status: 201, errors: []int{bad, 409, 413, failed, 503}, body: bodyMessage,
		summary: "Schedules a message without a broker, through the rules of an ingested one.",
		desc: "Each field is what a control header says on an ingest (delay: x-delay, group: x-delay-group, every: x-delay-every...); " +
			"the request becomes an incoming message and goes through the ingest rules (limits, destination checks, templates, schedules). " +
			"An ID already known is not parked again: 201 with duplicate and the known due_at."}
	opGetMessage = op{id: "getMessage", method: get, path: "/v1/messages/{id}", tag: "messages", status: 200, errors: []int{noToken, failed},
		summary: "A parked or dead message; its key, headers and body with ?body=true (only with admin.token)."}
	opPatchMessage = op{id: "rescheduleMessage", method: patch, path: "/v1/messages/{id}", tag: "messages", status: 200, errors: []int{409, 413, failed}, body: bodySmall,
		summary: "Gives a scheduled message a new due time; if_due_at compares and sets.",
		desc:    "409 in flight, dead, or if_due_at no longer the message's due time (then with due_at)."}
	opCancelMessage = op{id: "cancelMessage", method: del, path: "/v1/messages/{id}", tag: "messages", status: 204, errors: []int{409, failed},
		summary: "Cancels a parked message (or deletes a dead one): 204 means it will not be published.",
		desc: "409 with Retry-After for a message being published (claimed, its publish started or about to start): " +
			"if that publish fails, it is scheduled again and a cancel then succeeds; once delivered it is 404."}
	opFireMessage = op{id: "fireMessage", method: post, path: "/v1/messages/{id}/fire", tag: "messages", status: 204, errors: []int{409, failed}, ownMethodOnly: true,
		summary: "Makes a scheduled message due now; 409 in flight or dead.",
		desc:    "A message held for its sink stays held, due now: it fires when the sink takes messages again."}
	opStats = op{id: "stats", method: get, path: "/v1/stats", tag: "stats", status: 200, errors: []int{failed},
		summary: "How many messages are parked, due and dead, per shard and by when they come due.",
		desc:    "redis_persistence says whether Redis keeps them across its restart (AOF, RDB snapshots), with a warning when it keeps nothing."}
	opListDead = op{id: "listDead", method: get, path: "/v1/dead", tag: "dead", status: 200, errors: []int{bad, failed},
		summary: "The newest dead messages the filters select, with their reason, newest first."}
	opPurgeDead = op{id: "purgeDead", method: del, path: "/v1/dead", tag: "dead", status: 200, errors: []int{bad, failed},
		summary: "Deletes every dead message the filters select, in one request."}
	opGetDead = op{id: "getDead", method: get, path: "/v1/dead/{id}", tag: "dead", status: 200, errors: []int{noToken, failed},
		summary: "A dead message; 404 for one that is not dead."}
	opDeleteDead = op{id: "deleteDead", method: del, path: "/v1/dead/{id}", tag: "dead", status: 204, errors: []int{failed},
		summary: "Deletes a dead message; a parked one is left alone (404)."}
	opRetryDead = op{id: "retryDead", method: post, path: "/v1/dead/{id}/retry", tag: "dead", status: 204, errors: []int{409, 413, failed}, body: bodySmall,
		summary: "Schedules a dead message again, due now, through the rules a message meets at ingest.",
		desc: "Its x-delaybridge-due-at is the retry's time. A message that died for its sink or destination (not configured, " +
			"refused by the broker, not a valid destination for its route) is retried only with a valid one given in the body; " +
			"else 409 with the reason. A message that died at ingest goes through its ingest's route again (templates expanded, " +
			"limits and destination checks applied). A dead message whose ID ends in \"/retry\" is reached by encoding that slash (%2Fretry)."}
	opGetGroup = op{id: "getGroup", method: get, path: "/v1/groups/{key}", tag: "groups", status: 200, errors: []int{noToken, failed},
		summary: "A group's size and a page of its messages in the order they fire; 404 when none is filed under it."}
	opCancelGroup = op{id: "cancelGroup", method: del, path: "/v1/groups/{key}", tag: "groups", status: 200, errors: []int{failed},
		summary: "Cancels every message of a group, on every shard; 404 when none is filed under it."}
	opHistory = op{id: "history", method: get, path: "/v1/history", tag: "stats", status: 200,
		summary: "The daemon's samples of the last minutes: what the dashboard's charts show when it opens.",
		desc: "The ingest and fire counters and the fire-lateness histogram, summed over their labels, every 2 s for the " +
			"last 5 minutes since the server started, oldest first; rates and quantiles come from consecutive samples."}
	opListSinks = op{id: "listSinks", method: get, path: "/v1/sinks", tag: "sinks", status: 200, errors: []int{failed},
		summary: "The configured sinks: ready, paused, held due messages, rate."}
	opGetSink = op{id: "getSink", method: get, path: "/v1/sinks/{name}", tag: "sinks", status: 200, errors: []int{failed},
		summary: "One configured sink; 404 for a name that is not."}
	opPauseSink = op{id: "pauseSink", method: post, path: "/v1/sinks/{name}/pause", tag: "sinks", status: 200, errors: []int{failed},
		summary: "Stops firing to a sink, for every instance and across restarts: its due messages are held."}
	opResumeSink = op{id: "resumeSink", method: post, path: "/v1/sinks/{name}/resume", tag: "sinks", status: 200, errors: []int{failed},
		summary: "Resumes firing to a sink, for every instance: its held messages fire by priority, then in due order, within each shard."}
)

// paramStatuses are the statuses of a path parameter: 400 for an ID or a
// group key that envelope.CheckID refuses (the operation checks it), 404
// for an empty one or a sink that is not configured. (A path that is not
// validly URL-encoded never gets here: net/http answers it 400 itself.)
var paramStatuses = map[string][]int{
	"id":   {http.StatusBadRequest, http.StatusNotFound},
	"key":  {http.StatusBadRequest, http.StatusNotFound},
	"name": {http.StatusNotFound},
}

// register serves every route: the JSON operations through huma, the rest
// (the document, metrics, the dashboard, pprof) with handlers of their own,
// described in the document by hand-made operations.
func (s *Server) register() {
	api := s.api
	register(s, api, opHealthz, s.healthz)
	register(s, api, opReadyz, s.readyz)
	register(s, api, opListMessages, s.listMessages)
	register(s, api, opPostMessage, s.postMessage)
	register(s, api, opGetMessage, s.getMessage)
	register(s, api, opPatchMessage, s.patchMessage)
	register(s, api, opCancelMessage, s.cancelMessage)
	register(s, api, opFireMessage, s.fireMessage)
	register(s, api, opStats, s.stats)
	register(s, api, opListDead, s.listDead)
	register(s, api, opPurgeDead, s.purgeDead)
	register(s, api, opGetDead, s.getDead)
	register(s, api, opDeleteDead, s.deleteDead)
	register(s, api, opRetryDead, s.retryDead)
	register(s, api, opGetGroup, s.getGroup)
	register(s, api, opCancelGroup, s.cancelGroup)
	register(s, api, opHistory, s.getHistory)
	register(s, api, opListSinks, s.listSinks)
	register(s, api, opGetSink, s.getSink)
	register(s, api, opPauseSink, s.pauseSink)
	register(s, api, opResumeSink, s.resumeSink)

	s.raw(rawOp{op: op{id: "openapi", method: get, path: "/openapi.json", tag: "probes", status: 200,
		summary: "This document (OpenAPI 3.0)."}, answers: answers{200: {"application/json"}}}, serveOpenAPI)
	if s.p.Metrics != nil {
		prom := promhttp.HandlerFor(s.p.Metrics.Registry, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
		s.raw(rawOp{op: op{id: "metrics", method: get, path: "/metrics", tag: "probes", status: 200,
			summary: "Prometheus metrics (text format).", desc: "Needs no token. Served only when metrics are enabled."},
			answers: answers{200: {"text/plain"}}}, prom.ServeHTTP)
	}
	// The dashboard (package ui): the page at / and its assets under /ui/.
	// They hold no data and need no token; the page's script calls /v1/.
	// http.ServeContent answers conditional and range requests.
	dashboard := ui.Handler()
	patterns := ui.Patterns()
	slices.Sort(patterns)
	for _, pattern := range patterns {
		path := strings.TrimSuffix(pattern, "{$}")
		ct, _, _ := strings.Cut(ui.ContentType(path), ";")
		s.raw(rawOp{op: op{id: "dashboard" + strings.NewReplacer("/", "_", ".", "_").Replace(path), method: get, path: path, tag: "dashboard",
			status: 200, summary: "The dashboard: " + dashboardFile(path) + "."}, pattern: pattern,
			answers: answers{200: {ct}, 206: {ct, "multipart/byteranges"}, 304: nil, 412: nil, 416: {"text/plain"}}}, dashboard.ServeHTTP)
	}
	if s.p.Pprof && s.p.Token != "" {
		// Go's handlers, as Go serves them: the index, the named profiles
		// under it (a subtree), and four more. They answer every method
		// themselves.
		text, binary := []string{"text/plain"}, []string{"application/octet-stream"}
		for _, p := range []struct {
			id, path, pattern string
			query             map[string]string // name -> type
			answers           answers
			h                 http.HandlerFunc
			methods           []string
		}{
			{"pprofIndex", "/debug/pprof/", "", nil, answers{200: {"text/html"}}, pprof.Index, []string{get}},
			{"pprofNamed", "/debug/pprof/{profile}", "/debug/pprof/", map[string]string{"debug": "integer", "gc": "integer", "seconds": "integer"},
				answers{200: {"application/octet-stream", "text/plain"}, 400: text, 404: text}, pprof.Index, []string{get}},
			{"pprofCmdline", "/debug/pprof/cmdline", "", nil, answers{200: text}, pprof.Cmdline, []string{get}},
			{"pprofCPU", "/debug/pprof/profile", "", map[string]string{"seconds": "integer"}, answers{200: binary, 500: text}, pprof.Profile, []string{get}},
			{"pprofSymbol", "/debug/pprof/symbol", "", nil, answers{200: text}, pprof.Symbol, []string{get, post}},
			{"pprofTrace", "/debug/pprof/trace", "", map[string]string{"seconds": "number"}, answers{200: binary, 500: text}, pprof.Trace, []string{get}},
		} {
			for _, m := range p.methods {
				s.raw(rawOp{op: op{id: p.id + map[string]string{get: "", post: "Post"}[m],
					method: m, path: p.path, tag: "pprof", status: 200, summary: "Go's runtime profiles (net/http/pprof)."},
					answers: p.answers, pattern: p.pattern, query: p.query, anyMethod: true}, p.h)
			}
		}
	}
	s.router.finish()
}

func dashboardFile(path string) string {
	if path == "/" {
		return "the page"
	}
	return strings.TrimPrefix(path, "/ui/")
}

// rawOp is an operation served by a handler of its own, and what the
// document says it answers.
type rawOp struct {
	op
	answers   answers           // its own answers: status -> content types (none: no body)
	pattern   string            // the http.ServeMux pattern when it is not the path ("/{$}", a subtree)
	query     map[string]string // the query parameters it reads, with their types
	anyMethod bool              // Go's handlers: they answer every method themselves
}

// answers are the content types of an operation's answers by status.
type answers map[int][]string

// raw serves a rawOp and adds it to the document.
func (s *Server) raw(r rawOp, h http.HandlerFunc) {
	r.raw = true
	for st := range r.answers {
		if st != r.status {
			r.errors = append(r.errors, st)
		}
	}
	hop := r.operation(s)
	for st, cts := range r.answers {
		resp := &huma.Response{Description: http.StatusText(st)}
		if len(cts) > 0 {
			resp.Content = map[string]*huma.MediaType{}
			for _, ct := range cts {
				schema := &huma.Schema{Type: "string"}
				if ct == "application/json" {
					schema = &huma.Schema{Type: "object"}
				}
				resp.Content[ct] = &huma.MediaType{Schema: schema}
			}
		}
		hop.Responses[fmt.Sprint(st)] = resp
	}
	query := slices.Sorted(maps.Keys(r.query))
	for _, q := range query {
		hop.Parameters = append(hop.Parameters, &huma.Param{Name: q, In: "query", Schema: &huma.Schema{Type: r.query[q]}})
	}
	for _, m := range pathParam.FindAllStringSubmatch(r.path, -1) {
		hop.Parameters = append(hop.Parameters, &huma.Param{Name: m[1], In: "path", Required: true, Schema: &huma.Schema{Type: "string"}})
	}
	s.api.OpenAPI().AddOperation(&hop)
	s.router.handleRaw(r, h)
	s.routes = append(s.routes, r.route(query))
}

// Routes returns every route the server answers, sorted by path and
// method.
func (s *Server) Routes() []Route {
	out := slices.Clone(s.routes)
	slices.SortFunc(out, func(a, b Route) int {
		if c := strings.Compare(a.Path, b.Path); c != 0 {
			return c
		}
		return strings.Compare(a.Method, b.Method)
	})
	return out
}

// router routes a request that passed the guards (humago.Mux for huma):
// paths with a parameter on the escaped path, the fixed ones on an
// http.ServeMux (which matches them on the path with its escapes decoded,
// "/%761/stats" as /v1/stats). Each path's methods are dispatched by
// methods, so that 404 and 405 are JSON like every other error.
type router struct {
	mux   *http.ServeMux
	fixed map[string]methods // ServeMux pattern -> methods
	items []*itemPath        // the paths with a parameter
	// query are the query parameters of each "METHOD path" that reads
	// some: another one is refused (400), so that a misspelt filter does
	// not list everything.
	query map[string][]string
	own   map[string]bool // paths whose suffix names the action for their own methods only
	any   map[string]bool // patterns of Go's handlers, registered once
}

func newRouter() *router {
	return &router{mux: http.NewServeMux(), fixed: map[string]methods{}, query: map[string][]string{},
		own: map[string]bool{opFireMessage.path: opFireMessage.ownMethodOnly}, any: map[string]bool{}}
}

// itemPath is a path with a parameter, routed on the escaped path: the
// parameter is everything between prefix and suffix, so that an ID may
// hold slashes as it is sent (Kafka's topic/3/1234), "//", dot segments
// or encoded slashes. http.ServeMux would redirect the first ones to a
// cleaned path and split the parameter at each slash.
type itemPath struct {
	template       string // "/v1/dead/{id}/retry"
	prefix, suffix string // "/v1/dead/", "/retry"
	param          string // "id"
	ownMethodOnly  bool
	methods        methods
}

// HandleFunc implements humago.Mux: pattern is "METHOD /path".
func (rt *router) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	method, path, _ := strings.Cut(pattern, " ")
	key := method + " " + path
	rt.add(method, path, "", func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Cache-Control", "no-store")
		hd.Set("X-Content-Type-Options", "nosniff")
		if known, ok := rt.query[key]; ok && !checkQuery(w, r, known) {
			return
		}
		if rec, ok := w.(*recorder); ok {
			r = r.WithContext(context.WithValue(r.Context(), recorderKey{}, rec))
		}
		h(w, r)
	})
}

// setQuery records the query parameters of an operation.
func (rt *router) setQuery(method, path string, query []string) {
	if len(query) > 0 {
		rt.query[method+" "+path] = query
	}
}

// handleRaw serves a rawOp.
func (rt *router) handleRaw(r rawOp, h http.HandlerFunc) {
	if r.anyMethod {
		p := r.pattern
		if p == "" {
			p = r.path
		}
		if !rt.any[p] {
			rt.any[p] = true
			rt.mux.HandleFunc(p, h)
		}
		return
	}
	rt.add(r.method, r.path, r.pattern, h)
}

// add serves path's method with h.
func (rt *router) add(method, path, pattern string, h http.HandlerFunc) {
	prefix, rest, hasParam := strings.Cut(path, "{")
	if !hasParam {
		if pattern == "" {
			pattern = path
		}
		if rt.fixed[pattern] == nil {
			rt.fixed[pattern] = methods{}
			rt.mux.Handle(pattern, rt.fixed[pattern])
		}
		rt.fixed[pattern][method] = h
		return
	}
	param, suffix, _ := strings.Cut(rest, "}")
	i := slices.IndexFunc(rt.items, func(p *itemPath) bool { return p.template == path })
	if i < 0 {
		rt.items = append(rt.items, &itemPath{template: path, prefix: prefix, suffix: suffix, param: param,
			ownMethodOnly: rt.own[path], methods: methods{}})
		i = len(rt.items) - 1
	}
	rt.items[i].methods[method] = h
}

// finish orders the paths with a parameter, once every route is added: a
// longer prefix is tried first, and a path with a suffix before the bare
// one of its prefix.
func (rt *router) finish() {
	slices.SortFunc(rt.items, func(a, b *itemPath) int {
		if c := len(b.prefix) - len(a.prefix); c != 0 {
			return c
		}
		if c := strings.Compare(a.prefix, b.prefix); c != 0 {
			return c
		}
		return strings.Compare(b.suffix, a.suffix) // "" last
	})
	rt.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no endpoint %s", clipped(r.URL.EscapedPath())))
	})
}

// ServeHTTP serves a request: a path with a parameter when one matches,
// else the ServeMux.
func (rt *router) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.EscapedPath()
	for _, p := range rt.items {
		rest, ok := strings.CutPrefix(path, p.prefix)
		if !ok {
			continue
		}
		if p.suffix != "" {
			if rest, ok = strings.CutSuffix(rest, p.suffix); !ok {
				continue
			}
			if _, own := p.methods[r.Method]; p.ownMethodOnly && !own {
				continue
			}
		}
		value, ok := pathValue(w, p, rest)
		if !ok {
			return
		}
		r.SetPathValue(p.param, value)
		p.methods.ServeHTTP(w, r)
		return
	}
	rt.mux.ServeHTTP(w, r)
}
