package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// SinkState is what Redis records of a sink for every instance.
type SinkState struct {
	Band   int  // index of the sink's hold band
	Paused bool // POST /v1/sinks/{name}/pause, kept until resumed
	// MaxRate is the max_rate the last instance to start recorded for the
	// sink (ChangedRates; 0: none), which every instance gives slots at;
	// RateSet is false when none was recorded (an earlier release).
	MaxRate float64
	RateSet bool
}

// bandsScript gives every named sink a hold band index (once: an index
// never changes) and returns every sink's state.
// (lua/bands.lua has its KEYS, ARGV and reply.)
var bandsScript = loadScript("bands")

// SinkStates registers the named sinks (a hold band each, kept in Redis
// for every instance) and returns the state of every sink Redis knows.
func (s *Store) SinkStates(ctx context.Context, names []string) (map[string]SinkState, error) {
	args := make([]any, len(names))
	for i, n := range names {
		args[i] = n
	}
	res, err := s.runDeployment(ctx, "bands", bandsScript, []string{s.keys.Sinks()}, args...).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("store.sink_states: %w", err)
	}
	out := map[string]SinkState{}
	indexed := map[string]bool{}
	for i := 0; i+1 < len(res); i += 2 {
		field, value := res[i], res[i+1]
		switch {
		case strings.HasPrefix(field, "index:"):
			name := strings.TrimPrefix(field, "index:")
			indexed[name] = true
			st := out[name]
			st.Band, _ = strconv.Atoi(value)
			out[name] = st
		case strings.HasPrefix(field, "paused:"):
			name := strings.TrimPrefix(field, "paused:")
			st := out[name]
			st.Paused = value == "1"
			out[name] = st
		case strings.HasPrefix(field, "rate:"):
			name := strings.TrimPrefix(field, "rate:")
			if r, err := strconv.ParseFloat(value, 64); err == nil && r >= 0 {
				st := out[name]
				st.MaxRate, st.RateSet = r, true
				out[name] = st
			}
		}
	}
	for name, st := range out {
		if !indexed[name] && !st.Paused {
			delete(out, name) // a rate recorded for a sink no daemon registered: no band to say
			continue
		}
		if st.Band >= MaxBands {
			return nil, fmt.Errorf("store.sink_states: sink %q has hold band %d, over the %d there is room for", name, st.Band, MaxBands)
		}
	}
	return out, nil
}

// SetPaused pauses or resumes a sink for every instance, kept across
// restarts.
func (s *Store) SetPaused(ctx context.Context, sink string, paused bool) error {
	err := s.refused()
	switch {
	case err != nil:
	case paused:
		// A walk of a changed max_rate that paused the sink must not
		// resume it at its end: the pause is the operator's now.
		_, err = s.walkMark(ctx, sink, "pause")
	default:
		err = s.rdb.HDel(ctx, s.keys.Sinks(), pausedField(sink)).Err()
	}
	if err != nil {
		return fmt.Errorf("store.set_paused %s: %w", sink, err)
	}
	return nil
}

// bandsInUse is how many hold bands were given (the sinks hash's "bands"),
// which a listing and a count of a shard walk.
func (s *Store) bandsInUse(ctx context.Context) (int, error) {
	n, err := s.rdb.HGet(ctx, s.keys.Sinks(), "bands").Int()
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, err
	}
	s.bandsRead.Store(int64(n) + 1)
	return n, nil
}

// bandsLastRead is bandsInUse's last answer, and whether there was one.
// Bands are only ever added.
func (s *Store) bandsLastRead() (int, bool) {
	n := s.bandsRead.Load()
	return int(n - 1), n > 0
}
