//go:build nodev

// A production build (-tags nodev: make build, the Dockerfile) carries no
// embedded NATS server or Redis: its dev command only says where to find one.
package cli

import (
	"errors"

	"github.com/spf13/cobra"
)

func (a *app) devCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "dev",
		Example: `  go run ./cmd/delaybridge dev   # from a checkout`,
		Short:   "Not in this build: run `go run ./cmd/delaybridge dev` from a checkout",
		Hidden:  true,
		RunE: func(*cobra.Command, []string) error {
			return exit(2, errors.New("this build has no dev command (it was built with -tags nodev, without the embedded NATS and Redis); run `go run ./cmd/delaybridge dev` from a checkout of delaybridge"))
		},
	}
}
