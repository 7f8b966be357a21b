package admin

import (
	"mime"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strings"
)

// The guards in front of every handler, against browsers that are made to
// talk to the admin port (docs/security.md, "The admin API"):
//
//   - hostGuard refuses a Host header that is not one of the allowed names,
//     so that a page whose domain was re-bound to 127.0.0.1 (DNS rebinding)
//     cannot read or change anything;
//   - crossOrigin refuses a state-changing request that a browser marks as
//     coming from another origin (Sec-Fetch-Site, else Origin vs Host);
//   - jsonOnly refuses a state-changing request that carries a body that is
//     not application/json, which a page of another origin could only send
//     after a CORS preflight that this server never grants.
//
// Clients that are not browsers (curl, the CLI, scripts) send neither
// Origin nor Sec-Fetch-Site and are not affected by the second.

// hostGuard is the set of Host names the server answers; nil answers any.
type hostGuard map[string]bool

// loopbackDefaults are the names every loopback listener answers to.
var loopbackDefaults = []string{"localhost", "127.0.0.1", "::1"}

// newHostGuard returns the guard for allowed (admin.allowed_hosts) and the
// listen address: allowed when given; else, when listen is on loopback, its
// host and loopbackDefaults; else nil (any Host, as a server on a public
// address is reached by names it cannot know).
func newHostGuard(allowed []string, listen string) hostGuard {
	if len(allowed) == 0 {
		host, _, err := net.SplitHostPort(listen)
		if err != nil || !isLoopback(host) {
			return nil
		}
		allowed = append([]string{host}, loopbackDefaults...)
	}
	g := hostGuard{}
	for _, h := range allowed {
		g[normalHost(h)] = true
	}
	return g
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// normalHost is a host name as compared: without port and brackets, lower
// case, without a trailing dot.
func normalHost(hostport string) string {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	return strings.TrimSuffix(strings.ToLower(host), ".")
}

// allows reports whether the request's Host is allowed.
func (g hostGuard) allows(r *http.Request) bool {
	return g == nil || g[normalHost(r.Host)]
}

// safeMethod reports whether a request cannot change state (GET, HEAD,
// OPTIONS); every other method is guarded wherever it is sent.
func safeMethod(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return true
	}
	return false
}

// crossOrigin is Go's CSRF check: a browser request with Sec-Fetch-Site
// other than same-origin or none, or else with an Origin whose host is not
// the request's Host, is refused. Origin "null" (sandboxed frames, some
// redirects) is refused too.
var crossOrigin = http.NewCrossOriginProtection()

// jsonBody reports whether a state-changing request's body is acceptable:
// none at all (no Content-Type and an empty body, as curl -X POST and the
// dashboard send for actions), or declared application/json, whatever its
// case and parameters, which it makes the one the API reads.
func jsonBody(r *http.Request) bool {
	ct := r.Header.Get("Content-Type")
	if ct == "" && r.ContentLength == 0 {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return false
	}
	r.Header.Set("Content-Type", "application/json")
	return true
}

// guardHost refuses a request for a Host this server does not answer to,
// and answers the refusal; false means the request must not go further.
// It runs first: a name rebound to this address learns nothing, not even
// whether a token is needed.
func (s *Server) guardHost(w http.ResponseWriter, r *http.Request) bool {
	if !s.hosts.allows(r) {
		writeError(w, http.StatusForbidden, "Host "+quoteHost(r.Host)+" is not one this server answers to; "+
			"use the address it listens on, or add the name to admin.allowed_hosts")
		return false
	}
	return true
}

// guardChange refuses a state-changing request from a page of another
// origin or with a body that is not JSON, and answers the refusal; false
// means the request must not go further. It runs after the token check,
// so that a request without the token is a 401 whatever else it is.
func (s *Server) guardChange(w http.ResponseWriter, r *http.Request) bool {
	if safeMethod(r) {
		return true
	}
	if err := crossOrigin.Check(r); err != nil {
		writeError(w, http.StatusForbidden, "cross-origin request refused: a "+r.Method+
			" from a page of another origin cannot change anything here (the dashboard works from this server's own address)")
		return false
	}
	if !jsonBody(r) {
		writeError(w, http.StatusUnsupportedMediaType, "a "+r.Method+" with a body needs Content-Type: application/json (got "+
			quoteHost(r.Header.Get("Content-Type"))+")")
		return false
	}
	if r.Method == http.MethodDelete && r.ContentLength != 0 {
		// Nothing reads it: a purge whose filters came in a body would
		// delete every dead message.
		writeError(w, http.StatusBadRequest, "a DELETE takes no body: give its filters as query parameters (DELETE /v1/dead?group=...)")
		return false
	}
	return true
}

// quoteHost quotes a client-sent value for an error text, bounded.
func quoteHost(v string) string {
	if len(v) > 100 {
		v = v[:100] + "..."
	}
	return `"` + strings.ToValidUTF8(strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || r == '"' {
			return '?'
		}
		return r
	}, v), "?") + `"`
}

// Patterns of network addresses in readiness reasons: URLs, IP addresses
// (v4, v6 bracketed or not, with or without a port), host:port, and the
// host names that DNS and TLS errors quote.
var addressPatterns = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`\b([a-zA-Z][a-zA-Z0-9+.-]*)://[^\s"',;()]+`), "$1://<address>"},
	{regexp.MustCompile(`\[[0-9A-Fa-f:.%a-zA-Z]*:[0-9A-Fa-f:.%a-zA-Z]*\](:\d+)?`), "<address>"},
	{regexp.MustCompile(`\b\d{1,3}(\.\d{1,3}){3}(:\d+)?\b`), "<address>"},
	{regexp.MustCompile(`[0-9A-Fa-f:]*::[0-9A-Fa-f:.]*|\b([0-9A-Fa-f]{1,4}:){7}[0-9A-Fa-f]{1,4}\b`), "<address>"},
	{regexp.MustCompile(`\b[A-Za-z0-9]([A-Za-z0-9_-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9_-]*[A-Za-z0-9])?)*\.?:\d{1,5}\b`), "<address>"},
	{regexp.MustCompile(`\blookup [^\s:]+`), "lookup <address>"},
	{regexp.MustCompile(`\bcertificate is valid for [^;]*?, not [^\s;:]+`), "certificate is valid for other names"},
}

// redactAddresses removes network addresses from a reason, keeping its
// words: what /readyz shows to a caller without the token, so that a
// probe or a stranger learns why the daemon is not ready but not where its
// Redis and brokers are. The configured addresses go first, as written
// (longest first, so that none leaves a part of another), each with the
// name it is a part of (replaceAddress), then whatever the patterns find.
func redactAddresses(reason string, configured ...string) string {
	configured = slices.Clone(configured)
	slices.SortFunc(configured, func(a, b string) int { return len(b) - len(a) })
	for _, a := range configured {
		if a != "" {
			reason = replaceAddress(reason, a)
		}
	}
	for _, p := range addressPatterns {
		reason = p.re.ReplaceAllString(reason, p.with)
	}
	return reason
}

// replaceAddress replaces each occurrence of addr in s with "<address>",
// together with the rest of the name it is a part of
// ("shard-0.redis.internal:6379" for "redis.internal:6379",
// "nats.internal:6380" for ":6380", "redis.internal:redis2" for
// "redis.internal:redis"), so that no part of a name is left behind:
// hiding too much is safe. A colon or a period that ends the name (the
// reason's punctuation) stays.
func replaceAddress(s, addr string) string {
	if addr == "" {
		return s
	}
	namePart := func(c byte) bool {
		return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_' || c == ':'
	}
	var b strings.Builder
	for {
		i := strings.Index(s, addr)
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		from, end := i, i+len(addr)
		for from > 0 && namePart(s[from-1]) {
			from--
		}
		for end < len(s) && namePart(s[end]) {
			end++
		}
		for end > i+len(addr) && (s[end-1] == ':' || s[end-1] == '.') {
			end--
		}
		b.WriteString(s[:from])
		b.WriteString("<address>")
		s = s[end:]
	}
}
