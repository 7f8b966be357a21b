package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// cancelScript forgets a parked or dead message, and leaves one in flight.
// (lua/cancel.lua has its KEYS, ARGV and reply.)
var cancelScript = loadScript("cancel")

// Cancel deletes a parked or dead message: when it returns nil, the
// message will not be published. It returns ErrNotFound for an unknown ID
// (never parked, cancelled, or delivered already) and ErrInFlight for a
// message in flight, its lease ended or not, or one sent or taken over
// without a confirmation (lua/lib/unconfirmed.lua): its publish may be under
// way or may have reached its broker (cancel again once it is settled: a
// publish that fails before reaching the broker makes it scheduled
// again); for an occurrence of a series, ErrSeriesEnds with it: the series
// ends with that occurrence. A message claimed ahead is not in flight until the commit just
// before its due instant, and Cancel takes it from the claim. A cancelled
// message read from a log leaves its position in the dedupe window, so
// that its ingest reading it again does not park it again.
func (s *Store) Cancel(ctx context.Context, id string) error {
	shard := s.ShardOf(id)
	b := s.seen(time.Now())
	n, err := s.runKeys(ctx, "cancel", cancelScript, shard, []string{s.keys.Seen(shard, b.cur)}, id, b.expireAt).Int()
	if err != nil {
		return fmt.Errorf("store.cancel shard %d: %w", shard, err)
	}
	switch n {
	case 0:
		return ErrNotFound
	case 2:
		return ErrInFlight
	case 3:
		return errSeriesInFlight
	}
	return nil
}

// ErrSeriesEnds is returned, with ErrInFlight, for a cancel that met an
// occurrence of a recurring message in flight: that occurrence may still
// be published, and its series ends with it (nothing more of it is).
var ErrSeriesEnds = errors.New("store: its series ends with the occurrence in flight")

var errSeriesInFlight = fmt.Errorf("%w; %w", ErrInFlight, ErrSeriesEnds)
