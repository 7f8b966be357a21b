package cli

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/delaybridge/delaybridge/pkg/admin"
	"github.com/delaybridge/delaybridge/pkg/daemon"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// opsBackend is where list, reschedule, fire, groups and sinks act: Redis
// directly or the admin API, like backend. Both backends implement it.
type opsBackend interface {
	List(ctx context.Context, q store.BrowseQuery, body bool) (*admin.ListView, error)
	Reschedule(ctx context.Context, id string, r rescheduleArgs) (*admin.RescheduleView, error)
	Fire(ctx context.Context, id string) error
	Group(ctx context.Context, key string, q store.BrowseQuery) (*admin.GroupView, error)
	CancelGroup(ctx context.Context, key string) (int, error)
	Sinks(ctx context.Context) ([]admin.SinkView, error)
	SetPaused(ctx context.Context, sink string, paused bool) (*admin.SinkView, error)
}

var (
	_ opsBackend = (*redisBackend)(nil)
	_ opsBackend = (*apiBackend)(nil)
)

// rescheduleArgs is a reschedule as given on the command line: the
// fields of PATCH /v1/messages/{id}, as text.
type rescheduleArgs struct {
	Delay     string `json:"delay,omitempty"`
	DeliverAt string `json:"deliver_at,omitempty"`
	IfDueAt   string `json:"if_due_at,omitempty"`
}

// errConflict is a change refused because of the message's state (in
// flight, dead, changed meanwhile).
var errConflict = errors.New("conflict")

// withOps is withBackend for the commands of opsBackend.
func (a *app) withOps(cmd *cobra.Command, f func(ctx context.Context, b opsBackend) error) error {
	return a.withBackend(cmd, func(ctx context.Context, b backend) error {
		return f(ctx, b.(opsBackend))
	})
}

// ---- through Redis ----

func (b *redisBackend) List(ctx context.Context, q store.BrowseQuery, body bool) (*admin.ListView, error) {
	p, err := b.s.Browse(ctx, q)
	if err != nil {
		return nil, err
	}
	v := admin.NewListView(p, body)
	return &v, nil
}

func (b *redisBackend) Reschedule(ctx context.Context, id string, r rescheduleArgs) (*admin.RescheduleView, error) {
	var ifDueAt time.Time
	if r.IfDueAt != "" {
		t, reason := envelope.ParseDeliverAt(r.IfDueAt)
		if reason != "" {
			return nil, errors.New(strings.ReplaceAll(reason, envelope.HeaderDeliverAt, "--if-due-at"))
		}
		ifDueAt = t
	}
	due, reason := admin.NewDueTime(r.Delay, r.DeliverAt, r.Delay != "", r.DeliverAt != "", time.Now(), daemon.Limits(b.cfg))
	if reason != "" {
		return nil, errors.New(reason)
	}
	set, err := b.s.Reschedule(ctx, id, due, ifDueAt)
	if err != nil {
		return nil, b.changeError(ctx, id, set, ifDueAt, err)
	}
	return &admin.RescheduleView{ID: id, DueAt: envelope.FormatTime(set), Now: due.IsZero()}, nil
}

func (b *redisBackend) Fire(ctx context.Context, id string) error {
	if err := b.s.Fire(ctx, id); err != nil {
		return b.changeError(ctx, id, time.Time{}, time.Time{}, err)
	}
	return nil
}

// changeError says why a reschedule or fire was refused, as the API does.
func (b *redisBackend) changeError(ctx context.Context, id string, current, ifDueAt time.Time, err error) error {
	switch {
	case errors.Is(err, store.ErrDueAtMismatch):
		return fmt.Errorf("%w: the message's due time is %s, not --if-due-at %s: it was changed meanwhile",
			errConflict, envelope.FormatTime(current), envelope.FormatTime(ifDueAt))
	case errors.Is(err, store.ErrInFlight):
		return fmt.Errorf("%w: message %q is being published now; if the publish fails it is scheduled again", errConflict, id)
	case errors.Is(err, store.ErrNotFound):
		if info, ierr := b.s.Inspect(ctx, id); ierr == nil && info.State == store.StateDead {
			return fmt.Errorf("%w: message %q is dead; `delaybridge dead retry` schedules it again", errConflict, id)
		}
		return errNotFound
	}
	return err
}

func (b *redisBackend) Group(ctx context.Context, key string, q store.BrowseQuery) (*admin.GroupView, error) {
	n, err := b.s.GroupSize(ctx, key)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, errNotFound
	}
	q.Group = key
	p, err := b.s.Browse(ctx, q)
	if err != nil {
		return nil, err
	}
	return &admin.GroupView{Group: key, Count: n, ListView: admin.NewListView(p, false)}, nil
}

func (b *redisBackend) CancelGroup(ctx context.Context, key string) (int, error) {
	n, err := b.s.CancelGroup(ctx, key)
	if err == nil && n == 0 {
		return 0, errNotFound
	}
	return n, err
}

// sinkStatuses are the configured sinks: without a daemon to ask, whether
// each is connected is unknown.
func (b *redisBackend) sinkStatuses() []admin.SinkStatus {
	out := make([]admin.SinkStatus, 0, len(b.cfg.Sinks))
	for _, sc := range b.cfg.Sinks {
		out = append(out, admin.SinkStatus{Name: sc.Name, MaxRate: sc.MaxRate})
	}
	slices.SortFunc(out, func(x, y admin.SinkStatus) int { return strings.Compare(x.Name, y.Name) })
	return out
}

func (b *redisBackend) Sinks(ctx context.Context) ([]admin.SinkView, error) {
	return admin.SinkViews(ctx, b.s, b.sinkStatuses())
}

func (b *redisBackend) SetPaused(ctx context.Context, sink string, paused bool) (*admin.SinkView, error) {
	statuses := b.sinkStatuses()
	i := slices.IndexFunc(statuses, func(s admin.SinkStatus) bool { return s.Name == sink })
	if i < 0 {
		names := make([]string, len(statuses))
		for j, s := range statuses {
			names[j] = s.Name
		}
		return nil, fmt.Errorf("%w: no sink %q is configured; the sinks are: %s", errNotFound, sink, strings.Join(names, ", "))
	}
	if err := b.s.SetPaused(ctx, sink, paused); err != nil {
		return nil, err
	}
	views, err := admin.SinkViews(ctx, b.s, statuses[i:i+1])
	if err != nil {
		return nil, err
	}
	return &views[0], nil
}

// ---- through the admin API ----

// browseValues is a listing's query as GET /v1/messages parameters.
func browseValues(q store.BrowseQuery) url.Values {
	v := url.Values{}
	set := func(k, s string) {
		if s != "" {
			v.Set(k, s)
		}
	}
	set("state", q.State)
	if !q.DueAfter.IsZero() {
		v.Set("due_after", strconv.FormatInt(q.DueAfter.UnixMilli(), 10))
	}
	if !q.DueBefore.IsZero() {
		v.Set("due_before", strconv.FormatInt(q.DueBefore.UnixMilli(), 10))
	}
	set("sink", q.Sink)
	set("destination", q.Destination)
	set("ingest", q.Ingest)
	set("group", q.Group)
	if q.Recurring {
		v.Set("recurring", "true")
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	set("cursor", q.Cursor)
	return v
}

func (b *apiBackend) List(ctx context.Context, q store.BrowseQuery, body bool) (*admin.ListView, error) {
	v := browseValues(q)
	if body {
		v.Set("body", "true")
	}
	var out admin.ListView
	if err := b.do(ctx, http.MethodGet, "/v1/messages?"+v.Encode(), &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// conflict marks the API's 409 answers as errConflict.
func conflict(err error) error {
	if err != nil && strings.Contains(err.Error(), "409 Conflict") {
		return fmt.Errorf("%w: %v", errConflict, err)
	}
	return err
}

func (b *apiBackend) Reschedule(ctx context.Context, id string, r rescheduleArgs) (*admin.RescheduleView, error) {
	var out admin.RescheduleView
	if err := b.doBody(ctx, http.MethodPatch, "/v1/messages/"+escapeID(id), r, &out); err != nil {
		return nil, conflict(err)
	}
	return &out, nil
}

func (b *apiBackend) Fire(ctx context.Context, id string) error {
	return conflict(b.do(ctx, http.MethodPost, "/v1/messages/"+escapeID(id)+"/fire", nil))
}

func (b *apiBackend) Group(ctx context.Context, key string, q store.BrowseQuery) (*admin.GroupView, error) {
	q.Group = ""
	var out admin.GroupView
	if err := b.do(ctx, http.MethodGet, "/v1/groups/"+escapeID(key)+"?"+browseValues(q).Encode(), &out); err != nil {
		return nil, err
	}
	return &out, nil
}

func (b *apiBackend) CancelGroup(ctx context.Context, key string) (int, error) {
	var out admin.CancelGroupView
	if err := b.do(ctx, http.MethodDelete, "/v1/groups/"+escapeID(key), &out); err != nil {
		return 0, err
	}
	return out.Cancelled, nil
}

func (b *apiBackend) Sinks(ctx context.Context) ([]admin.SinkView, error) {
	var out []admin.SinkView
	err := b.do(ctx, http.MethodGet, "/v1/sinks", &out)
	return out, err
}

func (b *apiBackend) SetPaused(ctx context.Context, sink string, paused bool) (*admin.SinkView, error) {
	action := "resume"
	if paused {
		action = "pause"
	}
	var out admin.SinkView
	if err := b.do(ctx, http.MethodPost, "/v1/sinks/"+url.PathEscape(sink)+"/"+action, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
