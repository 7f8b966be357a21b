// Package cli is delaybridge's command line (see CONTRACT.md, "Command
// line"). Main is testable in-process: it takes the arguments and streams and
// returns the exit code.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/daemon"
)

// version is set at build time with -ldflags "-X github.com/delaybridge/delaybridge/cmd/delaybridge/cli.version=v1.2.3".
var version = ""

// Version returns the build's version.
func Version() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// exitError carries an exit code out of a command.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }

// exit returns an error that makes Main exit with code after printing err
// (when non-nil).
func exit(code int, err error) error { return &exitError{code: code, err: err} }

type app struct {
	configPath string
	adminURL   string // --admin: act through a running daemon's admin API
	token      string // --token: its bearer token
	stdin      io.Reader
	stdout     io.Writer
	stderr     io.Writer
}

// Main runs the command line and returns the exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	daemon.Version = Version()
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr}
	root := a.rootCmd()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)

	return exitCode(root.Execute(), stderr)
}

// rootCmd is the command tree.
func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "delaybridge",
		Short:         "Parks delayed messages from Kafka, RabbitMQ or NATS in Redis and publishes them when due",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVarP(&a.configPath, "config", "c", os.Getenv("DELAYBRIDGE_CONFIG"),
		"configuration file (default $DELAYBRIDGE_CONFIG)")
	root.PersistentFlags().StringVar(&a.adminURL, "admin", os.Getenv("DELAYBRIDGE_ADMIN"),
		"inspect/cancel/stats/dead/list/reschedule/fire/groups/sinks: act through this daemon admin URL (e.g. http://127.0.0.1:7070) instead of Redis (default $DELAYBRIDGE_ADMIN)")
	root.PersistentFlags().StringVar(&a.token, "token", os.Getenv("DELAYBRIDGE_ADMIN_TOKEN"),
		"bearer token for --admin (default $DELAYBRIDGE_ADMIN_TOKEN)")
	root.AddCommand(a.runCmd(), a.validateCmd(), a.sendCmd(), a.inspectCmd(), a.cancelCmd(),
		a.statsCmd(), a.deadCmd(), a.devCmd(), a.healthCmd(), a.versionCmd())
	root.AddCommand(a.reencryptCmd())
	root.AddCommand(a.exportCmd(), a.importCmd())
	root.AddCommand(a.listCmd(), a.rescheduleCmd(), a.fireCmd(), a.groupsCmd(), a.sinksCmd())
	return root
}

// exitCode prints a failed command's error and returns its exit status.
func exitCode(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintln(stderr, "delaybridge:", ee.err)
		}
		return ee.code
	}
	fmt.Fprintln(stderr, "delaybridge:", err)
	return 2
}

// load reads the configuration given by --config.
func (a *app) load() (*config.Config, error) {
	if a.configPath == "" {
		return nil, exit(2, errors.New("no configuration: give --config FILE (or -c, or set DELAYBRIDGE_CONFIG)"))
	}
	cfg, err := config.Load(a.configPath)
	if err != nil {
		var ps config.Problems
		if errors.As(err, &ps) {
			return nil, exit(2, fmt.Errorf("%s is not valid:\n%w\n(run `delaybridge validate -c %s` to see every problem)", a.configPath, err, a.configPath))
		}
		return nil, exit(2, err)
	}
	return cfg, nil
}

func (a *app) runCmd() *cobra.Command {
	return &cobra.Command{
		Use: "run",
		Example: `  delaybridge run -c /etc/delaybridge/config.yaml
  DELAYBRIDGE_CONFIG=config.yaml GOMEMLIMIT=200MiB delaybridge run`,
		Short: "Run the daemon until SIGINT or SIGTERM",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := a.load()
			if err != nil {
				return err
			}
			log := daemon.NewLogger(cfg.Log, a.stderr)
			if tuneGC(os.Getenv) {
				log.Debug("garbage collector target set; GOGC overrides it", "gogc", daemonGCPercent)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			d, err := daemon.New(ctx, cfg, log)
			if err != nil {
				return exit(1, err)
			}
			if err := d.Run(ctx); err != nil {
				return exit(1, err)
			}
			return nil
		},
	}
}

func (a *app) validateCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "validate",
		Example: `  delaybridge validate -c config.yaml && echo ok`,
		Short:   "Check the configuration file; print every problem with its field path",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if a.configPath == "" {
				return exit(2, errors.New("no configuration: give --config FILE"))
			}
			cfg, err := config.Load(a.configPath)
			var ps config.Problems
			switch {
			case errors.As(err, &ps):
				for _, p := range ps {
					fmt.Fprintln(a.stderr, p)
				}
				return exit(1, fmt.Errorf("%s: %d problem(s)", a.configPath, len(ps)))
			case err != nil:
				return exit(1, err)
			}
			for _, w := range cfg.Warnings() {
				fmt.Fprintln(a.stderr, "warning:", w)
			}
			fmt.Fprintf(a.stdout, "%s is valid\n", a.configPath)
			return nil
		},
	}
}

func (a *app) versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Example: `  delaybridge version`,
		Short:   "Print the version",
		Args:    cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintln(a.stdout, "delaybridge", Version())
		},
	}
}

// signalCtx is the context of a one-shot command: cancelled by SIGINT or
// SIGTERM, without a deadline.
func signalCtx(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	return ctx, stop
}
