// Package ui is the admin server's dashboard: one HTML page, its script and
// its style sheet, embedded in the binary. There is no build step and nothing
// is loaded from another origin, so the page works on machines without
// internet access.
//
// The page holds no data itself: its script polls /metrics and the /v1/ API
// of the server that served it (by relative URLs, so it also works behind a
// reverse proxy under a path prefix). When /v1/ answers 401 the page asks for
// the admin token in a dialog, unless the link that opened it carried one in
// its fragment (/#token=<token>, which browsers never send to the server; the
// script removes it from the address bar at once). Either way the token is
// kept in the tab's sessionStorage and sent only as "Authorization: Bearer",
// never in a URL or a cookie. The page itself is served without a token (it
// is the same for everyone), but shows no data until it has one.
package ui

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed static
var static embed.FS

// securityPolicy allows the page to load only its own script, style sheet and
// icon and to call only its own server; no inline script, no framing, no
// form submission (the forms are handled by the script).
const securityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'"

type asset struct {
	name  string // file name under static/
	body  []byte
	ctype string
	etag  string
}

// assets maps a URL path to its file: "/" to index.html, "/ui/<name>" to
// every other file.
var assets = mustLoad()

func mustLoad() map[string]*asset {
	out := map[string]*asset{}
	entries, err := fs.ReadDir(static, "static")
	if err != nil {
		panic("ui: " + err.Error()) // the embed directive guarantees the directory
	}
	for _, e := range entries {
		body, err := fs.ReadFile(static, "static/"+e.Name())
		if err != nil {
			panic("ui: " + err.Error())
		}
		sum := sha256.Sum256(body)
		a := &asset{name: e.Name(), body: body, ctype: contentType(e.Name()), etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		if e.Name() == "index.html" {
			out["/"] = a
		} else {
			out["/ui/"+e.Name()] = a
		}
	}
	return out
}

func contentType(name string) string {
	switch path.Ext(name) {
	case ".html":
		return "text/html; charset=utf-8"
	case ".js":
		return "text/javascript; charset=utf-8"
	case ".css":
		return "text/css; charset=utf-8"
	case ".svg":
		return "image/svg+xml"
	}
	return "application/octet-stream"
}

// ContentType returns the Content-Type of the asset at a URL path ("/",
// "/ui/app.js"), "" when there is none.
func ContentType(urlPath string) string {
	if a, ok := assets[urlPath]; ok {
		return a.ctype
	}
	return ""
}

// Patterns returns the http.ServeMux patterns that Handler answers: "/{$}"
// for the page and one exact path per asset, so that the mux sends every
// other path to its own not-found handler.
func Patterns() []string {
	out := make([]string, 0, len(assets))
	for p := range assets {
		if p == "/" {
			p = "/{$}"
		}
		out = append(out, p)
	}
	return out
}

// Handler serves the page and its assets for GET and HEAD (the caller
// dispatches methods). Every answer carries an ETag and "Cache-Control:
// no-cache", so a browser revalidates and gets a 304 until the binary
// changes. A path that is not in Patterns answers a plain 404.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, ok := assets[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		h := w.Header()
		h.Set("Content-Type", a.ctype)
		h.Set("ETag", a.etag)
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		if strings.HasSuffix(a.name, ".html") {
			h.Set("Content-Security-Policy", securityPolicy)
			h.Set("X-Frame-Options", "DENY")
		}
		// ServeContent answers If-None-Match with 304 and HEAD without a body.
		http.ServeContent(w, r, a.name, time.Time{}, bytes.NewReader(a.body))
	})
}
