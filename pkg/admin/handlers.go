package admin

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"

	"github.com/danielgtaylor/huma/v2"

	"github.com/delaybridge/delaybridge/pkg/ops"
)

// The handlers of the operations (routes.go): each takes what huma bound
// from the request, calls pkg/ops, and answers its view or its error
// (failure, the one mapping of errors to statuses).

// The views of the operations, under their old names for callers outside
// (new code uses pkg/ops).
type (
	MessageView = ops.MessageView
	StatsView   = ops.StatsView
	DeadView    = ops.DeadView
	SinkStatus  = ops.SinkStatus
)

// The parameters of the operations, embedded in their inputs.

// IDParam is the path parameter of a message.
type IDParam struct {
	ID string `path:"id" doc:"The message ID, URL-encoded (orders%2F3%2F1234)."`
}

// ContentParam asks for a message's content.
type ContentParam struct {
	Content bool `query:"body" doc:"Include the key, headers and body (served only when admin.token is set: 403 otherwise)."`
}

// ListParams are the query parameters of a listing; a group's listing
// takes them all but group.
type ListParams struct {
	State       string `query:"state" enum:"scheduled,held,inflight,dead" doc:"Absent: scheduled, held and inflight. held: waiting for a sink that is paused or down. dead lists the dead messages by time of death."`
	DueAfter    string `query:"due_after" doc:"Inclusive bound on the due time (of death with state=dead): RFC 3339 or Unix milliseconds."`
	DueBefore   string `query:"due_before" doc:"Exclusive bound on the due time (of death with state=dead): RFC 3339 or Unix milliseconds."`
	Sink        string `query:"sink" doc:"Only messages to this sink."`
	Destination string `query:"destination" doc:"Only messages to this destination."`
	Ingest      string `query:"ingest" doc:"Only messages from this ingest."`
	Recurring   bool   `query:"recurring" doc:"Only recurring messages."`
	Limit       Count  `query:"limit" minimum:"1" maximum:"1000" doc:"Messages per page; default 100."`
	Cursor      string `query:"cursor" doc:"A page's next_cursor, to continue the listing."`
	ContentParam
}

func (f ListParams) query(group string) ops.ListQuery {
	return ops.ListQuery{State: f.State, DueAfter: f.DueAfter, DueBefore: f.DueBefore, Sink: f.Sink, Destination: f.Destination,
		Ingest: f.Ingest, Group: group, Recurring: f.Recurring, Limit: f.Limit.given(), Cursor: f.Cursor, Content: f.Content}
}

type listInput struct {
	ListParams
	Group string `query:"group" doc:"Only messages of this group (x-delay-group)."`
}

// DeadParams are the query parameters of GET and DELETE /v1/dead.
type DeadParams struct {
	Sink        string `query:"sink" doc:"Only dead messages to this sink."`
	Destination string `query:"destination" doc:"Only dead messages to this destination."`
	Ingest      string `query:"ingest" doc:"Only dead messages from this ingest."`
	Group       string `query:"group" doc:"Only dead messages of this group."`
	DeadAfter   string `query:"dead_after" doc:"Inclusive bound on the time of death: RFC 3339 or Unix milliseconds."`
	DeadBefore  string `query:"dead_before" doc:"Exclusive bound on the time of death: RFC 3339 or Unix milliseconds."`
}

func (f DeadParams) filter() ops.DeadFilter {
	return ops.DeadFilter{Sink: f.Sink, Destination: f.Destination, Ingest: f.Ingest, Group: f.Group, DeadAfter: f.DeadAfter, DeadBefore: f.DeadBefore}
}

type listDeadInput struct {
	DeadParams
	Limit Count `query:"limit" minimum:"1" maximum:"10000" doc:"How many of the newest; default 100."`
}

// Count is an integer query parameter that knows whether it was given
// (huma's ParamWrapper and ParamReactor): limit=0 is refused, an absent
// limit is the default.
type Count struct {
	n   int
	set bool
}

// Receiver implements huma.ParamWrapper.
func (c *Count) Receiver() reflect.Value { return reflect.ValueOf(&c.n).Elem() }

// OnParamSet implements huma.ParamReactor.
func (c *Count) OnParamSet(isSet bool, _ any) { c.set = isSet }

// Schema implements huma.SchemaProvider.
func (Count) Schema(huma.Registry) *huma.Schema { return &huma.Schema{Type: "integer"} }

// given is the count, nil when absent.
func (c Count) given() *int {
	if !c.set {
		return nil
	}
	return &c.n
}

// GroupParam is the path parameter of a group.
type GroupParam struct {
	Key string `path:"key" doc:"The group (x-delay-group), URL-encoded."`
}

// SinkParam is the path parameter of a sink.
type SinkParam struct {
	Name string `path:"name" doc:"A configured sink's name, URL-encoded."`
}

// health is the answer of the probes.
type health struct {
	Status   string   `json:"status" enum:"ok,ready,not ready"`
	Error    string   `json:"error,omitempty" doc:"Why it is not ready."`
	Warnings []string `json:"warnings,omitempty" doc:"What an operator should fix that does not stop the daemon, ready or not: a Redis that keeps nothing on disk."`
}

type readyOutput struct {
	Status int
	Body   health
}

func (s *Server) healthz(ctx context.Context, _ *struct{}) (*body[health], error) {
	return &body[health]{Body: health{Status: "ok"}}, nil
}

// readyz answers 200 or 503 with the reason. The reason names the
// addresses of Redis and the brokers only for a caller with the token:
// probes need no secret, and a stranger learns why, not where.
func (s *Server) readyz(ctx context.Context, in *struct {
	Authorization string `header:"Authorization" hidden:"true"`
}) (*readyOutput, error) {
	redact := s.p.Token == "" || s.bearerHeader(in.Authorization) != tokenValid
	var warnings []string
	if s.p.Warnings != nil {
		for _, w := range s.p.Warnings() {
			if redact {
				w = redactAddresses(w, s.p.Addresses...)
			}
			warnings = append(warnings, w)
		}
	}
	if s.p.Ready != nil {
		if err := s.p.Ready(); err != nil {
			reason := err.Error()
			if redact {
				reason = redactAddresses(reason, s.p.Addresses...)
			}
			return &readyOutput{Status: http.StatusServiceUnavailable, Body: health{Status: "not ready", Error: reason, Warnings: warnings}}, nil
		}
	}
	return &readyOutput{Status: http.StatusOK, Body: health{Status: "ready", Warnings: warnings}}, nil
}

// content refuses a message's content when no token is configured.
func (s *Server) content(c ContentParam) error {
	if c.Content && s.p.Token == "" {
		return &ErrorBody{status: http.StatusForbidden,
			Message: "a message's key, headers and body are only served when admin.token is set; set it and send \"Authorization: Bearer <admin.token>\""}
	}
	return nil
}

func (s *Server) listMessages(ctx context.Context, in *listInput) (*body[ops.ListView], error) {
	if err := s.content(in.ContentParam); err != nil {
		return nil, failure(ctx, err)
	}
	v, err := s.ops.List(ctx, in.query(in.Group))
	return answer(ctx, v, err)
}

type postInput struct {
	Body ops.PostRequest
}

type postedOutput struct {
	Location string `header:"Location" doc:"/v1/messages/{id} of the message."`
	Body     ops.PostedView
}

func (s *Server) postMessage(ctx context.Context, in *postInput) (*postedOutput, error) {
	v, err := s.ops.Post(ctx, &in.Body)
	if err != nil {
		return nil, failure(ctx, err)
	}
	return &postedOutput{Location: "/v1/messages/" + url.PathEscape(v.ID), Body: *v}, nil
}

func (s *Server) getMessage(ctx context.Context, in *struct {
	IDParam
	ContentParam
}) (*body[ops.MessageView], error) {
	if err := s.content(in.ContentParam); err != nil {
		return nil, failure(ctx, err)
	}
	v, err := s.ops.Inspect(ctx, in.ID, in.Content)
	return answer(ctx, v, err)
}

func (s *Server) patchMessage(ctx context.Context, in *struct {
	IDParam
	Body ops.RescheduleRequest
}) (*body[ops.RescheduleView], error) {
	v, err := s.ops.Reschedule(ctx, in.ID, in.Body)
	return answer(ctx, v, err)
}

func (s *Server) cancelMessage(ctx context.Context, in *IDParam) (*struct{}, error) {
	return done(ctx, s.ops.Cancel(ctx, in.ID))
}

func (s *Server) fireMessage(ctx context.Context, in *IDParam) (*struct{}, error) {
	return done(ctx, s.ops.Fire(ctx, in.ID))
}

func (s *Server) stats(ctx context.Context, _ *struct{}) (*body[ops.StatsView], error) {
	v, err := s.ops.Stats(ctx)
	return answer(ctx, v, err)
}

func (s *Server) listDead(ctx context.Context, in *listDeadInput) (*body[[]ops.DeadView], error) {
	v, err := s.ops.ListDead(ctx, ops.DeadQuery{DeadFilter: in.filter(), Limit: in.Limit.given()})
	return answer(ctx, &v, err)
}

func (s *Server) purgeDead(ctx context.Context, in *DeadParams) (*body[ops.PurgedView], error) {
	v, err := s.ops.PurgeDead(ctx, in.filter())
	return answer(ctx, v, err)
}

func (s *Server) getDead(ctx context.Context, in *struct {
	IDParam
	ContentParam
}) (*body[ops.MessageView], error) {
	if err := s.content(in.ContentParam); err != nil {
		return nil, failure(ctx, err)
	}
	v, err := s.ops.InspectDead(ctx, in.ID, in.Content)
	return answer(ctx, v, err)
}

func (s *Server) deleteDead(ctx context.Context, in *IDParam) (*struct{}, error) {
	return done(ctx, s.ops.DeleteDead(ctx, in.ID))
}

func (s *Server) retryDead(ctx context.Context, in *struct {
	IDParam
	Body *ops.RetryRequest
}) (*struct{}, error) {
	var req ops.RetryRequest
	if in.Body != nil {
		req = *in.Body
	}
	return done(ctx, s.ops.RetryDead(ctx, in.ID, req))
}

func (s *Server) getGroup(ctx context.Context, in *struct {
	GroupParam
	ListParams
}) (*body[ops.GroupView], error) {
	if err := s.content(in.ContentParam); err != nil {
		return nil, failure(ctx, err)
	}
	v, err := s.ops.Group(ctx, in.Key, in.query(""))
	return answer(ctx, v, err)
}

func (s *Server) cancelGroup(ctx context.Context, in *GroupParam) (*body[ops.CancelGroupView], error) {
	v, err := s.ops.CancelGroup(ctx, in.Key)
	return answer(ctx, v, err)
}

func (s *Server) getHistory(ctx context.Context, _ *struct{}) (*body[HistoryView], error) {
	return &body[HistoryView]{Body: s.history.view()}, nil
}

func (s *Server) listSinks(ctx context.Context, _ *struct{}) (*body[[]ops.SinkView], error) {
	v, err := s.ops.Sinks(ctx)
	return answer(ctx, &v, err)
}

func (s *Server) getSink(ctx context.Context, in *SinkParam) (*body[ops.SinkView], error) {
	v, err := s.ops.Sink(ctx, in.Name)
	return answer(ctx, v, err)
}

func (s *Server) pauseSink(ctx context.Context, in *SinkParam) (*body[ops.SinkView], error) {
	v, err := s.ops.SetPaused(ctx, in.Name, true)
	return answer(ctx, v, err)
}

func (s *Server) resumeSink(ctx context.Context, in *SinkParam) (*body[ops.SinkView], error) {
	v, err := s.ops.SetPaused(ctx, in.Name, false)
	return answer(ctx, v, err)
}

// pathValue unescapes the parameter of a path and answers 400 or 404 when
// there is none to use (the operation checks the value itself).
func pathValue(w http.ResponseWriter, p *itemPath, escaped string) (string, bool) {
	what := map[string]string{"id": "the message ID", "key": "the group", "name": "the sink name"}[p.param]
	v, err := url.PathUnescape(escaped)
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%s in the path is not validly URL-encoded: %v", what, err))
		return "", false
	}
	if v == "" && p.param != "name" {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no %s in the path: use %s with it URL-encoded", strings.TrimPrefix(what, "the "), p.template))
		return "", false
	}
	return v, true
}

// checkQuery refuses an unknown, repeated, empty or malformed query
// parameter of an operation that reads known ones, so that a misspelt
// filter, or one given empty (?group=) or not validly URL-encoded
// (?group=%zz, which would reach the operation empty), does not list or
// purge everything.
func checkQuery(w http.ResponseWriter, r *http.Request, known []string) bool {
	query, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		reason := fmt.Sprintf("the query is not validly URL-encoded (%s): encode each name and value, %%25 for a %%, and separate them with &", clipped(err.Error()))
		if rec, ok := w.(*recorder); ok {
			rec.errMsg = reason
		}
		writeJSON(w, http.StatusBadRequest, &ErrorBody{Message: reason})
		return false
	}
	// A query of nothing (?, ?&, ?&&) is what a script's filters make when
	// each is empty: read as none, it would select everything.
	if len(query) == 0 && (r.URL.ForceQuery || r.URL.RawQuery != "") {
		reason := "the query has no parameter (" + clipped("?"+r.URL.RawQuery) + "): give each filter a name and a value, or send no query to select everything"
		if rec, ok := w.(*recorder); ok {
			rec.errMsg = reason
		}
		writeJSON(w, http.StatusBadRequest, &ErrorBody{Message: reason})
		return false
	}
	for k, vs := range query {
		reason := ""
		switch {
		case !slices.Contains(known, k):
			reason = fmt.Sprintf("unknown query parameter %q; known: %s", clipped(k), strings.Join(known, ", "))
		case len(vs) > 1:
			reason = fmt.Sprintf("query parameter %q is given %d times; give it once", k, len(vs))
		case vs[0] == "":
			reason = ops.EmptyFilter(k).Error()
		default:
			continue
		}
		if rec, ok := w.(*recorder); ok {
			rec.errMsg = reason
		}
		writeJSON(w, http.StatusBadRequest, &ErrorBody{Message: reason, Field: clipped(k)})
		return false
	}
	return true
}
