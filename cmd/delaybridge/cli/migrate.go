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
		Short: "Move the store between what this build and an earlier one read (rollbacks)",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(&cobra.Command{
		Use:     "down",
		Example: `  delaybridge migrate down -c config.yaml   # after the last daemon of this build stopped, before starting the earlier one`,
		Short:   "Write what the previous release reads, before rolling back to it",
		Long: `Write what the previous release reads of the store: the dedupe window's
marks, which this build keeps in one hash per shard and window, as the key
per message the previous release reads, so that it still tells a re-read of
a message this build delivered. Everything else this build writes, the
previous release reads or ignores. It works on Redis directly (--admin does
not apply), writes only keys that are missing and is safe to run twice.

Rollback: stop the daemons of this build (marks they write later are not
copied), run migrate down, start the previous release
(docs/operations.md, "Upgrades and rollbacks with messages parked").`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withStore(cmd, func(ctx context.Context, s *store.Store) error {
				n, err := s.MigrateDown(ctx)
				if err != nil {
					return exit(1, err)
				}
				fmt.Fprintf(a.stdout, "wrote %d dedupe marks as the keys the previous release reads; it can start now\n", n)
				return nil
			})
		},
	})
	return cmd
}
