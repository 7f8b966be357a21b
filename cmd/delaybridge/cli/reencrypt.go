package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/delaybridge/delaybridge/pkg/store"
)

func (a *app) reencryptCmd() *cobra.Command {
	var batch int
	cmd := &cobra.Command{
		Use:     "reencrypt",
		Example: `  delaybridge reencrypt -c config.yaml   # after making a new key active everywhere`,
		Short:   "Seal every parked and dead message with encryption.active_key (after a key rotation)",
		Long: `Seal every parked and dead message with encryption.active_key: messages
sealed with an older key of encryption.keys, and messages stored in clear
before encryption was turned on. Messages already sealed with the active key
are left alone. It works on Redis directly (--admin does not apply) and is
safe while daemons run: a message is replaced only if it is still the one read. Exit 1 when some message could not be decrypted (each is
named on stderr); it stays as it is and becomes dead when due.

Rotation: (1) add the new key on every instance, active_key unchanged, and
restart them; (2) make it active_key everywhere and restart; (3) run reencrypt;
(4) remove the old key.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withStore(cmd, func(ctx context.Context, s *store.Store) error {
				st, err := s.Reencrypt(ctx, batch, func(id string, err error) {
					fmt.Fprintf(a.stderr, "cannot decrypt %s: %v\n", id, err)
				})
				if errors.Is(err, store.ErrNoSealer) {
					return exit(2, err)
				}
				if err != nil {
					return exit(1, err)
				}
				fmt.Fprintf(a.stdout, "re-encrypted %d (%d of them were in clear), already current %d, failed to decrypt %d, changed meanwhile %d; reasons sealed again %d, failed %d\n",
					st.Reencrypted, st.Plain, st.Current, st.Failed, st.Changed, st.Reasons, st.ReasonsFailed)
				if st.Failed > 0 {
					return exit(1, fmt.Errorf("%d message(s) could not be decrypted with encryption.keys", st.Failed))
				}
				return nil
			})
		},
	}
	cmd.Flags().IntVar(&batch, "batch", 100, "messages read per HSCAN call")
	return cmd
}
