// Package admin is delaybridge's admin HTTP server (the contract's "Admin
// HTTP API"): health and readiness probes, Prometheus metrics, the
// dashboard, and under /v1/ the operations of pkg/ops (inspecting, listing,
// cancelling, scheduling and rescheduling messages, groups, the dead
// messages, pausing sinks) and the daemon's recent history
// (history.go). The operations are written in pkg/ops; a handler here
// only takes what the request says, calls them, and answers their view or
// their error. Client is the same operations through this API.
//
// Every answer is JSON (Content-Type: application/json) except /metrics, the
// dashboard page at / (package ui) and the empty 204s; every error is
// {"error": "<reason an operator can act on>"}.
//
// When a token is configured, every /v1/ request needs
// "Authorization: Bearer <token>"; /healthz, /readyz, /metrics and
// /openapi.json never do, so that probes and scrapers need no secret. A
// message's content (its key, headers and body) is served only when a
// token is configured and asked for (GET /v1/messages/{id}?body=true), so
// that an unauthenticated admin port never leaks payloads or the
// credentials headers may carry; /readyz shows the addresses in its reason
// only to a caller with the token.
//
// Before any of that, every request passes the guards of guard.go: an
// allowed Host (against DNS rebinding), and for a state-changing method a
// same-origin browser request or none, and a JSON body or none (against
// cross-site requests). Every JSON body is read by strictjson.Decode,
// which is stricter than encoding/json.
//
// Message IDs in paths are URL-encoded by clients ("topic/3/1234" may be sent
// as "topic%2F3%2F1234" or as is). Under /v1/dead/, a path ending in "/retry"
// names the retry action: a dead message whose ID itself ends in "/retry" is
// reached by encoding that slash ("%2Fretry"). The same holds for a POST to
// /v1/messages/{id}/fire, and for /v1/sinks/{name}/pause and /resume.
//
// Every route is a row of one table (routes.go), which Routes reports;
// the OpenAPI document is generated from the handlers' Go types (api.go,
// openapi.go), served at /openapi.json, and openapi_test.go validates real
// answers against it.
package admin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/danielgtaylor/huma/v2"

	"github.com/delaybridge/delaybridge/pkg/logrepeat"
	"github.com/delaybridge/delaybridge/pkg/metrics"
	"github.com/delaybridge/delaybridge/pkg/ops"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// Params configure a Server.
type Params struct {
	Listen string // host:port; port 0 picks a free port (see Addr)
	// Listener, when set, is Listen bound already (the daemon binds it
	// before it dials the brokers): Start serves on it, and closes it.
	Listener net.Listener

	// Token, when set, is required on every /v1/ request as
	// "Authorization: Bearer <token>". It also enables serving message
	// bodies.
	Token string

	// TLS, when set, serves HTTPS.
	TLS *tls.Config

	// Pprof serves Go's runtime profiles under /debug/pprof/ (behind the
	// token like /v1/), for diagnosing CPU and memory use in production.
	// It requires Token: without one it is not served (and logged).
	Pprof bool

	// AllowedHosts are the names a request's Host may give (port aside);
	// empty means Listen's host, localhost, 127.0.0.1 and ::1 when Listen
	// is on loopback, and any Host otherwise.
	AllowedHosts []string

	// Ops runs the operations of /v1/. When nil, a Service on Store with
	// no limits, every sink name known and no sink listed is used (for
	// tools and tests that only read).
	Ops   *ops.Service
	Store *store.Store

	// Ready returns nil when the daemon is ready, else the reason served
	// by /readyz with 503. nil means always ready.
	Ready func() error

	// Addresses are the configured addresses of Redis, as the
	// configuration writes them: /readyz hides them from a caller without
	// the token whatever their form (a named port such as
	// "redis.internal:redis", which the patterns of redactAddresses do not
	// take for an address), beside everything those patterns hide.
	Addresses []string

	// Warnings are what /readyz lists under "warnings", ready or not:
	// what an operator should fix that does not stop the daemon (a Redis
	// that keeps nothing on disk). nil: none.
	Warnings func() []string

	// Metrics is served on /metrics; nil serves 404 there.
	Metrics *metrics.Metrics

	// RepeatInterval is log.repeat_interval: a failed request (5xx) is
	// logged at WARN at most once per method and status per interval, the
	// others counted (0: each is logged).
	RepeatInterval time.Duration

	Logger *slog.Logger // nil discards
}

// Server is the admin HTTP server. Its handler is safe for concurrent use.
type Server struct {
	p       Params
	ops     *ops.Service
	log     *slog.Logger
	router  *router  // every route (routes.go)
	api     huma.API // the JSON operations on router (api.go)
	routes  []Route  // every route registered, for Routes
	history *history // the recent samples of GET /v1/history (history.go)
	handler http.Handler
	token   [sha256.Size]byte // hash of Params.Token, compared in constant time
	hosts   hostGuard
	decodes *decodeBudget     // the JSON bodies decoded at once
	bodies  *bodyBudget       // the request bodies held at once
	fails   *logrepeat.Warner // the failed requests logged (Params.RepeatInterval)

	mu        sync.Mutex
	srv       *http.Server
	ln        net.Listener
	done      chan struct{} // closed when Serve returned
	stopFails func()        // ends the summaries of failed requests
}

// maxFailKeys bounds the (method, status) keys of the failed requests'
// limiter.
const maxFailKeys = 64

// Server timeouts. A slow client cannot hold a connection forever; the
// write timeout leaves room for a large dead list over a slow link.
const (
	readHeaderTimeout = 10 * time.Second
	readTimeout       = time.Minute
	writeTimeout      = 2 * time.Minute
	idleTimeout       = 2 * time.Minute
)

// New returns a Server; Start listens, Handler serves without listening.
func New(p Params) *Server {
	if p.Logger == nil {
		p.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{p: p, log: p.Logger, ops: p.Ops, router: newRouter(), token: sha256.Sum256([]byte(p.Token)),
		hosts: newHostGuard(p.AllowedHosts, p.Listen)}
	if s.ops == nil {
		s.ops = ops.New(ops.Params{Store: p.Store, Logger: p.Logger})
	}

	if p.Pprof && p.Token == "" {
		s.log.Warn("admin pprof is not served: it needs admin.token (profiles hold goroutine stacks, heap contents and the command line)")
	}
	s.decodes = newDecodeBudget(s.ops.Limits().MaxDocumentBytes())
	s.bodies = newBodyBudget(s.ops.Limits().MaxDocumentBytes())
	s.fails = logrepeat.NewWarner(s.log, "admin request failed", p.RepeatInterval, maxFailKeys)
	s.history = newHistory(p.Metrics, HistoryEvery, HistoryWindow)
	s.api = s.newAPI()
	s.register()
	s.handler = http.HandlerFunc(s.serve)
	return s
}

// Handler returns the server's handler (for httptest or another server).
func (s *Server) Handler() http.Handler { return s.handler }

// Start listens on Params.Listen and serves in the background. It returns
// once the port is bound, or the error when it cannot be (e.g. taken).
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		return errors.New("admin server already started")
	}
	ln := s.p.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", s.p.Listen); err != nil {
			return fmt.Errorf("%w (set admin.listen to a free host:port)", err)
		}
	}
	if s.p.TLS != nil {
		ln = tls.NewListener(ln, s.p.TLS)
	}
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	s.srv, s.ln, s.done = srv, ln, make(chan struct{})
	s.history.start()
	ctx, stop := context.WithCancel(context.Background())
	failsDone := make(chan struct{})
	go func() { defer close(failsDone); s.fails.Run(ctx, time.Now) }()
	s.stopFails = func() { stop(); <-failsDone }
	if s.p.Token == "" {
		s.log.Warn("the admin API has no token: whoever reaches "+ln.Addr().String()+" can list, cancel, schedule and retry messages; set admin.token (or token_file)",
			"addr", ln.Addr().String())
	}
	go func() {
		defer close(s.done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("admin server stopped", "addr", ln.Addr().String(), "err", err)
		}
	}()
	return nil
}

// Addr returns the address the server listens on ("" before Start), with
// the actual port when Params.Listen asked for port 0.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// Shutdown stops listening and waits for the requests in progress until ctx
// ends (then it closes their connections and returns ctx's error). It is a
// no-op before Start.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	srv, done, stopFails := s.srv, s.done, s.stopFails
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	s.history.halt()
	err := srv.Shutdown(ctx)
	if err != nil {
		_ = srv.Close()
	}
	<-done
	stopFails() // and says what the last interval kept quiet
	return err
}

// serve is the root handler: request logging, the guards, the token check
// for /v1/ and /debug/, then the route (routes.go).
func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rec := &recorder{ResponseWriter: w, status: http.StatusOK}
	if r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody {
		rec.body = &readBody{ReadCloser: r.Body}
		r.Body = rec.body
	}
	path := r.URL.EscapedPath()
	defer func() {
		attrs := []any{"method", r.Method, "path", path, "status", rec.status,
			"duration", time.Since(start), "remote", r.RemoteAddr}
		// A 503 of /readyz is "not ready", which probes ask every few
		// seconds: the reason is in readiness, not worth a warning each time.
		if rec.status >= 500 && (rec.status != http.StatusServiceUnavailable || path != "/readyz") {
			// Once per method and status per log.repeat_interval: a Redis
			// that does not answer, or requests whose clients gave up (a
			// process resumed after a stop), make a line per interval.
			s.fails.Warn(r.Method+" "+strconv.Itoa(rec.status), time.Now(), append(attrs, "err", rec.errMsg)...)
		} else {
			s.log.Debug("admin request", attrs...)
		}
	}()

	if !s.guardHost(rec, r) {
		return
	}
	if needsToken(r) && !s.authorized(rec, r) {
		return
	}
	if !s.guardChange(rec, r) {
		return
	}
	release, ok := s.bodies.admit(rec, r)
	if !ok {
		return
	}
	defer release()
	s.router.ServeHTTP(rec, r)
}

// needsToken reports whether r is for /v1/ or /debug/, however its path is
// spelled: the ServeMux routes on the decoded path, so "/%761/stats" reaches
// the /v1/stats handler and must be checked like it.
func needsToken(r *http.Request) bool {
	for _, p := range []string{r.URL.Path, r.URL.EscapedPath()} {
		if strings.HasPrefix(p, "/v1/") || strings.HasPrefix(p, "/debug/") {
			return true
		}
	}
	return false
}

// authorized checks the bearer token when one is configured, and answers
// 401 when it is missing or wrong.
func (s *Server) authorized(w http.ResponseWriter, r *http.Request) bool {
	if s.p.Token == "" {
		return true
	}
	switch s.bearer(r) {
	case tokenMissing:
		w.Header().Set("WWW-Authenticate", `Bearer realm="delaybridge"`)
		writeError(w, http.StatusUnauthorized, "missing token: send the header \"Authorization: Bearer <admin.token>\"")
		return false
	case tokenWrong:
		w.Header().Set("WWW-Authenticate", `Bearer realm="delaybridge", error="invalid_token"`)
		writeError(w, http.StatusUnauthorized, "invalid token: the bearer token does not match admin.token")
		return false
	}
	return true
}

type tokenCheck int

const (
	tokenMissing tokenCheck = iota
	tokenWrong
	tokenValid
)

// bearer checks r's bearer token against the configured one (which must be
// set).
func (s *Server) bearer(r *http.Request) tokenCheck {
	return s.bearerHeader(r.Header.Get("Authorization"))
}

// bearerHeader checks an Authorization header.
func (s *Server) bearerHeader(h string) tokenCheck {
	scheme, got, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(got) == "" {
		return tokenMissing
	}
	// Comparing hashes keeps the comparison constant-time in the token's
	// length too.
	sum := sha256.Sum256([]byte(strings.TrimSpace(got)))
	if subtle.ConstantTimeCompare(sum[:], s.token[:]) != 1 {
		return tokenWrong
	}
	return tokenValid
}
