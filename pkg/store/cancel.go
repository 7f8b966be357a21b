package store

import (
	"context"
	"fmt"
)

// cancelScript forgets a message, whatever its state.
// (lua/cancel.lua has its KEYS, ARGV and reply.)
var cancelScript = loadScript("cancel")

// Cancel deletes a parked or dead message. It returns ErrNotFound for an
// unknown ID. A message already in flight may still be published once: the
// publish was under way when it was cancelled, and Cancel returns after its
// due instant (CommitLead).
func (s *Store) Cancel(ctx context.Context, id string) error {
	shard := s.ShardOf(id)
	n, err := s.run(ctx, "cancel", cancelScript, shard, id).Int()
	if err != nil {
		return fmt.Errorf("store.cancel shard %d: %w", shard, err)
	}
	switch n {
	case 0:
		return ErrNotFound
	case 2:
		return s.afterCommitLead(ctx)
	}
	return nil
}
