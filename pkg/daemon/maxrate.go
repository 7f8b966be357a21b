package daemon

import (
	"context"
	"log/slog"
	"time"

	"github.com/delaybridge/delaybridge/pkg/store"
)

// maxRateCheckTimeout bounds the comparison of the sinks' max_rate with
// the recorded ones before the scheduler starts.
const maxRateCheckTimeout = 5 * time.Second

// applyMaxRates makes a changed sinks[].max_rate (a restart with another
// value, or one taken away) reach the messages that already wait for a
// publish slot of the old rate: it stops the changed sinks' slot clocks
// before the scheduler gives a slot (store.ChangedRates), and returns the
// walk that moves their waiting messages back to their due times
// (store.Reslot), which the caller runs beside the scheduler, whose claims
// then give them slots at the new rate. rates has every sink, 0 for none.
func applyMaxRates(ctx context.Context, st *store.Store, rates map[string]float64, log *slog.Logger) (walk func(context.Context)) {
	cctx, cancel := context.WithTimeout(ctx, maxRateCheckTimeout)
	defer cancel()
	changed, err := st.ChangedRates(cctx, rates)
	if err != nil {
		log.Warn("cannot compare the sinks' max_rate with the rate their waiting messages got publish slots at; a changed max_rate reaches those at the next start",
			"err", err)
	}
	if len(changed) == 0 {
		return func(context.Context) {}
	}
	return func(ctx context.Context) {
		for _, sink := range changed {
			start := time.Now()
			moved, layout1, err := st.Reslot(ctx, sink, rates[sink])
			switch {
			case err != nil:
				log.Warn("cannot move the messages waiting for a publish slot of the sink's previous max_rate; they keep their slots, and the next start tries again",
					"sink", sink, "moved", moved, "err", err)
			case layout1 > 0:
				log.Warn("the sink's max_rate changed, and its messages waiting for a slot in shards of layout 1 keep the slots of the previous rate; `delaybridge migrate up` converts them",
					"sink", sink, "shards_in_layout_1", layout1, "moved", moved)
			default:
				log.Info("the sink's max_rate changed: its messages waiting for a publish slot of the previous rate take new slots",
					"sink", sink, "max_rate", rates[sink], "moved", moved, "took", time.Since(start).Round(time.Millisecond))
			}
		}
	}
}
