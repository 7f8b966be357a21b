package daemon

import (
	"context"
	"log/slog"
	"time"

	"github.com/delaybridge/delaybridge/pkg/store"
)

// maxRateCheckTimeout bounds the recording of the sinks' max_rate before
// the scheduler starts.
const maxRateCheckTimeout = 5 * time.Second

// applyMaxRates records every sink's max_rate (rates: 0 for none) in
// Redis, where every instance of this build gives slots at it from its
// next refresh (within scheduler.max_sleep), and, for a sink whose rate
// changed, stops the slot clock before this scheduler gives a slot
// (store.ChangedRates). It returns the walk the caller runs beside the
// scheduler: once every instance had a refresh to take the new rate
// (settle: scheduler.max_sleep), it moves the changed sinks' messages
// waiting for a slot of the old rate back to their due times
// (store.Reslot), where claims give them slots at the new one.
func applyMaxRates(ctx context.Context, st *store.Store, rates map[string]float64, settle time.Duration, log *slog.Logger) (walk func(context.Context)) {
	cctx, cancel := context.WithTimeout(ctx, maxRateCheckTimeout)
	defer cancel()
	changed, layout1, err := st.ChangedRates(cctx, rates)
	switch {
	case err != nil:
		log.Warn("cannot record the sinks' max_rate in redis; the messages waiting for a publish slot of another rate keep it until the next start",
			"err", err)
	case layout1:
		log.Warn("the store has shards in layout 1, whose messages waiting for a publish slot keep the slots of the rate they got them at; `delaybridge migrate up` converts them")
	}
	if len(changed) == 0 {
		return func(context.Context) {}
	}
	return func(ctx context.Context) {
		t := time.NewTimer(settle)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		for _, sink := range changed {
			start := time.Now()
			moved, err := st.Reslot(ctx, sink)
			if err != nil {
				log.Warn("cannot move the messages waiting for a publish slot of the sink's previous max_rate; they keep their slots, and the next start walks again",
					"sink", sink, "moved", moved, "err", err)
				continue
			}
			log.Info("the sink's max_rate changed: its messages waiting for a publish slot of the previous rate take new slots",
				"sink", sink, "max_rate", rates[sink], "moved", moved, "took", time.Since(start).Round(time.Millisecond))
		}
	}
}
