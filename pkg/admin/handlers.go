package admin

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/delaybridge/delaybridge/pkg/ops"
)

const messagesPrefix = "/v1/messages/"

// The views of the operations, under their old names for callers outside
// (new code uses pkg/ops).
type (
	MessageView = ops.MessageView
	StatsView   = ops.StatsView
	DeadView    = ops.DeadView
	SinkStatus  = ops.SinkStatus
)

// errorResponse is every error answer: the sentence, and what a client
// needs beyond it (a 400's field, a 409's due time).
type errorResponse struct {
	Error string `json:"error"`
	DueAt string `json:"due_at,omitempty"`
}

// fail answers an operation's error: its kind's status and its sentence;
// any other error is a failure to reach Redis (500).
func (s *Server) fail(w http.ResponseWriter, err error) {
	var e *ops.Error
	if !errors.As(err, &e) {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	status := http.StatusInternalServerError
	switch {
	case errors.Is(e, ops.ErrNotFound):
		status = http.StatusNotFound
	case errors.Is(e, ops.ErrConflict):
		status = http.StatusConflict
	case errors.Is(e, ops.ErrInvalid):
		status = http.StatusBadRequest
	}
	if rec, ok := w.(*recorder); ok {
		rec.errMsg = e.Reason
	}
	writeJSON(w, status, errorResponse{Error: e.Reason, DueAt: e.DueAt})
}

// answer answers v with status, or the error.
func answer[T any](s *Server, w http.ResponseWriter, status int, v T, err error) {
	if err != nil {
		s.fail(w, err)
		return
	}
	if status == http.StatusNoContent {
		noContent(w)
		return
	}
	writeJSON(w, status, v)
}

// pathID unescapes the ID part of a path and answers 400 or 404 when there
// is no ID (the operation checks the ID itself).
func pathID(w http.ResponseWriter, escaped, usage string) (string, bool) {
	id, err := url.PathUnescape(escaped)
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("the message ID in the path is not validly URL-encoded: %v", err))
		return "", false
	}
	if id == "" {
		writeError(w, http.StatusNotFound, "no message ID in the path: use "+usage+" with the ID URL-encoded")
		return "", false
	}
	return id, true
}

// groupKey unescapes the group key of a path.
func groupKey(w http.ResponseWriter, escaped string) (string, bool) {
	key, err := url.PathUnescape(escaped)
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("the group in the path is not validly URL-encoded: %v", err))
		return "", false
	}
	if key == "" {
		writeError(w, http.StatusNotFound, "no group in the path: use /v1/groups/{key} with the key URL-encoded")
		return "", false
	}
	return key, true
}

// sinkName unescapes the sink name of a path.
func sinkName(w http.ResponseWriter, escaped string) (string, bool) {
	name, err := url.PathUnescape(escaped)
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("the sink name in the path is not validly URL-encoded: %v", err))
		return "", false
	}
	return name, true
}

// contentParams are the query parameters of GET /v1/messages/{id} and GET
// /v1/dead/{id}.
var contentParams = []string{"body"}

// wantContent reads ?body=: whether the answer is to carry the messages'
// key, headers and body. It answers 400 for a value that is not a boolean
// and 403 when no token is configured, and then returns ok false.
func (s *Server) wantContent(w http.ResponseWriter, r *http.Request) (withContent, ok bool) {
	if v := r.URL.Query().Get("body"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("query parameter body=%q is not a boolean; use body=true", v))
			return false, false
		}
		withContent = b
	}
	if withContent && s.p.Token == "" {
		writeError(w, http.StatusForbidden, "a message's key, headers and body are only served when admin.token is set; set it and send \"Authorization: Bearer <admin.token>\"")
		return false, false
	}
	return withContent, true
}

// checkQuery refuses an unknown or repeated query parameter, so that a
// misspelt filter does not list everything.
func checkQuery(w http.ResponseWriter, q url.Values, known []string) bool {
	for k, vs := range q {
		if !slices.Contains(known, k) {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("unknown query parameter %q; known: %s", k, strings.Join(known, ", ")))
			return false
		}
		if len(vs) > 1 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("query parameter %q is given %d times; give it once", k, len(vs)))
			return false
		}
	}
	return true
}

// intParam reads an integer query parameter; 0 when absent.
func intParam(w http.ResponseWriter, q url.Values, name string) (int, bool) {
	v := q.Get(name)
	if v == "" {
		return 0, true
	}
	n, err := strconv.Atoi(v)
	if err != nil || n == 0 {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%s=%q: give a positive integer", name, v))
		return 0, false
	}
	return n, true
}

// boolParam reads a boolean query parameter; false when absent.
func boolParam(w http.ResponseWriter, q url.Values, name string) (bool, bool) {
	v := q.Get(name)
	if v == "" {
		return false, true
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%s=%q is not a boolean; use %s=true", name, v, name))
		return false, false
	}
	return b, true
}

// listParams are the query parameters of GET /v1/messages; a group's
// listing takes them all but group.
var listParams = []string{"state", "due_after", "due_before", "sink", "destination", "ingest", "group", "recurring", "limit", "cursor", "body"}

// groupParams are the query parameters of GET /v1/groups/{key}.
var groupParams = []string{"state", "due_after", "due_before", "sink", "destination", "ingest", "recurring", "limit", "cursor", "body"}

// listQuery reads a listing's query parameters.
func (s *Server) listQuery(w http.ResponseWriter, r *http.Request, known []string) (ops.ListQuery, bool) {
	q := r.URL.Query()
	if !checkQuery(w, q, known) {
		return ops.ListQuery{}, false
	}
	lq := ops.ListQuery{State: q.Get("state"), DueAfter: q.Get("due_after"), DueBefore: q.Get("due_before"),
		Sink: q.Get("sink"), Destination: q.Get("destination"), Ingest: q.Get("ingest"), Group: q.Get("group"), Cursor: q.Get("cursor")}
	var ok bool
	if lq.Recurring, ok = boolParam(w, q, "recurring"); !ok {
		return lq, false
	}
	if lq.Limit, ok = intParam(w, q, "limit"); !ok {
		return lq, false
	}
	if lq.Content, ok = s.wantContent(w, r); !ok {
		return lq, false
	}
	return lq, true
}

func (s *Server) getMessage(w http.ResponseWriter, r *http.Request) {
	if content, ok := s.wantContent(w, r); ok {
		v, err := s.ops.Inspect(r.Context(), r.PathValue("id"), content)
		answer(s, w, http.StatusOK, v, err)
	}
}

func (s *Server) deleteMessage(w http.ResponseWriter, r *http.Request) {
	answer(s, w, http.StatusNoContent, 0, s.ops.Cancel(r.Context(), r.PathValue("id")))
}

// maxRequestBytes caps a POST body: the body may come base64-encoded or
// JSON-escaped, and so may the headers. Without limits it is 64 MiB.
func (s *Server) maxRequestBytes() int64 {
	lim := s.ops.Limits()
	if lim.MaxPayloadBytes <= 0 || lim.MaxHeaderBytes <= 0 {
		return 64 << 20
	}
	return 2*int64(lim.MaxPayloadBytes) + 2*int64(lim.MaxHeaderBytes) + 64<<10
}

func (s *Server) postMessage(w http.ResponseWriter, r *http.Request) {
	var req ops.PostRequest
	if status, reason := readJSON(w, r, s.maxRequestBytes(), &req); reason != "" {
		writeError(w, status, reason)
		return
	}
	v, err := s.ops.Post(r.Context(), &req)
	if err == nil {
		w.Header().Set("Location", messagesPrefix+url.PathEscape(v.ID))
	}
	answer(s, w, http.StatusCreated, v, err)
}

func (s *Server) listMessages(w http.ResponseWriter, r *http.Request) {
	if q, ok := s.listQuery(w, r, listParams); ok {
		v, err := s.ops.List(r.Context(), q)
		answer(s, w, http.StatusOK, v, err)
	}
}

// maxPatchBytes bounds a PATCH body: three short fields.
const maxPatchBytes = 64 << 10

func (s *Server) patchMessage(w http.ResponseWriter, r *http.Request) {
	var req ops.RescheduleRequest
	if status, reason := readJSON(w, r, maxPatchBytes, &req); reason != "" {
		writeError(w, status, reason)
		return
	}
	v, err := s.ops.Reschedule(r.Context(), r.PathValue("id"), req)
	answer(s, w, http.StatusOK, v, err)
}

func (s *Server) fireMessage(w http.ResponseWriter, r *http.Request) {
	answer(s, w, http.StatusNoContent, 0, s.ops.Fire(r.Context(), r.PathValue("id")))
}

func (s *Server) stats(w http.ResponseWriter, r *http.Request) {
	v, err := s.ops.Stats(r.Context())
	answer(s, w, http.StatusOK, v, err)
}

// deadParams are the filters of GET and DELETE /v1/dead.
var deadParams = []string{"sink", "destination", "ingest", "group", "dead_after", "dead_before"}

func deadFilter(q url.Values) ops.DeadFilter {
	return ops.DeadFilter{Sink: q.Get("sink"), Destination: q.Get("destination"), Ingest: q.Get("ingest"), Group: q.Get("group"),
		DeadAfter: q.Get("dead_after"), DeadBefore: q.Get("dead_before")}
}

func (s *Server) listDead(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if !checkQuery(w, q, append([]string{"limit"}, deadParams...)) {
		return
	}
	limit, ok := intParam(w, q, "limit")
	if !ok {
		return
	}
	v, err := s.ops.ListDead(r.Context(), ops.DeadQuery{DeadFilter: deadFilter(q), Limit: limit})
	answer(s, w, http.StatusOK, v, err)
}

func (s *Server) purgeDead(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if !checkQuery(w, q, deadParams) {
		return
	}
	v, err := s.ops.PurgeDead(r.Context(), deadFilter(q))
	answer(s, w, http.StatusOK, v, err)
}

func (s *Server) getDead(w http.ResponseWriter, r *http.Request) {
	if content, ok := s.wantContent(w, r); ok {
		v, err := s.ops.InspectDead(r.Context(), r.PathValue("id"), content)
		answer(s, w, http.StatusOK, v, err)
	}
}

func (s *Server) retryDead(w http.ResponseWriter, r *http.Request) {
	answer(s, w, http.StatusNoContent, 0, s.ops.RetryDead(r.Context(), r.PathValue("id"), ops.RetryRequest{}))
}

func (s *Server) deleteDead(w http.ResponseWriter, r *http.Request) {
	answer(s, w, http.StatusNoContent, 0, s.ops.DeleteDead(r.Context(), r.PathValue("id")))
}

func (s *Server) getGroup(w http.ResponseWriter, r *http.Request) {
	if q, ok := s.listQuery(w, r, groupParams); ok {
		v, err := s.ops.Group(r.Context(), r.PathValue("key"), q)
		answer(s, w, http.StatusOK, v, err)
	}
}

func (s *Server) cancelGroup(w http.ResponseWriter, r *http.Request) {
	v, err := s.ops.CancelGroup(r.Context(), r.PathValue("key"))
	answer(s, w, http.StatusOK, v, err)
}

func (s *Server) listSinks(w http.ResponseWriter, r *http.Request) {
	v, err := s.ops.Sinks(r.Context())
	answer(s, w, http.StatusOK, v, err)
}

func (s *Server) getSink(w http.ResponseWriter, r *http.Request) {
	v, err := s.ops.Sink(r.Context(), r.PathValue("name"))
	answer(s, w, http.StatusOK, v, err)
}

func (s *Server) pauseSink(w http.ResponseWriter, r *http.Request) {
	v, err := s.ops.SetPaused(r.Context(), r.PathValue("name"), true)
	answer(s, w, http.StatusOK, v, err)
}

func (s *Server) resumeSink(w http.ResponseWriter, r *http.Request) {
	v, err := s.ops.SetPaused(r.Context(), r.PathValue("name"), false)
	answer(s, w, http.StatusOK, v, err)
}
