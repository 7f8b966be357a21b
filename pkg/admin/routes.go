package admin

import (
	"fmt"
	"net/http"
	"net/http/pprof"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/delaybridge/delaybridge/pkg/admin/ui"
)

// Route is one operation the server answers: what the table in routes
// registers, and what pkg/admin/openapi.json documents (openapi_test.go
// checks both ways, and every answer against the document).
type Route struct {
	Method string // GET, POST, PATCH or DELETE; a GET route answers HEAD too
	// Path is the template, as the OpenAPI document writes it:
	// "/v1/messages/{id}/fire". A parameter is the rest of the path up to
	// the template's fixed suffix, slashes included (see below).
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

// endpoint is one row of the route table: the route and its handler.
type endpoint struct {
	method, path string
	query        []string
	statuses     []int // the route's own; register adds the rest
	handler      http.HandlerFunc

	// ownMethodOnly, for a path with a fixed suffix after its parameter
	// (an action: /fire, /retry, /pause), says that the suffix names the
	// action only for the endpoint's own method. Otherwise it names it for
	// every method, and another method answers 405 (GET /v1/dead/x/retry).
	// POST /v1/messages/{id}/fire is the one such action: no other POST
	// goes to a message, so GET, PATCH and DELETE of an ID that ends in
	// "/fire" reach that message as it is.
	ownMethodOnly bool
	// any is Go's own handlers (pprof): they answer every method
	// themselves, and the route records the methods they are meant for.
	any bool
	// pattern is the http.ServeMux pattern of a fixed path when it is not
	// the path itself ("/{$}" for "/", "/debug/pprof/" for a subtree).
	pattern string
}

// table lists every route the server answers. It is the one place routes
// are registered: New serves them (register) and Routes reports them.
func (s *Server) table() []endpoint {
	const get, post, patch, del = http.MethodGet, http.MethodPost, http.MethodPatch, http.MethodDelete
	// The statuses of an endpoint that reads Redis (500 when it cannot),
	// and of one that serves content only with a token (403: ?body=true
	// without one).
	const failed, noToken = http.StatusInternalServerError, http.StatusForbidden
	t := []endpoint{
		{method: get, path: "/healthz", statuses: []int{200}, handler: s.healthz},
		{method: get, path: "/readyz", statuses: []int{200, 503}, handler: s.readyz},
		{method: get, path: "/openapi.json", statuses: []int{200}, handler: serveOpenAPI},

		{method: get, path: "/v1/messages", query: listParams, statuses: []int{200, 400, noToken, failed}, handler: s.listMessages},
		{method: post, path: "/v1/messages", statuses: []int{201, 400, 413, failed}, handler: s.postMessage},
		{method: get, path: "/v1/messages/{id}", query: contentParams, statuses: []int{200, noToken, failed}, handler: s.getMessage},
		{method: patch, path: "/v1/messages/{id}", statuses: []int{200, 409, 413, failed}, handler: s.patchMessage},
		{method: del, path: "/v1/messages/{id}", statuses: []int{204, failed}, handler: s.deleteMessage},
		{method: post, path: "/v1/messages/{id}/fire", statuses: []int{204, 409, failed}, handler: s.fireMessage, ownMethodOnly: true},

		{method: get, path: "/v1/stats", statuses: []int{200, failed}, handler: s.stats},

		{method: get, path: "/v1/dead", query: append([]string{"limit"}, deadParams...), statuses: []int{200, 400, failed}, handler: s.listDead},
		{method: del, path: "/v1/dead", query: deadParams, statuses: []int{200, 400, failed}, handler: s.purgeDead},
		{method: get, path: "/v1/dead/{id}", query: contentParams, statuses: []int{200, noToken, failed}, handler: s.getDead},
		{method: del, path: "/v1/dead/{id}", statuses: []int{204, failed}, handler: s.deleteDead},
		{method: post, path: "/v1/dead/{id}/retry", statuses: []int{204, failed}, handler: s.retryDead},

		{method: get, path: "/v1/groups/{key}", query: groupParams, statuses: []int{200, noToken, failed}, handler: s.getGroup},
		{method: del, path: "/v1/groups/{key}", statuses: []int{200, failed}, handler: s.cancelGroup},

		{method: get, path: "/v1/sinks", statuses: []int{200, failed}, handler: s.listSinks},
		{method: get, path: "/v1/sinks/{name}", statuses: []int{200, failed}, handler: s.getSink},
		{method: post, path: "/v1/sinks/{name}/pause", statuses: []int{200, failed}, handler: s.pauseSink},
		{method: post, path: "/v1/sinks/{name}/resume", statuses: []int{200, failed}, handler: s.resumeSink},
	}
	if s.p.Metrics != nil {
		prom := promhttp.HandlerFor(s.p.Metrics.Registry, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
		t = append(t, endpoint{method: get, path: "/metrics", statuses: []int{200}, handler: prom.ServeHTTP})
	}
	// The dashboard (package ui): the page at / and its assets under /ui/.
	// They hold no data and need no token; the page's script calls /v1/.
	// http.ServeContent answers conditional and range requests.
	dashboard := ui.Handler()
	patterns := ui.Patterns()
	slices.Sort(patterns)
	for _, pattern := range patterns {
		t = append(t, endpoint{method: get, path: strings.TrimSuffix(pattern, "{$}"), pattern: pattern,
			statuses: []int{200, 206, 304, 412, 416}, handler: dashboard.ServeHTTP})
	}
	if s.p.Pprof && s.p.Token != "" {
		// Go's handlers, as Go serves them: the index, the named
		// profiles under it (a subtree), and four more.
		t = append(t,
			endpoint{method: get, path: "/debug/pprof/", handler: pprof.Index, any: true, statuses: []int{200}},
			endpoint{method: get, path: "/debug/pprof/{profile}", pattern: "/debug/pprof/", handler: pprof.Index, any: true,
				query: []string{"debug", "gc", "seconds"}, statuses: []int{200, 400, 404}},
			endpoint{method: get, path: "/debug/pprof/cmdline", handler: pprof.Cmdline, any: true, statuses: []int{200}},
			endpoint{method: get, path: "/debug/pprof/profile", handler: pprof.Profile, any: true, query: []string{"seconds"}, statuses: []int{200, 500}},
			endpoint{method: get, path: "/debug/pprof/symbol", handler: pprof.Symbol, any: true, statuses: []int{200}},
			endpoint{method: post, path: "/debug/pprof/symbol", handler: pprof.Symbol, any: true, statuses: []int{200}},
			endpoint{method: get, path: "/debug/pprof/trace", handler: pprof.Trace, any: true, query: []string{"seconds"}, statuses: []int{200, 500}},
		)
	}
	return t
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
	ownMethodOnly  bool   // see endpoint
	methods        methods
}

// register serves the table: fixed paths on the ServeMux (which matches
// them on the path with its escapes decoded, "/%761/stats" as /v1/stats),
// paths with a parameter by route. Each path's methods are dispatched by
// methods, so that 404 and 405 are JSON like every other error.
func (s *Server) register() {
	fixed := map[string]methods{}
	var order []string             // fixed patterns, as first registered
	anyMethod := map[string]bool{} // Go's handlers, registered once per pattern
	for _, e := range s.table() {
		s.routes = append(s.routes, e.route())
		prefix, rest, hasParam := strings.Cut(e.path, "{")
		switch {
		case e.any:
			if !anyMethod[e.muxPattern()] {
				anyMethod[e.muxPattern()] = true
				s.mux.HandleFunc(e.muxPattern(), e.handler)
			}
		case hasParam:
			param, suffix, _ := strings.Cut(rest, "}")
			i := slices.IndexFunc(s.items, func(p *itemPath) bool { return p.template == e.path })
			if i < 0 {
				s.items = append(s.items, &itemPath{template: e.path, prefix: prefix, suffix: suffix, param: param,
					ownMethodOnly: e.ownMethodOnly, methods: methods{}})
				i = len(s.items) - 1
			}
			s.items[i].methods[e.method] = e.handler
		default:
			p := e.muxPattern()
			if fixed[p] == nil {
				fixed[p] = methods{}
				order = append(order, p)
			}
			fixed[p][e.method] = e.handler
		}
	}
	for _, p := range order {
		s.mux.Handle(p, fixed[p])
	}
	// A longer prefix is tried first, and a path with a suffix before the
	// bare one of its prefix.
	slices.SortFunc(s.items, func(a, b *itemPath) int {
		if c := len(b.prefix) - len(a.prefix); c != 0 {
			return c
		}
		if c := strings.Compare(a.prefix, b.prefix); c != 0 {
			return c
		}
		return strings.Compare(b.suffix, a.suffix) // "" last
	})
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no endpoint %s", r.URL.EscapedPath()))
	})
}

func (e endpoint) muxPattern() string {
	if e.pattern != "" {
		return e.pattern
	}
	return e.path
}

// route is the endpoint as Routes reports it: with the statuses of its
// parameter and of the guards.
func (e endpoint) route() Route {
	st := slices.Clone(e.statuses)
	st = append(st, http.StatusForbidden) // the Host guard
	if strings.HasPrefix(e.path, "/v1/") || strings.HasPrefix(e.path, "/debug/") {
		st = append(st, http.StatusUnauthorized)
	}
	if !safeMethod(&http.Request{Method: e.method}) {
		st = append(st, http.StatusUnsupportedMediaType) // and 403 cross-origin
	}
	if _, rest, ok := strings.Cut(e.path, "{"); ok && !e.any {
		param, _, _ := strings.Cut(rest, "}")
		st = append(st, paramStatuses[param]...)
	}
	slices.Sort(st)
	return Route{Method: e.method, Path: e.path, Query: slices.Clone(e.query), Statuses: slices.Compact(st)}
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

// route serves a request that passed the guards: a path with a parameter
// when one matches, else the ServeMux.
func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	path := r.URL.EscapedPath()
	for _, p := range s.items {
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
		value, ok := s.pathParam(w, p, rest)
		if !ok {
			return
		}
		r.SetPathValue(p.param, value)
		p.methods.ServeHTTP(w, r)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// paramStatuses are the statuses of a path parameter: 400 for an ID or a
// group key that envelope.CheckID refuses (the operation checks it), 404
// for an empty one or a sink that is not configured. (A path that is not
// validly URL-encoded never gets here: net/http answers it 400 itself.)
var paramStatuses = map[string][]int{
	"id":   {http.StatusBadRequest, http.StatusNotFound},
	"key":  {http.StatusBadRequest, http.StatusNotFound},
	"name": {http.StatusNotFound},
}

// pathParam unescapes and checks a path parameter, or answers why it
// cannot be used (400, 404) and returns false.
func (s *Server) pathParam(w http.ResponseWriter, p *itemPath, escaped string) (string, bool) {
	switch p.param {
	case "id":
		return pathID(w, escaped, p.template)
	case "key":
		return groupKey(w, escaped)
	case "name":
		return sinkName(w, escaped)
	}
	panic("admin: route " + p.template + " has a parameter without a check")
}
