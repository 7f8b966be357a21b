package admin

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// errorResponse is every error answer.
type errorResponse struct {
	Error string `json:"error"`
}

// writeJSON answers v as JSON with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v) // the client went away; nothing to do
}

// writeError answers {"error": reason} with status.
func writeError(w http.ResponseWriter, status int, reason string) {
	if rec, ok := w.(*recorder); ok {
		rec.errMsg = reason
	}
	writeJSON(w, status, errorResponse{Error: reason})
}

// noContent answers 204.
func noContent(w http.ResponseWriter) { w.WriteHeader(http.StatusNoContent) }

// methods dispatches one path by method and answers 405 with an Allow
// header for the others. A GET handler serves HEAD too.
type methods map[string]http.HandlerFunc

func (m methods) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h, ok := m[r.Method]
	if !ok && r.Method == http.MethodHead {
		h, ok = m[http.MethodGet]
	}
	if !ok {
		methodNotAllowed(w, r, m.allow())
		return
	}
	h(w, r)
}

func (m methods) allow() []string {
	var out []string
	for k := range m {
		out = append(out, k)
		if k == http.MethodGet {
			out = append(out, http.MethodHead)
		}
	}
	slices.Sort(out)
	return out
}

func methodNotAllowed(w http.ResponseWriter, r *http.Request, allow []string) {
	list := strings.Join(allow, ", ")
	w.Header().Set("Allow", list)
	writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s; allowed: %s", r.Method, r.URL.EscapedPath(), list))
}

// recorder remembers the status and error reason of an answer for the
// request log.
type recorder struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
	errMsg      string
}

func (r *recorder) WriteHeader(status int) {
	if !r.wroteHeader {
		r.status, r.wroteHeader = status, true
	}
	r.ResponseWriter.WriteHeader(status)
}

func (r *recorder) Write(b []byte) (int, error) {
	r.wroteHeader = true
	return r.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
