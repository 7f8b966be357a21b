package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/delaybridge/delaybridge/pkg/store"
)

func (a *app) migrateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Move the store between layouts: up to this build's newest, down to what the previous release reads",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(&cobra.Command{
		Use:     "up",
		Example: `  delaybridge migrate up -c config.yaml   # once no daemon of the previous release runs any more`,
		Short:   "Convert the store to the newest layout (each state of a message a key of its own)",
		Long: `Convert the store to layout 2, where each state of a message (parked, in
flight, claimed ahead, waiting for a rate slot, held for its sink) is a
sorted set of its own per shard, scored by a time and nothing else
(docs/store.md). Each shard is converted in one script call; daemons of
this build may run meanwhile and follow each shard as it is converted. It
is safe to run twice, and again after a run that stopped half-way.

The previous release reads layout 1 only: run this once none of its
daemons runs any more, as the last step of an upgrade. migrate down goes
back (docs/operations.md, "Upgrades and rollbacks with messages parked").`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withStore(cmd, func(ctx context.Context, s *store.Store) error {
				n, err := s.MigrateUp(ctx)
				if err != nil {
					return exit(1, err)
				}
				fmt.Fprintf(a.stdout, "the store is in layout %d; %d messages moved out of the due sets into the keys of their states\n", store.Layout2, n)
				return nil
			})
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:     "down",
		Example: `  delaybridge migrate down -c config.yaml   # after the last daemon of this build stopped, before starting the earlier one`,
		Short:   "Write what the previous release reads, before rolling back to it",
		Long: `Write what the previous release reads of the store: every shard in layout 2
back in layout 1 (each message in the due set of its priority), and the
dedupe window's marks, which this build keeps in one hash per shard and
window, as the key per message the previous release reads, so that it
still tells a re-read of a message this build delivered. Everything else
this build writes, the previous release reads or ignores. It works on
Redis directly (--admin does not apply), writes dedupe keys only where they
are missing, and is safe to run twice.

Rollback: stop the daemons of this build (marks they write later are not
copied), run migrate down, start the previous release
(docs/operations.md, "Upgrades and rollbacks with messages parked").`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withStore(cmd, func(ctx context.Context, s *store.Store) error {
				m, err := s.MigrateDown(ctx)
				if err != nil {
					return exit(1, err)
				}
				fmt.Fprintf(a.stdout, "the store is in layout %d (%d messages moved back into the due sets); wrote %d dedupe marks as the keys the previous release reads; it can start now\n",
					store.Layout1, m.Moved, m.Marks)
				return nil
			})
		},
	})
	return cmd
}
