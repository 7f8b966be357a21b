package ops

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"time"
)

// Sinks lists the configured sinks: their state in Redis (the pause, the
// held messages) and what this instance knows (Params.Sinks).
func (s *Service) Sinks(ctx context.Context) ([]SinkView, error) {
	return s.sinkViews(ctx, s.statuses())
}

// Sink returns one configured sink.
func (s *Service) Sink(ctx context.Context, name string) (*SinkView, error) {
	ss, err := s.sink(name)
	if err != nil {
		return nil, err
	}
	views, err := s.sinkViews(ctx, []SinkStatus{ss})
	if err != nil {
		return nil, err
	}
	return &views[0], nil
}

// SetPaused pauses or resumes a sink for every instance (kept in Redis),
// applies it on this instance at once (Params.Refresh; the others within
// their refresh interval), and returns the sink as it is then, within
// applyWithin; a resume says in Released how many messages were held (read
// before), and Due counts those still held: 0 once they are released, more
// while a backlog that takes longer than applyWithin is being released.
func (s *Service) SetPaused(ctx context.Context, name string, paused bool) (*SinkView, error) {
	before, err := s.Sink(ctx, name)
	if err != nil {
		return nil, err
	}
	if err := s.p.Store.SetPaused(ctx, name, paused); err != nil {
		return nil, err
	}
	var cut error // this instance may not have applied it yet
	if s.p.Refresh != nil {
		rctx, cancel := context.WithTimeout(ctx, applyWithin)
		cut = s.p.Refresh(rctx)
		cancel()
	}
	v, err := s.Sink(ctx, name) // as this instance sees it now
	if err == nil && !paused && before.Paused {
		v.Released = before.Due
	}
	if cut != nil {
		// Redis has it: every instance applies it at its next refresh. A
		// resume releases held messages as it is applied (those of every
		// open sink), which for a long pause's backlog takes longer than a
		// caller waits (1.38M took 73 s): applied here, it goes on at each
		// refresh.
		if applied := err == nil && v.Status != "pausing" && v.Status != "resuming"; applied && errors.Is(cut, context.DeadlineExceeded) {
			s.log.Info("sink pause or resume applied; held messages are still being released, at each refresh", "sink", name, "paused", paused)
		} else {
			s.log.Warn("sink pause recorded, but this instance could not apply it at once", "sink", name, "paused", paused, "err", cut)
		}
	}
	return v, err
}

// applyWithin bounds what a pause or resume waits for this instance to
// apply it: the answer comes within it (the admin CLI waits 30 s), and a
// resume's release of held messages that takes longer goes on at the
// scheduler's next refreshes.
const applyWithin = 5 * time.Second

// statuses returns Params.Sinks' answer sorted by name.
func (s *Service) statuses() []SinkStatus {
	if s.p.Sinks == nil {
		return nil
	}
	out := slices.Clone(s.p.Sinks())
	slices.SortFunc(out, func(a, b SinkStatus) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// sink returns the status of the configured sink of that name.
func (s *Service) sink(name string) (SinkStatus, error) {
	statuses := s.statuses()
	i := slices.IndexFunc(statuses, func(ss SinkStatus) bool { return ss.Name == name })
	if i < 0 {
		known := make([]string, len(statuses))
		for j, ss := range statuses {
			known[j] = ss.Name
		}
		return SinkStatus{}, notFound("no sink %s is configured; the sinks are: %s", quote(name), strings.Join(known, ", "))
	}
	return statuses[i], nil
}

// sinkViews describes sinks: their state in Redis and what this instance
// knows of them.
func (s *Service) sinkViews(ctx context.Context, statuses []SinkStatus) ([]SinkView, error) {
	names := make([]string, len(statuses))
	for i, ss := range statuses {
		names[i] = ss.Name
	}
	states, err := s.p.Store.SinkStates(ctx, names)
	if err != nil {
		return nil, err
	}
	bands := make(map[string]int, len(names))
	for _, n := range names {
		bands[n] = states[n].Band
	}
	held, err := s.p.Store.HeldBySink(ctx, bands)
	if err != nil {
		return nil, err
	}
	out := make([]SinkView, 0, len(statuses))
	for _, ss := range statuses {
		v := SinkView{Name: ss.Name, Paused: states[ss.Name].Paused, Due: held[ss.Name], MaxRate: ss.MaxRate}
		if st := states[ss.Name]; st.RateSet {
			v.MaxRate = st.MaxRate // in force for every instance
		}
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
			rate := math.Round(ss.Rate*100) / 100 // a rate of messages/s, not a float's last digits
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
