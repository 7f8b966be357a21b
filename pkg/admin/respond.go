package admin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/jsonlimit"
)

// writeJSON answers v as JSON with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = EncodeJSON(w, v, "") // the client went away; nothing to do
}

// EncodeJSON writes v as JSON and a newline, indented by indent when it is
// not empty, with every character that envelope.IsHidden names (C0 and
// C1 controls, DEL, bidirectional overrides and isolates, the invisible
// default-ignorable code points) written as a \uXXXX escape: the decoded
// strings are the same, but a terminal or a page showing the raw JSON
// cannot be made to show an ID or a value as another one. The admin API
// and the CLI's JSON output use it.
func EncodeJSON(w io.Writer, v any, indent string) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if indent != "" {
		enc.SetIndent("", indent)
	}
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := w.Write(escapeDeceptive(buf.Bytes()))
	return err
}

// escapeDeceptive escapes the runes envelope.IsHidden names in encoded
// JSON, where they can only be inside strings (encoding/json already
// escapes C0 controls; the newline ending the encoding is kept).
func escapeDeceptive(b []byte) []byte {
	if !bytes.ContainsFunc(b[:max(0, len(b)-1)], func(r rune) bool { return r >= 0x7f && envelope.IsHidden(r) }) {
		return b
	}
	out := make([]byte, 0, len(b)+32)
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r >= 0x7f && envelope.IsHidden(r) {
			out = envelope.AppendEscape(out, r)
		} else {
			out = append(out, b[i:i+n]...)
		}
		i += n
	}
	return out
}

// writeError answers {"error": reason} with status, outside the
// operations (guards, 404, 405).
func writeError(w http.ResponseWriter, status int, reason string) {
	if rec, ok := w.(*recorder); ok {
		rec.errMsg = reason
	}
	writeJSON(w, status, &ErrorBody{Message: reason})
}

// clipped is what an error answer quotes of a value the client sent (a
// path, a parameter's name or value): at most 64 bytes, so that no answer
// grows with the request (pkg/ops quotes IDs and filters alike).
func clipped(v string) string { return jsonlimit.Clip(v, 64) }

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
	writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s; allowed: %s", clipped(r.Method), clipped(r.URL.EscapedPath()), list))
}

// recorder remembers the status and error reason of an answer for the
// request log.
type recorder struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
	errMsg      string
	body        *readBody // the request's body, when it has one (Server.serve)
}

func (r *recorder) WriteHeader(status int) {
	if r.wroteHeader {
		// A second status (an error met after the answer began, a request
		// whose client went away meanwhile) cannot be sent: dropped here,
		// as Go's server would, but without its "superfluous
		// response.WriteHeader" line.
		return
	}
	r.status, r.wroteHeader = status, true
	if status >= 400 && r.body != nil && !r.body.done {
		// A refusal before the body was read closes the connection at
		// once: Go's server would otherwise read the rest of the body (up
		// to 256 KiB) before closing it or reusing it, and a client that
		// announced one and sends nothing held it for the read timeout (a
		// minute). The read deadline ends that read.
		r.Header().Set("Connection", "close")
		_ = http.NewResponseController(r.ResponseWriter).SetReadDeadline(time.Now())
	}
	r.ResponseWriter.WriteHeader(status)
}

// readBody is a request body that says whether it was read to its end.
type readBody struct {
	io.ReadCloser
	done bool
}

func (b *readBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.done = true
	}
	return n, err
}

func (r *recorder) Write(b []byte) (int, error) {
	r.wroteHeader = true
	return r.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
