package admin

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// ListView is GET /v1/messages (and `delaybridge list --json`): a page of
// messages in the order they fire, and the cursor of the next page.
type ListView struct {
	Messages []MessageView `json:"messages"`
	// NextCursor continues the listing (?cursor=); null when it is done. A
	// filtered page may hold fewer messages than limit, even none, and
	// still have a next cursor: it stopped after examining its bound.
	NextCursor *string `json:"next_cursor"`
	// Examined is how many parked messages the page looked at.
	Examined int `json:"examined"`
}

// NewListView converts a page.
func NewListView(p *store.Page, withContent bool) ListView {
	v := ListView{Messages: make([]MessageView, 0, len(p.Messages)), Examined: p.Examined}
	for _, info := range p.Messages {
		v.Messages = append(v.Messages, NewMessageView(info, withContent))
	}
	if p.Next != "" {
		next := p.Next
		v.NextCursor = &next
	}
	return v
}

// listParams are the query parameters of GET /v1/messages; a group's
// listing takes them all but group.
var listParams = []string{"state", "due_after", "due_before", "sink", "destination", "ingest", "group", "recurring", "limit", "cursor", "body"}

// BrowseQuery reads a listing's query parameters (those of GET
// /v1/messages; the command line builds the same). An unknown parameter is
// refused, so that a misspelt filter does not list everything.
func BrowseQuery(q url.Values, known []string) (store.BrowseQuery, string) {
	var bq store.BrowseQuery
	for k := range q {
		if !slices.Contains(known, k) {
			return bq, fmt.Sprintf("unknown query parameter %q; known: %s", k, strings.Join(known, ", "))
		}
	}
	for k, vs := range q {
		if len(vs) > 1 {
			return bq, fmt.Sprintf("query parameter %q is given %d times; give it once", k, len(vs))
		}
	}
	switch st := q.Get("state"); st {
	case "", store.StateScheduled, store.StateInflight, store.StateDead:
		bq.State = st
	default:
		return bq, fmt.Sprintf("state=%q: give scheduled, inflight or dead (none: scheduled and inflight)", st)
	}
	for _, b := range []struct {
		name string
		dst  *time.Time
	}{{"due_after", &bq.DueAfter}, {"due_before", &bq.DueBefore}} {
		if v := q.Get(b.name); v != "" {
			t, reason := envelope.ParseDeliverAt(v)
			if reason != "" {
				return bq, strings.ReplaceAll(reason, envelope.HeaderDeliverAt, b.name)
			}
			*b.dst = t
		}
	}
	bq.Sink, bq.Destination, bq.Ingest, bq.Group = q.Get("sink"), q.Get("destination"), q.Get("ingest"), q.Get("group")
	if v := q.Get("recurring"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return bq, fmt.Sprintf("recurring=%q is not a boolean; use recurring=true", v)
		}
		bq.Recurring = b
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > store.MaxBrowseLimit {
			return bq, fmt.Sprintf("limit=%q: give an integer from 1 to %d", v, store.MaxBrowseLimit)
		}
		bq.Limit = n
	}
	bq.Cursor = q.Get("cursor")
	return bq, ""
}

// listMessages answers a page of GET /v1/messages.
func (s *Server) listMessages(w http.ResponseWriter, r *http.Request) {
	if v, ok := s.page(w, r, listParams, nil); ok {
		writeJSON(w, http.StatusOK, v)
	}
}

// page reads one page of a listing, or answers why not and returns false;
// fix, when set, adjusts the query (a group's listing fixes the group).
func (s *Server) page(w http.ResponseWriter, r *http.Request, known []string, fix func(*store.BrowseQuery)) (ListView, bool) {
	q, reason := BrowseQuery(r.URL.Query(), known)
	if reason != "" {
		writeError(w, http.StatusBadRequest, reason)
		return ListView{}, false
	}
	withContent, ok := s.wantContent(w, r)
	if !ok {
		return ListView{}, false
	}
	if fix != nil {
		fix(&q)
	}
	p, err := s.p.Store.Browse(r.Context(), q)
	switch {
	case errors.Is(err, store.ErrBadCursor):
		writeError(w, http.StatusBadRequest, "cursor: "+strings.TrimPrefix(err.Error(), store.ErrBadCursor.Error()+": "))
		return ListView{}, false
	case err != nil:
		writeError(w, http.StatusInternalServerError, err.Error())
		return ListView{}, false
	}
	return NewListView(p, withContent), true
}
