package admin

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/delaybridge/delaybridge/pkg/store"
)

// SinkStatus is what the daemon knows of one configured sink (Params.Sinks).
type SinkStatus struct {
	Name string
	// Known is false when nothing runs that could tell whether the sink is
	// connected (the command line reading Redis): Ready, Blocked and Rate
	// are then unknown.
	Known bool
	Ready error // nil when this instance is connected to it
	// Paused is the pause as this instance applies it (Redis has the
	// pause; an instance reads it at its refresh).
	Paused  bool
	Blocked bool    // this instance holds its due messages: paused, down or failing
	Rate    float64 // messages/s this instance published to it lately
	MaxRate float64 // sinks[].max_rate; 0: none
}

// SinkView is one entry of GET /v1/sinks (and `delaybridge sinks --json`).
type SinkView struct {
	Name string `json:"name"`
	// Status sums the others up: "ready" (messages fire to it), "paused"
	// (for every instance, until resumed), "pausing" and "resuming" (the
	// pause in Redis changed, and this instance applies it at its next
	// refresh, within scheduler.max_sleep), "blocked" (this instance cannot
	// reach it, or a publish just failed for a reason that was not the
	// message's: its due messages wait), "unknown" (no daemon asked).
	Status string `json:"status"`
	// Ready is whether this instance is connected to the sink (null when
	// unknown). A paused sink can be ready.
	Ready *bool  `json:"ready"`
	Error string `json:"error,omitempty"` // why it is not ready
	// Paused is the pause kept in Redis, for every instance and across
	// restarts.
	Paused bool `json:"paused"`
	// Due counts the sink's due messages that wait for it: held while it
	// is paused or down, and released to fire, in due order, once it takes
	// messages again. A sink that takes messages holds none (its due
	// messages are in flight or about to be: see due in /v1/stats).
	Due int64 `json:"due"`
	// Rate is what this instance published to the sink, in messages/s over
	// the last 10 s (null when unknown); with several instances each shows
	// its own.
	Rate *float64 `json:"rate"`
	// MaxRate is sinks[].max_rate, the limit every instance shares through
	// Redis; 0 means none.
	MaxRate float64 `json:"max_rate"`
}

// SinkViews describes the sinks: their state in Redis (pause, held
// messages) and what the daemon knows (statuses).
func SinkViews(ctx context.Context, st *store.Store, statuses []SinkStatus) ([]SinkView, error) {
	names := make([]string, len(statuses))
	for i, ss := range statuses {
		names[i] = ss.Name
	}
	states, err := st.SinkStates(ctx, names)
	if err != nil {
		return nil, err
	}
	bands := make(map[string]int, len(names))
	for _, n := range names {
		bands[n] = states[n].Band
	}
	held, err := st.HeldBySink(ctx, bands)
	if err != nil {
		return nil, err
	}
	out := make([]SinkView, 0, len(statuses))
	for _, ss := range statuses {
		v := SinkView{Name: ss.Name, Paused: states[ss.Name].Paused, Due: held[ss.Name], MaxRate: ss.MaxRate}
		switch {
		case v.Paused && ss.Known && !ss.Paused:
			v.Status = "pausing"
		case v.Paused:
			v.Status = "paused"
		case !ss.Known:
			v.Status = "unknown"
		case ss.Paused:
			v.Status = "resuming"
		case ss.Blocked || ss.Ready != nil:
			v.Status = "blocked"
		default:
			v.Status = "ready"
		}
		if ss.Known {
			ready := ss.Ready == nil && (!ss.Blocked || ss.Paused)
			rate := ss.Rate
			v.Ready, v.Rate = &ready, &rate
			if ss.Ready != nil {
				v.Error = ss.Ready.Error()
			} else if ss.Blocked && !ss.Paused {
				v.Error = "a publish failed for a reason that was not the message's; retrying after a back-off"
			}
		}
		out = append(out, v)
	}
	return out, nil
}

// statuses returns Params.Sinks' answer sorted by name, nil without it.
func (s *Server) statuses() []SinkStatus {
	if s.p.Sinks == nil {
		return nil
	}
	out := s.p.Sinks()
	slices.SortFunc(out, func(a, b SinkStatus) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// listSinks answers GET /v1/sinks: every configured sink, by name.
func (s *Server) listSinks(w http.ResponseWriter, r *http.Request) {
	views, err := SinkViews(r.Context(), s.p.Store, s.statuses())
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, views)
}

// sinkName unescapes the sink name of a path and answers 404 when no sink
// of that name is configured.
func (s *Server) sinkName(w http.ResponseWriter, escaped string) (string, bool) {
	name, err := url.PathUnescape(escaped)
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("the sink name in the path is not validly URL-encoded: %v", err))
		return "", false
	}
	if _, ok := s.sink(name); !ok {
		statuses := s.statuses()
		known := make([]string, len(statuses))
		for j, ss := range statuses {
			known[j] = ss.Name
		}
		writeError(w, http.StatusNotFound, fmt.Sprintf("no sink %q is configured; the sinks are: %s", name, strings.Join(known, ", ")))
		return "", false
	}
	return name, true
}

// sink returns the status of the sink of that name.
func (s *Server) sink(name string) (SinkStatus, bool) {
	statuses := s.statuses()
	i := slices.IndexFunc(statuses, func(ss SinkStatus) bool { return ss.Name == name })
	if i < 0 {
		return SinkStatus{}, false
	}
	return statuses[i], true
}

// getSink answers GET /v1/sinks/{name}.
func (s *Server) getSink(w http.ResponseWriter, r *http.Request) {
	if ss, ok := s.sink(r.PathValue("name")); ok {
		s.answerSink(w, r, ss)
	}
}

// pauseSink answers POST /v1/sinks/{name}/pause, resumeSink /resume.
func (s *Server) pauseSink(w http.ResponseWriter, r *http.Request) {
	s.setPaused(w, r, r.PathValue("name"), true)
}

func (s *Server) resumeSink(w http.ResponseWriter, r *http.Request) {
	s.setPaused(w, r, r.PathValue("name"), false)
}

// setPaused pauses or resumes a sink for every instance (kept in Redis),
// applies it on this instance at once (Params.Refresh; the others within
// their refresh interval), and answers the sink's view.
func (s *Server) setPaused(w http.ResponseWriter, r *http.Request, name string, paused bool) {
	if err := s.p.Store.SetPaused(r.Context(), name, paused); err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if s.p.Refresh != nil {
		if err := s.p.Refresh(r.Context()); err != nil {
			// Redis has it: every instance applies it at its next refresh.
			s.log.Warn("sink pause recorded, but this instance could not apply it at once", "sink", name, "paused", paused, "err", err)
		}
	}
	for _, ss := range s.statuses() {
		if ss.Name == name {
			s.answerSink(w, r, ss)
			return
		}
	}
}

func (s *Server) answerSink(w http.ResponseWriter, r *http.Request, ss SinkStatus) {
	views, err := SinkViews(r.Context(), s.p.Store, []SinkStatus{ss})
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, views[0])
}
