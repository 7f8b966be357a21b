package ui_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/delaybridge/delaybridge/pkg/admin"
)

// get requests path from the admin server's handler with extra headers
// (name, value pairs).
func get(t *testing.T, h http.Handler, method, path string, headers ...string) (*http.Response, string) {
	t.Helper()
	req := httptest.NewRequest(method, path, nil)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	body, _ := io.ReadAll(rec.Result().Body)
	return rec.Result(), string(body)
}

// TestServedByAdmin checks the page and its assets as the admin server
// mounts them: without a token even when one is configured, with their
// types, a CSP, ETags; every other path stays a JSON 404.
func TestServedByAdmin(t *testing.T) {
	h := admin.New(admin.Params{Token: "secret"}).Handler()

	res, page := get(t, h, http.MethodGet, "/")
	if res.StatusCode != http.StatusOK || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	csp := res.Header.Get("Content-Security-Policy")
	for _, want := range []string{"default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("CSP %q lacks %q", csp, want)
		}
	}

	// Every asset the page names is served with its type; nothing comes
	// from another origin.
	refs := regexp.MustCompile(`(?:src|href)="([^"]+)"`).FindAllStringSubmatch(page, -1)
	if len(refs) < 3 {
		t.Fatalf("page references %v", refs)
	}
	types := map[string]string{".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
	for _, ref := range refs {
		u := ref[1]
		if strings.Contains(u, "//") || strings.HasPrefix(u, "/") {
			t.Errorf("page loads %q: assets must be relative to the page, from the same origin", u)
			continue
		}
		res, _ := get(t, h, http.MethodGet, "/"+u)
		ext := u[strings.LastIndex(u, "."):]
		if res.StatusCode != http.StatusOK || !strings.HasPrefix(res.Header.Get("Content-Type"), types[ext]) {
			t.Errorf("GET /%s: %d %q", u, res.StatusCode, res.Header.Get("Content-Type"))
		}
		etag := res.Header.Get("ETag")
		if etag == "" || res.Header.Get("Cache-Control") != "no-cache" {
			t.Errorf("GET /%s: ETag %q Cache-Control %q", u, etag, res.Header.Get("Cache-Control"))
		}
		if res, _ := get(t, h, http.MethodGet, "/"+u, "If-None-Match", etag); res.StatusCode != http.StatusNotModified {
			t.Errorf("GET /%s with its ETag: %d, want 304", u, res.StatusCode)
		}
	}

	for _, c := range []struct {
		method, path string
		status       int
	}{
		{http.MethodHead, "/", http.StatusOK},
		{http.MethodPost, "/", http.StatusMethodNotAllowed},
		{http.MethodGet, "/ui/", http.StatusNotFound},
		{http.MethodGet, "/ui/nope.js", http.StatusNotFound},
		{http.MethodGet, "/index.html", http.StatusNotFound},
		{http.MethodGet, "/v1/stats", http.StatusUnauthorized}, // the data still needs the token
	} {
		res, body := get(t, h, c.method, c.path)
		if res.StatusCode != c.status {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, res.StatusCode, c.status)
		}
		if c.status >= 400 && !strings.Contains(body, `"error"`) {
			t.Errorf("%s %s: error answer is not JSON: %s", c.method, c.path, body)
		}
	}
}

// TestScriptWritesNoHTML guards the rule that data reaches the page only as
// text: the script never parses HTML from strings, and never puts the token
// in a URL or a cookie.
func TestScriptWritesNoHTML(t *testing.T) {
	src, err := os.ReadFile("static/app.js")
	if err != nil {
		t.Fatal(err)
	}
	for _, banned := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function", "document.cookie", "localStorage"} {
		if strings.Contains(string(src), banned) {
			t.Errorf("app.js uses %s", banned)
		}
	}
}
