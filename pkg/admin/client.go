package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/delaybridge/delaybridge/pkg/ops"
)

// Client runs the operations through a daemon's admin API: the command
// line's --admin mode. Its refusals are the *ops.Error values the server
// answered with (404, 409, 400 as ErrNotFound, ErrConflict, ErrInvalid); any
// other failure is an *HTTPError or a transport error.
type Client struct {
	base  string // scheme://host[:port][/prefix]
	token string
	http  *http.Client
}

var _ ops.Operations = (*Client)(nil)

// NewClient returns a Client of the admin API at base (e.g.
// http://127.0.0.1:7070), sending token as the bearer token when it is not
// empty. hc nil is http.DefaultClient.
func NewClient(base, token string, hc *http.Client) *Client {
	if hc == nil {
		hc = http.DefaultClient
	}
	return &Client{base: strings.TrimRight(base, "/"), token: token, http: hc}
}

// HTTPError is an answer of the admin API that is not an operation's
// refusal: 401, 403, 413, 500 and the like.
type HTTPError struct {
	Status int
	Reason string // the server's error sentence, or the status text
}

func (e *HTTPError) Error() string {
	return fmt.Sprintf("admin API: %d %s: %s", e.Status, http.StatusText(e.Status), e.Reason)
}

// do calls an operation of the table (routes.go): params fill its path's
// parameters (URL-encoded), in is the JSON body (none when nil), out what
// a JSON answer is decoded into (none when nil).
func (c *Client) do(ctx context.Context, o op, params []string, q url.Values, in, out any) error {
	path := o.path
	for i := 0; i+1 < len(params); i += 2 {
		path = strings.Replace(path, "{"+params[i]+"}", url.PathEscape(params[i+1]), 1)
	}
	var body io.Reader
	if in != nil {
		raw, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(raw)
	}
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, o.method, u, body)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if op := (*net.OpError)(nil); errors.As(err, &op) && op.Op == "dial" {
			return fmt.Errorf("admin API: %w (is the daemon running, and is %s its admin address?)", err, c.base)
		}
		return fmt.Errorf("admin API: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return fmt.Errorf("admin API: %w", err)
	}
	if resp.StatusCode != o.status {
		return answerError(resp.StatusCode, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("admin API: unexpected answer to %s %s: %w", o.method, path, err)
		}
	}
	return nil
}

// call is do for an operation that answers a view.
func invoke[T any](ctx context.Context, c *Client, o op, params []string, q url.Values, in any) (*T, error) {
	var v T
	if err := c.do(ctx, o, params, q, in, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// answerError turns an error answer back into the operation's error.
func answerError(status int, raw []byte) error {
	var e ErrorBody
	if json.Unmarshal(raw, &e) != nil || e.Message == "" {
		e.Message = http.StatusText(status)
	}
	kind := map[int]error{http.StatusNotFound: ops.ErrNotFound, http.StatusConflict: ops.ErrConflict, http.StatusBadRequest: ops.ErrInvalid}[status]
	if kind == nil {
		return &HTTPError{Status: status, Reason: e.Message}
	}
	return &ops.Error{Kind: kind, Reason: e.Message, Field: e.Field, DueAt: e.DueAt}
}

// IsUnauthorized reports whether err is the API's 401: no token, or not the
// daemon's.
func IsUnauthorized(err error) bool {
	var he *HTTPError
	return errors.As(err, &he) && he.Status == http.StatusUnauthorized
}

func id(v string) []string { return []string{"id", v} }

func content(with bool) url.Values {
	if !with {
		return nil
	}
	return url.Values{"body": {"true"}}
}

// Inspect implements ops.Operations.
func (c *Client) Inspect(ctx context.Context, msg string, with bool) (*ops.MessageView, error) {
	return invoke[ops.MessageView](ctx, c, opGetMessage, id(msg), content(with), nil)
}

// InspectDead implements ops.Operations.
func (c *Client) InspectDead(ctx context.Context, msg string, with bool) (*ops.MessageView, error) {
	return invoke[ops.MessageView](ctx, c, opGetDead, id(msg), content(with), nil)
}

// Cancel implements ops.Operations.
func (c *Client) Cancel(ctx context.Context, msg string) error {
	return c.do(ctx, opCancelMessage, id(msg), nil, nil, nil)
}

// Post implements ops.Operations.
func (c *Client) Post(ctx context.Context, req *ops.PostRequest) (*ops.PostedView, error) {
	return invoke[ops.PostedView](ctx, c, opPostMessage, nil, nil, req)
}

// listValues is a listing's query as query parameters.
func listValues(q ops.ListQuery) url.Values {
	v := url.Values{}
	set := func(k, s string) {
		if s != "" {
			v.Set(k, s)
		}
	}
	set("state", q.State)
	set("due_after", q.DueAfter)
	set("due_before", q.DueBefore)
	set("sink", q.Sink)
	set("destination", q.Destination)
	set("ingest", q.Ingest)
	set("group", q.Group)
	if q.Recurring {
		v.Set("recurring", "true")
	}
	if q.Limit != nil {
		v.Set("limit", strconv.Itoa(*q.Limit))
	}
	set("cursor", q.Cursor)
	if q.Content {
		v.Set("body", "true")
	}
	return v
}

// List implements ops.Operations.
func (c *Client) List(ctx context.Context, q ops.ListQuery) (*ops.ListView, error) {
	return invoke[ops.ListView](ctx, c, opListMessages, nil, listValues(q), nil)
}

// Reschedule implements ops.Operations.
func (c *Client) Reschedule(ctx context.Context, msg string, req ops.RescheduleRequest) (*ops.RescheduleView, error) {
	return invoke[ops.RescheduleView](ctx, c, opPatchMessage, id(msg), nil, req)
}

// Fire implements ops.Operations.
func (c *Client) Fire(ctx context.Context, msg string) error {
	return c.do(ctx, opFireMessage, id(msg), nil, nil, nil)
}

// Stats implements ops.Operations.
func (c *Client) Stats(ctx context.Context) (*ops.StatsView, error) {
	return invoke[ops.StatsView](ctx, c, opStats, nil, nil, nil)
}

// deadValues is a dead filter as query parameters.
func deadValues(f ops.DeadFilter) url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"sink": f.Sink, "destination": f.Destination, "ingest": f.Ingest, "group": f.Group,
		"dead_after": f.DeadAfter, "dead_before": f.DeadBefore} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return v
}

// ListDead implements ops.Operations.
func (c *Client) ListDead(ctx context.Context, q ops.DeadQuery) ([]ops.DeadView, error) {
	v := deadValues(q.DeadFilter)
	if q.Limit != nil {
		v.Set("limit", strconv.Itoa(*q.Limit))
	}
	out, err := invoke[[]ops.DeadView](ctx, c, opListDead, nil, v, nil)
	if err != nil {
		return nil, err
	}
	return *out, nil
}

// RetryDead implements ops.Operations.
func (c *Client) RetryDead(ctx context.Context, msg string, req ops.RetryRequest) error {
	var in any
	if req != (ops.RetryRequest{}) {
		in = req
	}
	return c.do(ctx, opRetryDead, id(msg), nil, in, nil)
}

// DeleteDead implements ops.Operations.
func (c *Client) DeleteDead(ctx context.Context, msg string) error {
	return c.do(ctx, opDeleteDead, id(msg), nil, nil, nil)
}

// PurgeDead implements ops.Operations.
func (c *Client) PurgeDead(ctx context.Context, f ops.DeadFilter) (*ops.PurgedView, error) {
	return invoke[ops.PurgedView](ctx, c, opPurgeDead, nil, deadValues(f), nil)
}

// Group implements ops.Operations.
func (c *Client) Group(ctx context.Context, key string, q ops.ListQuery) (*ops.GroupView, error) {
	q.Group = ""
	return invoke[ops.GroupView](ctx, c, opGetGroup, []string{"key", key}, listValues(q), nil)
}

// CancelGroup implements ops.Operations.
func (c *Client) CancelGroup(ctx context.Context, key string) (*ops.CancelGroupView, error) {
	return invoke[ops.CancelGroupView](ctx, c, opCancelGroup, []string{"key", key}, nil, nil)
}

// Sinks implements ops.Operations.
func (c *Client) Sinks(ctx context.Context) ([]ops.SinkView, error) {
	out, err := invoke[[]ops.SinkView](ctx, c, opListSinks, nil, nil, nil)
	if err != nil {
		return nil, err
	}
	return *out, nil
}

// Sink implements ops.Operations.
func (c *Client) Sink(ctx context.Context, name string) (*ops.SinkView, error) {
	return invoke[ops.SinkView](ctx, c, opGetSink, []string{"name", name}, nil, nil)
}

// SetPaused implements ops.Operations.
func (c *Client) SetPaused(ctx context.Context, name string, paused bool) (*ops.SinkView, error) {
	o := opResumeSink
	if paused {
		o = opPauseSink
	}
	return invoke[ops.SinkView](ctx, c, o, []string{"name", name}, nil, nil)
}
