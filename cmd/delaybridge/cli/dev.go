//go:build !nodev

// The dev command links an embedded nats-server and miniredis (about 20 MB):
// production builds leave it out with -tags nodev (make build, the
// Dockerfile), and get nodev.go's stand-in.
package cli

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/daemon"
	"github.com/delaybridge/delaybridge/pkg/dev"
)

func (a *app) devCmd() *cobra.Command {
	var dir string
	var quiet bool
	cmd := &cobra.Command{
		Use: "dev",
		Example: `  go run ./cmd/delaybridge dev
  delaybridge dev --dir /tmp/db-dev --quiet`,
		Short: "Run everything locally for a first look: embedded NATS, Redis, the daemon; prints fired messages",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signalCtx(cmd)
			defer stop()
			self := "go run ./cmd/delaybridge"
			if exe, err := os.Executable(); err == nil && !isGoRunBinary(exe) {
				self = exe
			}
			level := "warn"
			if quiet {
				level = "error"
			}
			err := dev.Run(ctx, dev.Options{
				Dir:      dir,
				Out:      a.stdout,
				Log:      daemon.NewLogger(config.Log{Level: level, Format: "text"}, a.stderr),
				SelfPath: self,
			})
			if err != nil {
				return exit(1, err)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", ".delaybridge-dev", "directory for the generated config and the NATS and Redis data")
	cmd.Flags().BoolVar(&quiet, "quiet", false, "log errors only")
	return cmd
}

// isGoRunBinary tells a binary built by `go run` (in a temporary go-build
// directory) from an installed one.
func isGoRunBinary(exe string) bool {
	return strings.Contains(exe, string(filepath.Separator)+"go-build")
}
