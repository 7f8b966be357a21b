package daemon

import (
	"context"
	"log/slog"
	"time"

	"github.com/delaybridge/delaybridge/pkg/store"
)

// deadBoundEvery is how often the dead messages of each source are held
// to limits.max_dead: a source that goes past it is back at it within
// this.
const deadBoundEvery = time.Second

// boundDead holds each source's dead messages (every ingest of sources,
// and the admin API as "") to max, deleting the oldest beyond it, every
// deadBoundEvery until ctx ends. A failure is logged and tried again at the
// next tick: the dead messages wait, nothing else does.
func boundDead(ctx context.Context, st *store.Store, sources []string, max int, log *slog.Logger) {
	t := time.NewTicker(deadBoundEvery)
	defer t.Stop()
	var warned time.Time // the last failure logged: at most one a minute while Redis fails
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := st.TrimDeadPerSource(ctx, sources, max)
		switch {
		case err != nil && ctx.Err() == nil && time.Since(warned) >= time.Minute:
			warned = time.Now()
			log.Warn("limits.max_dead: could not delete the oldest dead messages beyond it; trying again every second", "err", err)
		case n > 0:
			log.Debug("limits.max_dead: deleted the oldest dead messages beyond it", "deleted", n, "max_dead", max)
		}
	}
}
