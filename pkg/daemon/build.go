package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/delaybridge/delaybridge/pkg/destination"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/seal"
	"github.com/delaybridge/delaybridge/pkg/store"
	"github.com/delaybridge/delaybridge/pkg/tlsutil"
)

// OpenStore connects to the Redis of cfg and checks that it answers. With an
// encryption section, the store seals what it stores with its keys.
func OpenStore(ctx context.Context, cfg *config.Config, observe func(string, time.Duration, error)) (*store.Store, error) {
	return openStore(ctx, cfg, observe, nil)
}

// openStore is OpenStore with the client's OnConnect, called on every new
// connection to Redis (nil: none).
func openStore(ctx context.Context, cfg *config.Config, observe func(string, time.Duration, error),
	onConnect func(context.Context, *redis.Conn) error) (*store.Store, error) {
	rc := cfg.Redis
	var sealer envelope.Sealer // stays a nil interface when encryption is off
	if cfg.Encryption != nil {
		kr, err := seal.FromConfig(cfg.Encryption)
		if err != nil {
			return nil, fmt.Errorf("encryption: %w", err)
		}
		sealer = kr
	}
	rdb, err := redisClient(rc, func(o *redis.UniversalOptions) { o.OnConnect = onConnect })
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, rc.DialTimeout.D()+time.Second)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		_ = rdb.Close()
		return nil, fmt.Errorf("redis %s: %w (is Redis running, redis.addr right, and are the credentials and TLS settings the server's?)", redisAddr(rc), err)
	}
	flags, err := store.ScriptFlagsSupported(pctx, rdb)
	if err != nil {
		_ = rdb.Close()
		return nil, fmt.Errorf("redis %s: %w", redisAddr(rc), err)
	}
	noFlags := !flags
	if noFlags {
		slog.Default().Warn("this Redis does not read Lua script flags (Redis before 7.0, or the in-process one of delaybridge dev): " +
			"at maxmemory firing stops with ingest; Redis 7 or later is recommended")
	}
	return store.New(rdb, store.Options{
		Prefix:        rc.KeyPrefix,
		Shards:        rc.Shards,
		MaxDead:       cfg.Dead.MaxMessages,
		MaxSeries:     cfg.Limits.MaxSeries,
		SourceSeries:  ingestSeries(cfg),
		DedupeWindow:  cfg.Scheduler.DedupeWindow.D(),
		Observe:       observe,
		Sealer:        sealer,
		RequireSealed: cfg.Encryption != nil && cfg.Encryption.RequireSealed,
		NoScriptFlags: noFlags,
	}), nil
}

// redisClient is a client of the Redis of rc, with the options edit
// changes (nil: none). go-redis picks the client the options describe:
// Sentinel with a master name, Cluster with IsClusterMode, else one
// server.
func redisClient(rc config.Redis, edit func(*redis.UniversalOptions)) (redis.UniversalClient, error) {
	tlsCfg, err := tlsutil.Client(rc.TLS)
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	opts := &redis.UniversalOptions{
		Addrs:         []string{rc.Addr},
		Username:      rc.Username,
		Password:      rc.Password.Reveal(),
		DB:            rc.DB,
		DialTimeout:   rc.DialTimeout.D(),
		ReadTimeout:   rc.ReadTimeout.D(),
		WriteTimeout:  rc.WriteTimeout.D(),
		PoolSize:      rc.PoolSize,
		TLSConfig:     tlsCfg,
		IsClusterMode: rc.Cluster,
	}
	switch {
	case len(rc.SentinelAddrs) > 0:
		opts.Addrs, opts.MasterName, opts.SentinelPassword = rc.SentinelAddrs, rc.MasterName, rc.SentinelPassword.Reveal()
	case rc.Cluster:
		opts.Addrs = rc.Addrs
	}
	if edit != nil {
		edit(opts)
	}
	if rc.Cluster && len(rc.SentinelAddrs) == 0 {
		co := opts.Cluster()
		co.ClusterStateReloadInterval = ClusterReload
		return redis.NewClusterClient(co), nil
	}
	return redis.NewUniversalClient(opts), nil
}

// readyClient is the client of /readyz's PING: go-redis bounds a reply by
// its read timeout, not by a context, so the PING has a client whose
// timeouts are readyPing, and which does not try again.
func readyClient(rc config.Redis) (redis.UniversalClient, error) {
	return redisClient(rc, func(o *redis.UniversalOptions) {
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout = min(o.DialTimeout, readyPing), readyPing, readyPing
		o.MaxRetries, o.PoolSize = -1, 2
	})
}

// ClusterReload is how often a Redis Cluster client reads the cluster's
// slots again while it is used. go-redis reads them again at once on a
// MOVED or ASK, but not when a master stops answering: after a master is
// killed and its replica promoted, its slots were unreachable until the
// next reload, 60 s by go-redis's default (a probe saw 45-48 s of refused
// connections after a 5 s failover, with every ingest paused meanwhile).
// A reload is one CLUSTER SLOTS.
const ClusterReload = 2 * time.Second

// ingestSeries is each ingest's max_series by name.
func ingestSeries(cfg *config.Config) map[string]int64 {
	m := map[string]int64{}
	for _, ic := range cfg.Ingest {
		m[ic.Name] = ic.MaxSeries
	}
	return m
}

// census counts what each ingest holds in Redis (store.Census), when an
// ingest has a bound of its own (max_parked, max_series), at each start:
// the scripts keep the counts from then on, but an instance of a build
// before the counts, running beside this one during an upgrade, parks and
// fires without counting. Redis answers nothing else while it counts a
// shard (about 6 µs per parked message), so a deployment without such
// bounds never pays it.
func census(ctx context.Context, cfg *config.Config, st *store.Store, log *slog.Logger) error {
	bounded := false
	for _, ic := range cfg.Ingest {
		bounded = bounded || ic.MaxParked > 0 || ic.MaxSeries > 0
	}
	if !bounded {
		return nil
	}
	start := time.Now()
	n, err := st.Census(ctx, true)
	if err != nil {
		return fmt.Errorf("redis: counting what each ingest holds: %w", err)
	}
	if n > 0 {
		log.Info("counted what each ingest holds in redis, for ingest max_parked and max_series", "shards", n, "took", time.Since(start).Round(time.Millisecond))
	}
	return nil
}

func redisAddr(rc config.Redis) string {
	switch {
	case len(rc.SentinelAddrs) > 0:
		return fmt.Sprintf("master %q via sentinels %v", rc.MasterName, rc.SentinelAddrs)
	case rc.Cluster:
		return fmt.Sprint(rc.Addrs)
	}
	return rc.Addr
}

// redisAddrs returns every address of rc as the configuration writes it,
// for /readyz to hide from callers without the token
// (admin.Params.Addresses): the reasons name them as written.
func redisAddrs(rc config.Redis) []string {
	return slices.Concat([]string{rc.Addr}, rc.Addrs, rc.SentinelAddrs)
}

// Limits converts the configured limits.
func Limits(cfg *config.Config) envelope.Limits {
	return envelope.Limits{
		MaxDelay:        cfg.Limits.MaxDelay.D(),
		MaxPayloadBytes: cfg.Limits.MaxPayloadBytes,
		MaxHeaderBytes:  cfg.Limits.MaxHeaderBytes,
		MaxIDBytes:      cfg.Limits.MaxIDBytes,
		MinInterval:     cfg.Limits.MinInterval.D(),
	}
}

// SinkDestinations returns the lookup of a sink's destination syntax by
// name (envelope.Route.Sinks), built once from cfg.
func SinkDestinations(cfg *config.Config) func(string) (destination.Syntax, bool) {
	m := make(destination.Sinks, len(cfg.Sinks))
	for _, s := range cfg.Sinks {
		if syn, ok := cfg.SinkDestinations(s.Name); ok {
			m[s.Name] = syn
		}
	}
	return m.Lookup
}

// DestinationGuard is the scheduler's last check before a publish
// (scheduler.Params.Destinations): the message's destination must be valid
// for its sink and outside the broker's control plane unless the route of
// its ingest names that prefix (destination.Syntax.Check).
func DestinationGuard(cfg *config.Config) func(*envelope.Message) error {
	syntax := SinkDestinations(cfg)
	allowed := make(map[string][]string, len(cfg.Ingest))
	for _, ic := range cfg.Ingest {
		allowed[ic.Name] = ic.Route.AllowedDestinations
	}
	return func(m *envelope.Message) error {
		syn, ok := syntax(m.Sink)
		if !ok {
			return nil // no such sink: the scheduler says so itself
		}
		return syn.Check(m.Destination, allowed[m.Ingest], false)
	}
}

// Route converts an ingest's route.
func Route(cfg *config.Config, ic *config.Ingest) *envelope.Route {
	r := &envelope.Route{
		Ingest:              ic.Name,
		Sink:                ic.Route.Sink,
		Destination:         ic.Route.Destination,
		AllowOverride:       ic.Route.AllowOverride,
		AllowedSinks:        ic.Route.AllowedSinks,
		AllowedDestinations: ic.Route.AllowedDestinations,
		Sinks:               SinkDestinations(cfg),
	}
	for _, d := range ic.Dialects {
		r.Dialects = append(r.Dialects, envelope.Dialect(d))
	}
	if ic.Route.DefaultDelay != nil {
		r.DefaultDelay = ic.Route.DefaultDelay.D()
		r.HasDefaultDelay = true
	}
	r.Missed, _ = envelope.ParseMissed(ic.Route.Missed) // validated with the configuration
	r.MissedMax = ic.Route.MissedMax
	r.NoRecurring = ic.Route.Recurring != nil && !*ic.Route.Recurring
	return r
}
