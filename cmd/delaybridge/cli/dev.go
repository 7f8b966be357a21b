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
		Long: `Runs an embedded NATS server (JetStream), Redis (redis-server when installed, else an
in-process one that keeps nothing) and the daemon, with the configuration it writes to
--dir/config.yaml, and prints every message that fires. It stops on Ctrl-C or SIGTERM, and when
the process that started it goes away (go run killed by its PID, a closed terminal), taking its
redis-server with it. --dir/env sets DB, AUTH, DELAYBRIDGE_ADMIN and DELAYBRIDGE_ADMIN_TOKEN for curl and the CLI.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			parent := os.Getppid() // first: dev ends when this process goes (go run killed by its PID)
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
				Dir:       dir,
				Out:       a.stdout,
				Log:       daemon.NewLogger(config.Log{Level: level, Format: "text"}, a.stderr),
				SelfPath:  self,
				ParentPID: parent,
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
