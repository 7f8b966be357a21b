package admin

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// Bounds of GET /v1/dead?limit=N.
const (
	defaultDeadLimit = 100
	maxDeadLimit     = 10_000
)

// DeadView is one entry of GET /v1/dead (and `delaybridge dead list --json`).
type DeadView struct {
	ID          string `json:"id"`
	Reason      string `json:"reason"`
	DeadAt      string `json:"dead_at"`
	Attempts    int    `json:"attempts"`
	DueAt       string `json:"due_at,omitempty"`
	Sink        string `json:"sink"`
	Destination string `json:"destination"`
	Ingest      string `json:"ingest"`
	Size        int    `json:"size"`                   // encoded bytes in Redis
	DecodeError string `json:"decode_error,omitempty"` // the stored message cannot be decoded
}

// listDead answers the newest dead messages as a JSON array, newest first.
func (s *Server) listDead(w http.ResponseWriter, r *http.Request) {
	limit := defaultDeadLimit
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxDeadLimit {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("limit=%q: give an integer from 1 to %d", v, maxDeadLimit))
			return
		}
		limit = n
	}
	infos, err := s.p.Store.ListDead(r.Context(), limit)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, NewDeadViews(infos))
}

// NewDeadViews converts dead messages.
func NewDeadViews(infos []*store.Info) []DeadView {
	out := make([]DeadView, 0, len(infos))
	for _, info := range infos {
		v := DeadView{ID: info.ID, Reason: info.Reason, DeadAt: formatTime(info.DeadAt), Attempts: info.Attempts, Size: info.EncodedSize}
		if m := info.Message; m != nil {
			v.DueAt = envelope.FormatTime(m.DueAt)
			v.Sink, v.Destination, v.Ingest = m.Sink, m.Destination, m.Ingest
		} else if info.Err != nil {
			v.DecodeError = info.Err.Error()
		}
		out = append(out, v)
	}
	return out
}

// getDead answers GET /v1/dead/{id}: the message when it is dead.
func (s *Server) getDead(w http.ResponseWriter, r *http.Request) {
	s.inspect(w, r, r.PathValue("id"), true)
}

func (s *Server) retryDead(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	answerAction(w, s.p.Store.RetryDead(r.Context(), id), notFound(id, true))
}

// deleteDead deletes a dead message; a message that is not dead is left
// alone (404).
func (s *Server) deleteDead(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	answerAction(w, s.p.Store.DeleteDead(r.Context(), id), notFound(id, true))
}
