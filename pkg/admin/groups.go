package admin

import (
	"fmt"
	"net/http"
	"net/url"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// GroupView is GET /v1/groups/{key}: the group's size and a page of its
// messages in the order they fire (parked ones unless ?state= says
// otherwise), as GET /v1/messages?group={key} lists them.
type GroupView struct {
	Group string `json:"group"`
	// Count is every message filed under the group: scheduled, in flight
	// and dead.
	Count int64 `json:"count"`
	ListView
}

// CancelGroupView is the answer to DELETE /v1/groups/{key}.
type CancelGroupView struct {
	Group     string `json:"group"`
	Cancelled int    `json:"cancelled"`
}

// groupParams are the query parameters of GET /v1/groups/{key}.
var groupParams = []string{"state", "due_after", "due_before", "sink", "destination", "ingest", "recurring", "limit", "cursor", "body"}

// groupKey unescapes the group key of a path; a key x-delay-group would
// refuse is refused here too.
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
	if reason := envelope.CheckID("the group in the path", key, 0); reason != "" {
		writeError(w, http.StatusBadRequest, reason)
		return "", false
	}
	return key, true
}

func noGroup(key string) string {
	return fmt.Sprintf("no message is filed under group %q (x-delay-group)", key)
}

// getGroup answers the group's size and a page of its messages; 404 when
// no message is filed under it.
func (s *Server) getGroup(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	n, err := s.p.Store.GroupSize(r.Context(), key)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if n == 0 {
		writeError(w, http.StatusNotFound, noGroup(key))
		return
	}
	v, ok := s.page(w, r, groupParams, func(q *store.BrowseQuery) { q.Group = key })
	if ok {
		writeJSON(w, http.StatusOK, GroupView{Group: key, Count: n, ListView: v})
	}
}

// cancelGroup cancels every message of the group: 200 with how many; 404
// when none is filed under it. A message already in flight may still be
// published once, as with a cancel by ID.
func (s *Server) cancelGroup(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	n, err := s.p.Store.CancelGroup(r.Context(), key)
	switch {
	case err != nil:
		writeError(w, http.StatusInternalServerError, err.Error())
	case n == 0:
		writeError(w, http.StatusNotFound, noGroup(key))
	default:
		writeJSON(w, http.StatusOK, CancelGroupView{Group: key, Cancelled: n})
	}
}
