package daemon

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/delaybridge/delaybridge/pkg/lifecycle"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// maxRateCheckTimeout bounds the recording of the sinks' max_rate before
// the scheduler starts.
const maxRateCheckTimeout = 5 * time.Second

// takeOverEvery is how often a running instance looks for a walk of a
// changed max_rate whose walker went silent (store.TakeOverWalks).
const takeOverEvery = 10 * time.Second

// applyMaxRates records every sink's max_rate (rates: 0 for none) in
// Redis, where every instance of this build gives slots at it from its
// next refresh (within scheduler.max_sleep), and, for a sink whose rate
// changed while slots were given ahead, stops the slot clock and pauses
// the sink before this scheduler gives a slot (store.ChangedRates). It
// returns what the caller runs beside the scheduler: once every instance
// had a refresh to apply the pause (settle), the walk that moves the
// changed sinks' messages waiting for a slot of the old rate back to
// their due times and resumes the sinks (store.Reslot); then, every
// takeOverEvery, the takeover of walks whose walker stopped, which would
// leave their sinks paused.
func applyMaxRates(ctx context.Context, st *store.Store, rates map[string]float64, settle time.Duration, log *slog.Logger) (run func(context.Context)) {
	cctx, cancel := context.WithTimeout(ctx, maxRateCheckTimeout)
	defer cancel()
	changed, layout1, err := st.ChangedRates(cctx, rates)
	if err != nil {
		log.Warn("cannot record the sinks' max_rate in redis yet; trying again beside the scheduler, which meanwhile gives slots at the rate recorded before",
			"err", err)
	} else {
		said(changed, layout1, rates, settle, log)
	}
	names := slices.Sorted(maps.Keys(rates))
	return func(ctx context.Context) {
		if err != nil {
			// As if this instance had started once Redis answered: the
			// others gave slots at the recorded rate meanwhile, as they do
			// until any instance records another.
			// The sinks the first try changed before its error are paused
			// for their walk already: walked too.
			if more, layout1, ok := recordRates(ctx, st, rates, log); ok {
				said(more, layout1, rates, settle, log)
				for _, sink := range more {
					if !slices.Contains(changed, sink) {
						changed = append(changed, sink)
					}
				}
			}
		}
		walk(ctx, st, changed, rates, settle, log)
		lifecycle.Every(ctx, takeOverEvery, func() {
			taken, err := st.TakeOverWalks(ctx, names)
			if err != nil && ctx.Err() == nil {
				log.Debug("cannot look for walks of a changed max_rate left by a stopped instance; retrying", "err", err)
			}
			for _, sink := range taken {
				log.Warn("taking over the walk of a changed max_rate whose walker went silent (stopped, or cut off from Redis), its sink paused", "sink", sink, "silent_for", store.ReslotStale)
			}
			walk(ctx, st, taken, rates, settle, log)
		})
	}
}

// said logs what applyMaxRates found.
func said(changed []string, layout1 bool, rates map[string]float64, settle time.Duration, log *slog.Logger) {
	if layout1 {
		log.Warn("the store has shards in layout 1, whose messages waiting for a publish slot keep the slots of the rate they got them at; `delaybridge migrate up` converts them")
	}
	for _, sink := range changed {
		log.Info("the sink's max_rate changed while publish slots were given ahead: the sink is paused for every instance while its waiting messages are moved back to take slots at the new rate",
			"sink", sink, "max_rate", rates[sink], "walk_in", settle)
	}
}

// recordRates is store.ChangedRates tried again with back-off until it
// answers (true) or ctx ends.
func recordRates(ctx context.Context, st *store.Store, rates map[string]float64, log *slog.Logger) (changed []string, layout1, ok bool) {
	bo := lifecycle.Backoff{Min: 500 * time.Millisecond, Max: 10 * time.Second}
	for attempt := 1; bo.Wait(ctx, nil); attempt++ {
		cctx, cancel := context.WithTimeout(ctx, maxRateCheckTimeout)
		changed, layout1, err := st.ChangedRates(cctx, rates)
		cancel()
		if err == nil {
			log.Info("recorded the sinks' max_rate in redis", "attempts", attempt+1)
			return changed, layout1, true
		}
		if attempt%20 == 0 {
			log.Warn("cannot record the sinks' max_rate in redis yet; trying again", "err", err, "attempts", attempt+1)
		}
	}
	return nil, false, false
}

// walk waits settle, saying each second that the walks go on, then walks
// each sink (store.Reslot).
func walk(ctx context.Context, st *store.Store, sinks []string, rates map[string]float64, settle time.Duration, log *slog.Logger) {
	if len(sinks) == 0 {
		return
	}
	stopped := func() {
		log.Warn("stopped before the walk of a changed max_rate ended: its sinks stay paused until another instance takes the walk over (within a minute)",
			"sinks", sinks)
	}
	end := time.Now().Add(settle)
	for time.Now().Before(end) {
		for _, sink := range sinks {
			_ = st.ReslotAlive(ctx, sink)
		}
		t := time.NewTimer(min(time.Second, time.Until(end)))
		select {
		case <-ctx.Done():
			t.Stop()
			stopped()
			return
		case <-t.C:
		}
	}
	for i, sink := range sinks {
		start := time.Now()
		moved, err := reslot(ctx, st, sinks[i:], log)
		switch {
		case ctx.Err() != nil:
			stopped()
			return
		case errors.Is(err, store.ErrWalkGone):
			log.Info("the walk of the sink's changed max_rate was ended by another instance", "sink", sink, "moved_here", moved)
		case err != nil:
			log.Warn("cannot move the messages waiting for a publish slot of the sink's previous max_rate; the sink stays paused until an instance takes the walk over (within a minute)",
				"sink", sink, "moved", moved, "err", err)
		default:
			log.Info("the sink's max_rate changed: its messages waiting for a publish slot of the previous rate take new slots; the sink is resumed unless it was paused before",
				"sink", sink, "max_rate", rates[sink], "moved", moved, "took", time.Since(start).Round(time.Millisecond))
		}
	}
}

// reslot walks the first of sinks (store.Reslot), again with back-off
// while it fails (a failover: Redis refusing, or out of reach), keeping
// the marks of the walks it has yet to make alive, until reslotRetryFor
// after the first failure: a walk given up at its first error left its
// sink paused until a running instance found the mark stale, 30 s on. A
// walk that goes on is not bounded (it says it is alive as it goes: a
// large backlog takes seconds). It stops when another instance ended the
// walk (store.ErrWalkGone). It returns how many messages the calls moved,
// and the last error.
func reslot(ctx context.Context, st *store.Store, sinks []string, log *slog.Logger) (int, error) {
	bo := lifecycle.Backoff{Min: 200 * time.Millisecond, Max: 2 * time.Second}
	var deadline time.Time
	total := 0
	for {
		moved, err := st.Reslot(ctx, sinks[0])
		total += moved
		if deadline.IsZero() {
			deadline = time.Now().Add(reslotRetryFor)
		}
		if err == nil || errors.Is(err, store.ErrWalkGone) || ctx.Err() != nil || time.Now().After(deadline) {
			return total, err
		}
		log.Debug("cannot move the messages waiting for a publish slot of the sink's previous max_rate yet; retrying", "sink", sinks[0], "err", err)
		for _, s := range sinks {
			_ = st.ReslotAlive(ctx, s)
		}
		if !bo.Wait(ctx, nil) {
			return total, err
		}
	}
}

// reslotRetryFor bounds reslot's retries: two thirds of store.ReslotStale,
// so that no running instance takes the walk over while this one still
// tries (its mark may not be refreshed while Redis is away).
const reslotRetryFor = store.ReslotStale * 2 / 3
