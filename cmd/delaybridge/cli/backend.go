package cli

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/delaybridge/delaybridge/pkg/admin"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/daemon"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ops"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// withOps runs f with the operations (pkg/ops): through a running daemon's
// admin API when --admin is given (admin.Client), else on the Redis of
// --config (ops.Service). Both give the same answers and refuse with the
// same sentences; through Redis, a change is seen by the daemons within
// scheduler.max_sleep and a pause within their refresh (the same interval).
// A flag on the command line wins over the other's environment variable:
// `-c FILE` acts on Redis even where DELAYBRIDGE_ADMIN is set (as
// `. .delaybridge-dev/env` sets it).
func (a *app) withOps(cmd *cobra.Command, f func(ctx context.Context, o ops.Operations) error) error {
	ctx, stop := signalCtx(cmd)
	defer stop()
	if a.configPath == "" && a.adminURL == "" {
		return exit(2, errNoTarget)
	}
	if a.adminURL != "" && (cmd.Flags().Changed("admin") || !cmd.Flags().Changed("config")) {
		u, err := url.Parse(strings.TrimRight(a.adminURL, "/"))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return exit(2, fmt.Errorf("--admin %q: give the admin server's URL, e.g. http://127.0.0.1:7070", a.adminURL))
		}
		return f(ctx, admin.NewClient(u.String(), a.token, &http.Client{Timeout: 30 * time.Second}))
	}
	cfg, err := a.load()
	if err != nil {
		return err
	}
	s, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer s.Client().Close()
	return f(ctx, service(cfg, s))
}

// viaAdmin reports whether o acts through a daemon's admin API (else on
// Redis, where the running daemons see a change at their next refresh).
func viaAdmin(o ops.Operations) bool {
	_, ok := o.(*admin.Client)
	return ok
}

// errNoTarget is the error of a command that acts on parked messages given
// neither where they are nor a daemon to ask.
var errNoTarget = errors.New("no configuration and no daemon to ask: give --admin URL (or set DELAYBRIDGE_ADMIN; " +
	"`. .delaybridge-dev/env` sets it for delaybridge dev) to act through a running daemon's admin API, " +
	"or --config FILE (or -c, or set DELAYBRIDGE_CONFIG) to act on its Redis")

// openStore connects to the Redis of cfg and refuses a layout this build
// does not know (store.CheckLayout; nothing recorded: a command reads or
// changes messages, it does not start a store).
func openStore(ctx context.Context, cfg *config.Config) (*store.Store, error) {
	s, err := daemon.OpenStore(ctx, cfg, nil)
	if err != nil {
		return nil, exit(1, err)
	}
	if _, err := s.CheckLayout(ctx, false); err != nil {
		_ = s.Client().Close()
		return nil, exit(1, err)
	}
	return s, nil
}

// service is the operations on the Redis of cfg, with its limits, sinks
// and routes; without a daemon to ask, whether each sink is connected is
// unknown.
func service(cfg *config.Config, s *store.Store) *ops.Service {
	routes := map[string]*envelope.Route{}
	for i := range cfg.Ingest {
		routes[cfg.Ingest[i].Name] = daemon.Route(cfg, &cfg.Ingest[i])
	}
	sinks := make([]ops.SinkStatus, 0, len(cfg.Sinks))
	for _, sc := range cfg.Sinks {
		sinks = append(sinks, ops.SinkStatus{Name: sc.Name, MaxRate: sc.MaxRate})
	}
	return ops.New(ops.Params{
		Store:        s,
		Limits:       daemon.Limits(cfg),
		Destinations: daemon.SinkDestinations(cfg),
		Routes:       func(name string) (*envelope.Route, bool) { r, ok := routes[name]; return r, ok },
		Sinks:        func() []ops.SinkStatus { return sinks },
		Persistence: func(ctx context.Context) *ops.PersistenceView {
			p, err := daemon.ReadPersistence(ctx, s, daemon.PersistenceName(cfg.Redis))
			if err != nil {
				return &ops.PersistenceView{Unknown: err.Error()}
			}
			return p.View()
		},
	})
}

// failed is the exit of an operation that failed: 2 for a request that is
// invalid (as for a bad flag), 1 otherwise, with the operation's sentence.
func failed(err error) error {
	switch {
	case errors.Is(err, ops.ErrInvalid):
		return exit(2, err)
	case admin.IsUnauthorized(err):
		return exit(1, fmt.Errorf("%w (give the admin token with --token or DELAYBRIDGE_ADMIN_TOKEN)", err))
	}
	return exit(1, err)
}

// withStore runs f against the Redis of --config, for the commands that
// only work there (export, import, reencrypt).
func (a *app) withStore(cmd *cobra.Command, f func(ctx context.Context, s *store.Store) error) error {
	cfg, err := a.load()
	if err != nil {
		return err
	}
	ctx, stop := signalCtx(cmd)
	defer stop()
	s, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer s.Client().Close()
	return f(ctx, s)
}
