package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

// do sends a request (a JSON body when in is not nil) and decodes a JSON
// answer into out (when not nil).
func (c *Client) do(ctx context.Context, method, path string, q url.Values, in, out any) error {
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
	req, err := http.NewRequestWithContext(ctx, method, u, body)
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
		return fmt.Errorf("admin API: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return fmt.Errorf("admin API: %w", err)
	}
	if resp.StatusCode >= 300 {
		return answerError(resp.StatusCode, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("admin API: unexpected answer to %s %s: %w", method, path, err)
		}
	}
	return nil
}

// answerError turns an error answer back into the operation's error.
func answerError(status int, raw []byte) error {
	var e errorResponse
	if json.Unmarshal(raw, &e) != nil || e.Error == "" {
		e.Error = http.StatusText(status)
	}
	kind := map[int]error{http.StatusNotFound: ops.ErrNotFound, http.StatusConflict: ops.ErrConflict, http.StatusBadRequest: ops.ErrInvalid}[status]
	if kind == nil {
		return &HTTPError{Status: status, Reason: e.Error}
	}
	return &ops.Error{Kind: kind, Reason: e.Error, DueAt: e.DueAt}
}

// IsUnauthorized reports whether err is the API's 401: no token, or not the
// daemon's.
func IsUnauthorized(err error) bool {
	var he *HTTPError
	return errors.As(err, &he) && he.Status == http.StatusUnauthorized
}

func esc(s string) string { return url.PathEscape(s) }

// Inspect implements ops.Operations.
func (c *Client) Inspect(ctx context.Context, id string, content bool) (*ops.MessageView, error) {
	var v ops.MessageView
	return &v, c.do(ctx, http.MethodGet, "/v1/messages/"+esc(id), contentQuery(content), nil, &v)
}

// InspectDead implements ops.Operations.
func (c *Client) InspectDead(ctx context.Context, id string, content bool) (*ops.MessageView, error) {
	var v ops.MessageView
	return &v, c.do(ctx, http.MethodGet, "/v1/dead/"+esc(id), contentQuery(content), nil, &v)
}

func contentQuery(content bool) url.Values {
	if !content {
		return nil
	}
	return url.Values{"body": {"true"}}
}

// Cancel implements ops.Operations.
func (c *Client) Cancel(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/messages/"+esc(id), nil, nil, nil)
}

// Post implements ops.Operations.
func (c *Client) Post(ctx context.Context, req *ops.PostRequest) (*ops.PostedView, error) {
	var v ops.PostedView
	return &v, c.do(ctx, http.MethodPost, "/v1/messages", nil, req, &v)
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
	if q.Limit != 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	set("cursor", q.Cursor)
	if q.Content {
		v.Set("body", "true")
	}
	return v
}

// List implements ops.Operations.
func (c *Client) List(ctx context.Context, q ops.ListQuery) (*ops.ListView, error) {
	var v ops.ListView
	return &v, c.do(ctx, http.MethodGet, "/v1/messages", listValues(q), nil, &v)
}

// Reschedule implements ops.Operations.
func (c *Client) Reschedule(ctx context.Context, id string, req ops.RescheduleRequest) (*ops.RescheduleView, error) {
	var v ops.RescheduleView
	return &v, c.do(ctx, http.MethodPatch, "/v1/messages/"+esc(id), nil, req, &v)
}

// Fire implements ops.Operations.
func (c *Client) Fire(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodPost, "/v1/messages/"+esc(id)+"/fire", nil, nil, nil)
}

// Stats implements ops.Operations.
func (c *Client) Stats(ctx context.Context) (*ops.StatsView, error) {
	var v ops.StatsView
	return &v, c.do(ctx, http.MethodGet, "/v1/stats", nil, nil, &v)
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
	if q.Limit != 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	var out []ops.DeadView
	return out, c.do(ctx, http.MethodGet, "/v1/dead", v, nil, &out)
}

// RetryDead implements ops.Operations.
func (c *Client) RetryDead(ctx context.Context, id string, req ops.RetryRequest) error {
	var in any
	if req != (ops.RetryRequest{}) {
		in = req
	}
	return c.do(ctx, http.MethodPost, "/v1/dead/"+esc(id)+"/retry", nil, in, nil)
}

// DeleteDead implements ops.Operations.
func (c *Client) DeleteDead(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/dead/"+esc(id), nil, nil, nil)
}

// PurgeDead implements ops.Operations.
func (c *Client) PurgeDead(ctx context.Context, f ops.DeadFilter) (*ops.PurgedView, error) {
	var v ops.PurgedView
	return &v, c.do(ctx, http.MethodDelete, "/v1/dead", deadValues(f), nil, &v)
}

// Group implements ops.Operations.
func (c *Client) Group(ctx context.Context, key string, q ops.ListQuery) (*ops.GroupView, error) {
	q.Group = ""
	var v ops.GroupView
	return &v, c.do(ctx, http.MethodGet, "/v1/groups/"+esc(key), listValues(q), nil, &v)
}

// CancelGroup implements ops.Operations.
func (c *Client) CancelGroup(ctx context.Context, key string) (*ops.CancelGroupView, error) {
	var v ops.CancelGroupView
	return &v, c.do(ctx, http.MethodDelete, "/v1/groups/"+esc(key), nil, nil, &v)
}

// Sinks implements ops.Operations.
func (c *Client) Sinks(ctx context.Context) ([]ops.SinkView, error) {
	var out []ops.SinkView
	return out, c.do(ctx, http.MethodGet, "/v1/sinks", nil, nil, &out)
}

// Sink implements ops.Operations.
func (c *Client) Sink(ctx context.Context, name string) (*ops.SinkView, error) {
	var v ops.SinkView
	return &v, c.do(ctx, http.MethodGet, "/v1/sinks/"+esc(name), nil, nil, &v)
}

// SetPaused implements ops.Operations.
func (c *Client) SetPaused(ctx context.Context, name string, paused bool) (*ops.SinkView, error) {
	action := "/resume"
	if paused {
		action = "/pause"
	}
	var v ops.SinkView
	return &v, c.do(ctx, http.MethodPost, "/v1/sinks/"+esc(name)+action, nil, nil, &v)
}
