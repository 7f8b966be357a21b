package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// patchRequest is PATCH /v1/messages/{id}: the new due time, as a delay
// from now or a time, like POST /v1/messages; and optionally the due time
// the caller read, so that the change is made only if nobody changed it
// meanwhile (compare and set).
type patchRequest struct {
	Delay     json.RawMessage `json:"delay"`      // integer ms or a Go duration string
	DeliverAt json.RawMessage `json:"deliver_at"` // RFC 3339 string or integer epoch ms
	IfDueAt   json.RawMessage `json:"if_due_at"`  // RFC 3339 string or integer epoch ms
}

// RescheduleView is the answer to PATCH /v1/messages/{id}.
type RescheduleView struct {
	ID    string `json:"id"`
	DueAt string `json:"due_at"` // the due time set
	// Now is set when the new time had passed: the message is due now.
	Now bool `json:"now,omitempty"`
}

// conflictView is the 409 answer to a PATCH whose if_due_at no longer
// holds: the error and the due time the message has now.
type conflictView struct {
	Error string `json:"error"`
	DueAt string `json:"due_at"`
}

// maxPatchBytes bounds a PATCH body: three short fields.
const maxPatchBytes = 64 << 10

// NewDueTime reads a reschedule's delay or deliver_at as ingest reads
// x-delay and x-deliver-at (envelope.ParseDelay, ParseDeliverAt; a due time
// with sub-millisecond digits rounds up) and checks it against
// limits.max_delay from now. It returns the zero time for a due time that
// has passed (fire now). The reason names the request fields.
func NewDueTime(delay, deliverAt string, hasDelay, hasAt bool, now time.Time, lim envelope.Limits) (time.Time, string) {
	var due time.Time
	switch {
	case hasDelay && hasAt:
		return due, "give either delay or deliver_at, not both"
	case hasDelay:
		d, reason := envelope.ParseDelay(delay)
		if reason != "" {
			return due, apiNames.Replace(reason)
		}
		if lim.MaxDelay > 0 && d > lim.MaxDelay {
			return due, fmt.Sprintf("delay %s is over limits.max_delay %s", d, lim.MaxDelay)
		}
		due = now.Add(d)
		if t := due.Truncate(time.Millisecond); !t.Equal(due) {
			due = t.Add(time.Millisecond)
		}
	case hasAt:
		t, reason := envelope.ParseDeliverAt(deliverAt)
		if reason != "" {
			return due, apiNames.Replace(reason)
		}
		due = t
	default:
		return due, `delay or deliver_at is required: "delay": 5000 (ms) or "5m", or "deliver_at": "2026-12-01T10:00:00Z" or epoch ms; a time that has passed fires now`
	}
	switch {
	case lim.MaxDelay > 0 && due.Sub(now) > lim.MaxDelay:
		return time.Time{}, fmt.Sprintf("due time %s is more than limits.max_delay %s from now", envelope.FormatTime(due), lim.MaxDelay)
	case due.UnixMilli() >= envelope.MaxDueMs:
		return time.Time{}, fmt.Sprintf("due time %s is after %s, the latest delaybridge keeps", envelope.FormatTime(due), envelope.FormatTime(time.UnixMilli(envelope.MaxDueMs-1)))
	case !due.After(now):
		return time.Time{}, "" // passed: due now
	}
	return due, ""
}

// patchMessage reschedules a scheduled message: 200 with the new due time;
// 400 for a bad request; 404 unknown; 409 in flight, dead, or if_due_at
// not the message's due time (with the one it has).
func (s *Server) patchMessage(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var req patchRequest
	if status, reason := readJSON(w, r, maxPatchBytes, &req); reason != "" {
		writeError(w, status, reason)
		return
	}
	delay, hasDelay, reason := scalar("delay", req.Delay)
	if reason != "" {
		writeError(w, http.StatusBadRequest, reason)
		return
	}
	at, hasAt, reason := scalar("deliver_at", req.DeliverAt)
	if reason != "" {
		writeError(w, http.StatusBadRequest, reason)
		return
	}
	var ifDueAt time.Time
	if v, has, reason := scalar("if_due_at", req.IfDueAt); reason != "" {
		writeError(w, http.StatusBadRequest, reason)
		return
	} else if has {
		t, reason := envelope.ParseDeliverAt(v)
		if reason != "" {
			writeError(w, http.StatusBadRequest, strings.ReplaceAll(reason, envelope.HeaderDeliverAt, "if_due_at"))
			return
		}
		ifDueAt = t
	}
	now := time.Now()
	due, reason := NewDueTime(delay, at, hasDelay, hasAt, now, s.p.Limits)
	if reason != "" {
		writeError(w, http.StatusBadRequest, reason)
		return
	}
	set, err := s.p.Store.Reschedule(r.Context(), id, due, ifDueAt)
	if errors.Is(err, store.ErrDueAtMismatch) {
		writeJSON(w, http.StatusConflict, conflictView{
			Error: fmt.Sprintf("the message's due time is %s, not if_due_at %s: it was changed meanwhile; read it again",
				envelope.FormatTime(set), envelope.FormatTime(ifDueAt)),
			DueAt: envelope.FormatTime(set)})
		return
	}
	if err != nil {
		s.answerChange(w, r, id, "rescheduled", err)
		return
	}
	s.notify(id, set)
	writeJSON(w, http.StatusOK, RescheduleView{ID: id, DueAt: envelope.FormatTime(set), Now: due.IsZero()})
}

// fireMessage makes a scheduled message due now: 204; 404 unknown; 409 in
// flight or dead. A message held for its sink stays held, due now: it fires
// when the sink takes messages again.
func (s *Server) fireMessage(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := s.p.Store.Fire(r.Context(), id); err != nil {
		s.answerChange(w, r, id, "fired", err)
		return
	}
	s.notify(id, time.Now())
	noContent(w)
}

// answerChange answers the failure of a change to a scheduled message:
// 409 for one in flight or dead, 404 for one that is not known.
func (s *Server) answerChange(w http.ResponseWriter, r *http.Request, id, what string, err error) {
	switch {
	case errors.Is(err, store.ErrInFlight):
		writeError(w, http.StatusConflict, fmt.Sprintf("message %q is being published now and cannot be %s; "+
			"if the publish fails it is scheduled again and can be %s then", id, what, what))
	case errors.Is(err, store.ErrNotFound):
		if info, ierr := s.p.Store.Inspect(r.Context(), id); ierr == nil && info.State == store.StateDead {
			writeError(w, http.StatusConflict, fmt.Sprintf("message %q is dead and cannot be %s; retry it (POST /v1/dead/{id}/retry) to schedule it again, due now", id, what))
			return
		}
		writeError(w, http.StatusNotFound, notFound(id, false))
	default:
		writeError(w, http.StatusInternalServerError, err.Error())
	}
}

// notify wakes the scheduler for a message now due at due.
func (s *Server) notify(id string, due time.Time) {
	if s.p.Notify != nil {
		s.p.Notify(id, due)
	}
}
