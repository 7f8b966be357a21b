// Package cli is delaybridge's command line (docs/reference.md, "Command
// line"). Main is testable in-process: it takes the arguments and streams and
// returns the exit code.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strings"
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
	// A one-shot command says what went wrong in its error; what the
	// components it opens would log for a running daemon (start warnings
	// such as the Redis's script flags) is not about the command. Errors
	// they log come out in the command's own format. run and dev set their
	// daemon's logger instead.
	defer slog.SetDefault(slog.Default())
	slog.SetDefault(slog.New(&cliHandler{w: stderr, level: slog.LevelError}))
	daemon.LogRedisTo(slog.Default()) // errors are one line, the command's

	return exitCode(root.Execute(), stderr)
}

// adminCommands act on parked messages either through Redis (--config) or
// through a running daemon's admin API (--admin, --token); health probes
// that API. Only they take --admin and --token (a parent's flags are its
// subcommands' too).
var adminCommands = []string{"inspect", "cancel", "stats", "dead", "list", "reschedule", "fire", "groups", "sinks", "health"}

// rootCmd is the command tree.
func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "delaybridge",
		Short: "Parks delayed messages from Kafka, RabbitMQ or NATS in Redis and publishes them when due",
		Long: `delaybridge reads delayed messages from Kafka, RabbitMQ or NATS ingests, parks them in Redis
and publishes them to a sink when they are due. Every command is described in docs/reference.md.`,
		Example: `  go run ./cmd/delaybridge dev                        # the quickstart: NATS, Redis and the daemon on this machine
  delaybridge validate -c config.yaml                 # check a configuration file
  delaybridge run -c config.yaml                      # run the daemon
  delaybridge send -c config.yaml --ingest orders-in --delay 30m --id order-42 '{"order":42}'
  delaybridge inspect -c config.yaml order-42         # or through a running daemon: --admin http://127.0.0.1:7070`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVarP(&a.configPath, "config", "c", os.Getenv("DELAYBRIDGE_CONFIG"),
		"configuration file (default $DELAYBRIDGE_CONFIG)")
	root.AddCommand(a.runCmd(), a.validateCmd(), a.sendCmd(), a.inspectCmd(), a.cancelCmd(),
		a.statsCmd(), a.deadCmd(), a.devCmd(), a.healthCmd(), a.versionCmd())
	root.AddCommand(a.reencryptCmd(), a.migrateCmd())
	root.AddCommand(a.exportCmd(), a.importCmd())
	root.AddCommand(a.listCmd(), a.rescheduleCmd(), a.fireCmd(), a.groupsCmd(), a.sinksCmd())
	for _, c := range root.Commands() {
		if slices.Contains(adminCommands, c.Name()) {
			a.adminFlags(c)
		}
	}
	if a.stdout != nil { // the completion command takes its output stream when it is made
		root.SetIn(a.stdin)
		root.SetOut(a.stdout)
		root.SetErr(a.stderr)
	}
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() == "completion" {
			c.Example = `  delaybridge completion bash > /etc/bash_completion.d/delaybridge
  delaybridge completion zsh > "${fpath[1]}/_delaybridge"
  delaybridge completion fish > ~/.config/fish/completions/delaybridge.fish`
		}
	}
	inheritExamples(root)
	needSubcommand(root)
	return root
}

// needsSubcommand is the annotation of a command that needSubcommand made
// runnable: it has no usage of its own.
const needsSubcommand = "needs-subcommand"

// needSubcommand makes a command that only groups others (dead, groups,
// migrate...) a usage error when given alone: exit 2 naming its
// subcommands, where cobra would print its help and exit 0.
func needSubcommand(c *cobra.Command) {
	for _, sub := range c.Commands() {
		needSubcommand(sub)
	}
	if c.Runnable() || !c.HasAvailableSubCommands() || !c.HasParent() {
		return
	}
	var names []string
	for _, sub := range c.Commands() {
		if sub.IsAvailableCommand() {
			names = append(names, sub.Name())
		}
	}
	if c.Annotations == nil {
		c.Annotations = map[string]string{}
	}
	c.Annotations[needsSubcommand] = "true"
	if c.Args == nil {
		c.Args = cobra.NoArgs // an unknown word is an unknown command, with suggestions
	}
	c.RunE = func(cmd *cobra.Command, args []string) error {
		return exit(2, fmt.Errorf("%s needs a subcommand: %s (see %s --help)", cmd.CommandPath(), strings.Join(names, ", "), cmd.CommandPath()))
	}
}

// adminFlags gives c (and its subcommands) --admin and --token.
func (a *app) adminFlags(c *cobra.Command) {
	f := c.PersistentFlags()
	if c.Name() == "health" {
		f.StringVar(&a.adminURL, "admin", os.Getenv("DELAYBRIDGE_ADMIN"),
			"the admin server's base URL, e.g. http://127.0.0.1:7070 (default $DELAYBRIDGE_ADMIN; see below)")
		return
	}
	f.StringVar(&a.adminURL, "admin", os.Getenv("DELAYBRIDGE_ADMIN"),
		"act through this running daemon's admin API (e.g. http://127.0.0.1:7070) instead of the Redis of --config (default $DELAYBRIDGE_ADMIN)")
	f.StringVar(&a.token, "token", os.Getenv("DELAYBRIDGE_ADMIN_TOKEN"),
		"bearer token for --admin, when the daemon has admin.token (default $DELAYBRIDGE_ADMIN_TOKEN)")
}

// inheritExamples gives a command that has subcommands and no example of
// its own the first example of each subcommand, so that every --help shows
// one.
func inheritExamples(c *cobra.Command) {
	for _, sub := range c.Commands() {
		inheritExamples(sub)
	}
	if strings.TrimSpace(c.Example) != "" || !c.HasAvailableSubCommands() {
		return
	}
	var lines []string
	for _, sub := range c.Commands() {
		if sub.Hidden || sub.Name() == "help" {
			continue
		}
		if first, _, _ := strings.Cut(sub.Example, "\n"); strings.TrimSpace(first) != "" {
			lines = append(lines, first)
		}
	}
	c.Example = strings.Join(lines, "\n")
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
			slog.SetDefault(log) // the components' own warnings, in the configured format
			if tuneGC(os.Getenv) {
				log.Debug("garbage collector target set; GOGC overrides it", "gogc", daemonGCPercent)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			d, err := daemon.New(ctx, cfg, log)
			if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
				// SIGINT or SIGTERM while connecting, and nothing failed
				// (daemon.New says which): a stop, not a failure.
				log.Info("stopped while starting", "err", err)
				return nil
			}
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
	var live bool
	cmd := &cobra.Command{
		Use: "validate [-c FILE | FILE] [--live]",
		Example: `  delaybridge validate -c config.yaml && echo ok
  delaybridge validate config.yaml
  delaybridge validate --live -c config.yaml          # and ask its Redis`,
		Short: "Check the configuration file; print every problem with its field path, in the order of the file",
		Long: `Check the configuration file; print every problem with its field path, in the order of the file.

With --live it then connects to the configured Redis, as the daemon would, and reports what the
daemon would say of it: whether it answers and holds a layout this build knows, and its eviction
policy (exit 1 where the daemon would not run: unreachable, an unknown layout, an allkeys-*
policy); and its persistence on each master, with a warning when one keeps neither AOF nor RDB
snapshots (a restart of Redis then loses every parked message; exit 0). A Redis that refuses
CONFIG is reported as unknown. The brokers are not contacted.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := a.configPath
			if len(args) == 1 {
				if cmd.Flags().Changed("config") && args[0] != path {
					return exit(2, fmt.Errorf("two files given, -c %s and %s: validate checks one; give it once", path, args[0]))
				}
				path = args[0]
			}
			if path == "" {
				return exit(2, errors.New("no configuration: give the file (delaybridge validate FILE, or -c FILE, or set DELAYBRIDGE_CONFIG)"))
			}
			cfg, err := config.Load(path)
			var ps config.Problems
			switch {
			case errors.As(err, &ps):
				for _, p := range ps {
					fmt.Fprintln(a.stderr, p)
				}
				return exit(1, fmt.Errorf("%s: %s; fix %s and run validate again", path, count(len(ps), "problem"), map[bool]string{true: "it", false: "them"}[len(ps) == 1]))
			case err != nil:
				return exit(1, err)
			}
			for _, w := range cfg.Warnings() {
				fmt.Fprintln(a.stderr, "warning:", w)
			}
			if refused := cfg.Refused(); len(refused) > 0 {
				fmt.Fprintln(a.stderr, "refused destinations (dead with destination_reserved) unless a pattern of the route's allowed_destinations names them literally, see docs/security.md:")
				for _, r := range refused {
					fmt.Fprintln(a.stderr, "  "+r)
				}
			}
			fmt.Fprintf(a.stdout, "%s is valid\n", path)
			if live {
				return a.validateLive(cmd, cfg)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&live, "live", false, "also connect to the configured Redis and report its layout, eviction policy and persistence")
	return cmd
}

// validateLive reports what the daemon would find in the Redis of cfg:
// whether it runs there (exit 1 if not), and its persistence (a warning
// when a master keeps nothing on disk).
func (a *app) validateLive(cmd *cobra.Command, cfg *config.Config) error {
	ctx, stop := signalCtx(cmd)
	defer stop()
	s, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer s.Client().Close()
	warning, err := s.CheckEviction(ctx)
	if err != nil {
		return exit(1, err)
	}
	if warning != "" {
		fmt.Fprintln(a.stderr, "warning: redis:", warning)
	}
	p, err := daemon.ReadPersistence(ctx, s, daemon.PersistenceName(cfg.Redis))
	if err != nil {
		return exit(1, err)
	}
	for _, line := range p.Describe() {
		fmt.Fprintln(a.stdout, line)
	}
	if w := p.Warning(); w != "" {
		fmt.Fprintln(a.stderr, "warning: redis:", w)
	}
	if u := p.Unknown(); u != "" {
		fmt.Fprintln(a.stderr, "note: redis:", u)
	}
	return nil
}

// count writes n with the noun, in the plural unless n is 1: "1 problem",
// "3 problems".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
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

// cliHandler writes log records at or above level as the command line's
// own lines: "delaybridge: error: <message> key=value ...".
type cliHandler struct {
	w     io.Writer
	level slog.Level
	attrs []slog.Attr
}

func (h *cliHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }

func (h *cliHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "delaybridge: %s: %s", strings.ToLower(r.Level.String()), r.Message)
	add := func(at slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%q", at.Key, at.Value.String())
		return true
	}
	for _, at := range h.attrs {
		add(at)
	}
	r.Attrs(add)
	b.WriteByte('\n')
	_, err := io.WriteString(h.w, b.String())
	return err
}

func (h *cliHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &cliHandler{w: h.w, level: h.level, attrs: append(slices.Clone(h.attrs), as...)}
}

func (h *cliHandler) WithGroup(string) slog.Handler { return h }
