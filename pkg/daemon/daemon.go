// Package daemon wires delaybridge together from a configuration: the Redis
// store, the sinks, the scheduler, one ingest pipeline per ingest, and the
// admin server; and runs them until told to stop.
package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/pkg/admin"
	"github.com/delaybridge/delaybridge/pkg/brokers"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ingest"
	"github.com/delaybridge/delaybridge/pkg/lifecycle"
	"github.com/delaybridge/delaybridge/pkg/metrics"
	"github.com/delaybridge/delaybridge/pkg/ops"
	"github.com/delaybridge/delaybridge/pkg/scheduler"
	"github.com/delaybridge/delaybridge/pkg/sinks"
	"github.com/delaybridge/delaybridge/pkg/store"
	"github.com/delaybridge/delaybridge/pkg/tlsutil"
	"github.com/delaybridge/delaybridge/pkg/tracing"
)

// Version is the build's version, set by the command line (service.version
// of traces).
var Version = "dev"

// Daemon is a running delaybridge.
type Daemon struct {
	cfg         *config.Config
	tracer      *tracing.Tracer
	stopTracing func(context.Context) error
	log         *slog.Logger
	// layout is the store's layout this daemon found at its start, which
	// keepRecord writes again if Redis lost it.
	layout int
	// eviction is the last answer of watchEviction (nil: none yet, or
	// every master's policy keeps keys)
	eviction atomic.Pointer[error]
	// mismatch is what keepRecord last found wrong with the store's record
	// ("" nothing): said once in the log, and by /readyz while it lasts.
	mismatch atomic.Pointer[string]
	// started is when this daemon started; lostAt when Redis was last
	// found to have lost the store's record after that (keepRecord).
	started time.Time
	lostAt  atomic.Pointer[time.Time]
	// readyRedis is /readyz's client of Redis (readyClient).
	readyRedis redis.UniversalClient
	metrics    *metrics.Metrics
	store      *store.Store
	sinks      map[string]sinks.Sink
	pipes      []*ingest.Pipeline // each with its source (Source: nil while connecting)
	// sourcesClosed is set by Run once it closed (and committed) the sources.
	sourcesClosed bool
	sched         *scheduler.Scheduler
	admin         *admin.Server
	adminLn       net.Listener // admin.listen, bound before the brokers are dialled
	clock         *store.Clock
	rates         *metrics.RateMeter // what this instance publishes per sink, for /v1/sinks
	persistence   *persistenceWatch  // what Redis keeps on disk
	// refused is why this daemon does not run: Redis holds a layout this
	// build does not know (store.ErrLayoutUnknown). It then only answers
	// /healthz and, with the reason, 503 to everything else, until stopped.
	refused error
}

// New connects to Redis and every broker and prepares the components. It
// fails with an error that names the component when a connection cannot be
// made; nothing is left open then. When ctx ends during the start and
// nothing else failed, the error wraps context.Canceled; a failure's does
// not.
func New(ctx context.Context, cfg *config.Config, log *slog.Logger) (_ *Daemon, err error) {
	LogRedisTo(log)
	// d is not the named result: every failure returns a nil *Daemon, and the
	// cleanup below must still see the half-built one.
	d := &Daemon{cfg: cfg, log: log, metrics: metrics.New(), sinks: map[string]sinks.Sink{}, started: time.Now()}
	defer func() {
		if err != nil {
			d.closeAll(context.Background())
		}
	}()

	for _, w := range cfg.Warnings() {
		log.Warn("configuration: "+w.Msg, "field", w.Path)
	}

	d.tracer, d.stopTracing, err = tracing.Setup(ctx, tracing.Config{
		Enabled: cfg.Tracing.Enabled, SampleRatio: *cfg.Tracing.SampleRatio, Version: Version,
	})
	if err != nil {
		return nil, err
	}

	d.persistence = newPersistenceWatch(PersistenceName(cfg.Redis), log)
	observe := func(op string, took time.Duration, err error) {
		d.metrics.ObserveScript(op, took, err)
		if unreachable(err) {
			d.persistence.disconnected()
		}
	}
	localNow, schedClock, skew := localClock()
	if skew != 0 {
		log.Warn("faultinject: this process's clock is skewed on purpose", "skew", skew)
	}
	if err := d.openRedis(ctx, cfg, log, observe, localNow); errors.Is(err, store.ErrLayoutUnknown) {
		log.Error("not running: "+err.Error(), "redis_key", d.store.Keys().Config())
		d.refused = err
		return d, nil
	} else if err != nil {
		return nil, err
	}

	if cfg.Admin.Listen != "" {
		// Bound before the brokers are dialled: a port taken (another
		// instance running here) stops the start before it joins consumer
		// groups, which would make the running members rebalance.
		if d.adminLn, err = net.Listen("tcp", cfg.Admin.Listen); err != nil {
			return nil, fmt.Errorf("admin: %w (set admin.listen to a free host:port)", err)
		}
	}
	conn, err := d.connect(ctx, cfg, log)
	if err != nil {
		return nil, err
	}

	var deadLetter *sinks.DeadLetter
	if cfg.Dead.Sink != "" {
		deadLetter = &sinks.DeadLetter{Sink: d.sinks[cfg.Dead.Sink], SinkName: cfg.Dead.Sink, Destination: cfg.Dead.Destination,
			Timeout: cfg.Scheduler.PublishTimeout.D(), Logger: log, Interval: cfg.Log.RepeatInterval.D(), Count: d.metrics.CountDeadLetters,
			Errors: func(r sinks.Reason, n int) {
				d.metrics.PublishErrors.WithLabelValues(cfg.Dead.Sink, string(r)).Add(float64(n))
			}}
	}

	rates := map[string]float64{}
	for _, sc := range cfg.Sinks {
		if sc.MaxRate > 0 {
			rates[sc.Name] = sc.MaxRate
		}
	}
	d.sched = scheduler.New(scheduler.Params{
		Store:          d.store,
		Sinks:          d.sinks,
		MaxRates:       rates,
		BatchSize:      cfg.Scheduler.BatchSize,
		Lease:          cfg.Scheduler.Lease.D(),
		LeaseMargin:    cfg.Scheduler.LeaseMargin.D(),
		Ahead:          cfg.Scheduler.FireAhead.D(),
		MaxSleep:       cfg.Scheduler.MaxSleep.D(),
		PublishTimeout: cfg.Scheduler.PublishTimeout.D(),
		MaxAttempts:    cfg.Scheduler.MaxAttempts,
		RepeatInterval: cfg.Log.RepeatInterval.D(),
		Backoff: lifecycle.Backoff{
			Min:        cfg.Scheduler.Backoff.Initial.D(),
			Max:        cfg.Scheduler.Backoff.Max.D(),
			Multiplier: cfg.Scheduler.Backoff.Multiplier,
			Jitter:     cfg.Scheduler.Backoff.Jitter,
		},
		MaxLateness:  cfg.Scheduler.MaxLateness.D(),
		LateDead:     cfg.Scheduler.LatePolicy == "dead",
		DeadLetter:   deadLetter,
		Destinations: DestinationGuard(cfg),
		DrainTimeout: drainBudget(cfg.ShutdownTimeout.D()),
		Clock:        schedClock,
		Metrics:      d.metrics,
		Tracer:       d.tracer,
		Logger:       log,
	})

	limits := Limits(cfg)
	limits.Fits = d.fits
	perIngest := map[string]int64{}
	for _, ic := range cfg.Ingest {
		perIngest[ic.Name] = ic.MaxParked
	}
	roomToPark := store.NewCapacity(d.store, cfg.Limits.MaxParkedMessages, cfg.Limits.MaxRedisMemory, perIngest)
	for i := range cfg.Ingest {
		ic := &cfg.Ingest[i]
		src, openErr := conn.srcs[i], conn.srcErrs[i]
		if openErr != nil {
			log.Warn("ingest cannot reach its broker: it starts connecting, not ready, and the rest of the bridge runs meanwhile", "ingest", ic.Name, "err", openErr)
		}
		d.pipes = append(d.pipes, ingest.NewPipeline(ingest.PipelineParams{
			Name:           ic.Name,
			Source:         src,
			Open:           conn.opens[i],
			Waiting:        brokers.Waiting,
			OpenErr:        openErr,
			Route:          Route(cfg, ic),
			Limits:         limits,
			Store:          d.store,
			Notify:         d.sched.Notify,
			Now:            d.clock.Now,
			MaxInFlight:    ic.MaxInFlight,
			DrainTimeout:   drainBudget(cfg.ShutdownTimeout.D()),
			DeadLetter:     deadLetter,
			Capacity:       roomToPark.For(ic.Name),
			RepeatInterval: cfg.Log.RepeatInterval.D(),
			Metrics:        d.metrics,
			Tracer:         d.tracer,
			Logger:         log,
		}))
	}

	state := metrics.State{Store: d.store, MaxRedisMemory: cfg.Limits.MaxRedisMemory, Persistence: d.persistence.kinds}
	for i, p := range d.pipes {
		in := metrics.Component{Name: cfg.Ingest[i].Name, Paused: p.Paused, MaxParked: cfg.Ingest[i].MaxParked}
		in.Ready = func() error {
			switch src := p.Source().(type) {
			case nil:
				return p.Ready() // connecting
			case ingest.Ready:
				return src.Ready()
			}
			return nil
		}
		state.Ingests = append(state.Ingests, in)
	}
	for name, s := range d.sinks {
		sk := metrics.Component{Name: name}
		if r, ok := s.(sinks.Ready); ok {
			sk.Ready = r.Ready
		}
		state.Sinks = append(state.Sinks, sk)
	}
	d.metrics.Registry.MustRegister(metrics.NewStateCollector(state))
	sinkNames := make([]string, 0, len(cfg.Sinks))
	for _, sc := range cfg.Sinks {
		sinkNames = append(sinkNames, sc.Name)
	}
	d.rates = metrics.NewRateMeter(d.metrics.Published, sinkNames)

	if cfg.Admin.Listen != "" {
		adminTLS, err := tlsutil.Server(cfg.Admin.TLS)
		if err != nil {
			return nil, err
		}
		routes := map[string]*envelope.Route{}
		for i := range cfg.Ingest {
			routes[cfg.Ingest[i].Name] = Route(cfg, &cfg.Ingest[i])
		}
		d.admin = admin.New(admin.Params{
			Listen:         cfg.Admin.Listen,
			Listener:       d.adminLn,
			Token:          cfg.Admin.Token.Reveal(),
			TLS:            adminTLS,
			Pprof:          cfg.Admin.Pprof,
			AllowedHosts:   cfg.Admin.AllowedHosts,
			RepeatInterval: cfg.Log.RepeatInterval.D(),
			Ops: ops.New(ops.Params{
				Store:        d.store,
				Limits:       limits,
				Destinations: SinkDestinations(cfg),
				Routes:       func(name string) (*envelope.Route, bool) { r, ok := routes[name]; return r, ok },
				Sinks:        d.sinkStatuses,
				Refresh:      d.sched.Refresh,
				Notify:       d.sched.Notify,
				Settled:      d.sched.Settled,
				Capacity:     roomToPark.For(""),
				Persistence:  d.persistence.view,
				Now:          d.clock.Now,
				Logger:       log,
			}),
			Ready:     d.Ready,
			Addresses: redisAddrs(cfg.Redis),
			Warnings:  d.warnings,
			Metrics:   d.metrics,
			Logger:    log,
		})
	}
	return d, nil
}

// openRedis opens the store and runs the checks a start makes of Redis,
// again while what fails is Redis passing through a failover or not
// answering (store.Passing, store.Unreachable), for up to
// redis.start_timeout with back-off: a start rides through what a running
// daemon rides through (a failover, a restart loading its data, a cluster
// electing a master, a Redis started beside it that does not listen yet).
// Anything else (credentials, TLS, a shard count or layout of another
// build) fails at once (waitsAtStart). An attempt under way at the end of
// start_timeout is bounded by the Redis client's own timeouts, not by it.
// The startup probes of deploy/ give a start two minutes. ctx ending
// meanwhile ends it with context.Canceled.
// store.ErrLayoutUnknown is returned with d.store open.
func (d *Daemon) openRedis(ctx context.Context, cfg *config.Config, log *slog.Logger,
	observe func(string, time.Duration, error), localNow func() time.Time) error {
	deadline := time.Now()
	if w := cfg.Redis.StartTimeout; w != nil {
		deadline = deadline.Add(w.D())
	}
	wait := 250 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := d.checkRedis(ctx, cfg, log, observe, localNow)
		if err == nil || errors.Is(err, store.ErrLayoutUnknown) {
			return err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("redis: %w", ctx.Err())
		}
		if !waitsAtStart(err) || time.Now().Add(wait).After(deadline) {
			return err
		}
		log.Warn("redis: not ready at start; trying again", "err", err, "attempt", attempt, "in", wait,
			"gives_up_in", time.Until(deadline).Round(time.Second))
		d.closeRedis()
		select {
		case <-ctx.Done():
			return fmt.Errorf("redis: %w", ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, 4*time.Second)
	}
}

// waitsAtStart reports whether a start waits out err: Redis passing through
// a failover or not answering (store.Passing, store.Unreachable; a name that
// does not resolve yet too, as a Kubernetes pod's own name until it is
// ready), but not a TLS handshake the server refused (its alert: a client
// certificate it does not take, a protocol), which does not pass by itself.
func waitsAtStart(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "remote error" { // crypto/tls's alert from the server
		return false
	}
	return store.Passing(err) || store.Unreachable(err)
}

// checkRedis is one attempt of openRedis.
func (d *Daemon) checkRedis(ctx context.Context, cfg *config.Config, log *slog.Logger,
	observe func(string, time.Duration, error), localNow func() time.Time) (err error) {
	d.store, err = openStore(ctx, cfg, observe, d.persistence.connected)
	if err != nil {
		return err
	}
	d.persistence.st = d.store
	if d.readyRedis, err = readyClient(cfg.Redis); err != nil {
		return err
	}
	if d.layout, err = d.store.CheckLayout(ctx, true); errors.Is(err, store.ErrLayoutUnknown) {
		return err
	} else if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	if err := d.store.CheckShards(ctx); err != nil {
		return err
	}
	if unguarded, err := d.store.Unguarded(ctx); err != nil {
		return err
	} else if unguarded {
		log.Warn("redis: the store is in layout 2 but records its shard count as the previous release reads it, which would then start on it "+
			"instead of refusing it: run `delaybridge migrate up` once (it converts nothing more, and records the count in the form that release refuses)",
			"redis_key", d.store.Keys().Config())
	}
	if err := census(ctx, cfg, d.store, log); err != nil {
		return err
	}
	if err := checkKeys(ctx, d.store, cfg.Encryption, log); err != nil {
		return err
	}
	if warning, err := d.store.CheckEviction(ctx); err != nil {
		return err
	} else if warning != "" {
		log.Warn("redis: " + warning)
	}
	d.persistence.record = d.keepRecord
	d.persistence.check(ctx)
	d.clock = store.NewClock(d.store, localNow)
	if err := d.clock.Measure(ctx); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	if off := d.clock.Offset(); off > time.Second || off < -time.Second {
		log.Warn("this machine's clock differs from redis's; due times follow redis's clock", "offset", off.Round(time.Millisecond))
	}
	return nil
}

// closeRedis closes the clients a failed attempt of checkRedis opened.
func (d *Daemon) closeRedis() {
	if d.readyRedis != nil {
		_ = d.readyRedis.Close()
		d.readyRedis = nil
	}
	if d.store != nil {
		_ = d.store.Client().Close()
		d.store = nil
	}
}

// drainBudget is the part of shutdown_timeout that the ingests and the
// scheduler may spend finishing their work after a stop began. The rest (a
// fifth, at most 2 s) is kept for returning unparked messages to their
// brokers, the final commits and closing connections, so that the whole stop
// ends within shutdown_timeout even when the drain cannot finish (Redis
// unreachable).
func drainBudget(shutdown time.Duration) time.Duration {
	return shutdown - min(shutdown/5, 2*time.Second)
}

// sinkStatuses is what the scheduler and the rate meter know of each
// configured sink, for the admin API.
func (d *Daemon) sinkStatuses() []admin.SinkStatus {
	rates := map[string]float64{}
	for _, sc := range d.cfg.Sinks {
		rates[sc.Name] = sc.MaxRate
	}
	var out []admin.SinkStatus
	for _, st := range d.sched.Sinks() {
		out = append(out, admin.SinkStatus{Name: st.Name, Known: true, Ready: st.Ready, Paused: st.Paused, Blocked: st.Blocked,
			Rate: d.rates.Rate(st.Name), MaxRate: rates[st.Name]})
	}
	return out
}

// AdminAddr is the admin server's address ("" without one).
func (d *Daemon) AdminAddr() string {
	if d.admin == nil {
		return ""
	}
	return d.admin.Addr()
}

// readyPing bounds Ready's ping of Redis: the timeouts of its client
// (readyClient).
const readyPing = time.Second

// Ready returns nil when Redis and every ingest and sink are connected, else
// every reason why not.
func (d *Daemon) Ready() error {
	var errs []string
	ctx, cancel := context.WithTimeout(context.Background(), readyPing)
	defer cancel()
	if err := d.readyRedis.Ping(ctx).Err(); err != nil {
		d.persistence.disconnected()
		var ne net.Error
		if ctx.Err() != nil || errors.As(err, &ne) && ne.Timeout() {
			// Its error says only that the time ran out: say where it
			// looked.
			err = fmt.Errorf("no answer from %s within %v: %w", redisAddr(d.cfg.Redis), readyPing, err)
		}
		errs = append(errs, "redis: "+err.Error())
	} else if err := d.sched.Ready(); err != nil {
		errs = append(errs, "redis: "+err.Error())
	} else if p := d.eviction.Load(); p != nil && *p != nil {
		errs = append(errs, "redis: "+(*p).Error())
	} else if err := d.store.KnowsLayout(ctx); err != nil {
		// A newer delaybridge's migrate can change it while we run.
		errs = append(errs, "redis: "+err.Error())
	} else if m := d.mismatch.Load(); m != nil && *m != "" {
		errs = append(errs, "redis: "+*m) // keepRecord's
	}
	for _, p := range d.pipes {
		if err := p.Ready(); err != nil {
			errs = append(errs, err.Error())
		}
	}
	for name, s := range d.sinks {
		if r, ok := s.(sinks.Ready); ok {
			if err := r.Ready(); err != nil {
				errs = append(errs, fmt.Sprintf("sink %s: %v", name, err))
			}
		}
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// Run runs until ctx ends; then it stops reading, parks and acknowledges
// what was read, finishes the publishes under way, commits, closes every
// connection and returns nil. An error means a component failed for good.
func (d *Daemon) Run(ctx context.Context) error {
	if d.refused != nil {
		return d.runRefused(ctx)
	}
	if d.admin != nil {
		if err := d.admin.Start(); err != nil {
			d.closeAll(context.Background())
			return fmt.Errorf("admin: %w", err)
		}
		d.log.Info("admin server listening", "addr", d.admin.Addr())
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()

	go d.rates.Run(runCtx)
	go d.persistence.run(runCtx)
	go d.watchEviction(runCtx)
	go d.watchLayout(runCtx)
	if max := d.cfg.Limits.MaxDead; max > 0 {
		sources := []string{""} // the admin API
		for _, in := range d.cfg.Ingest {
			sources = append(sources, in.Name)
		}
		go boundDead(runCtx, d.store, sources, max, d.log)
	}

	maxRates := map[string]float64{}
	for _, sc := range d.cfg.Sinks {
		maxRates[sc.Name] = sc.MaxRate
	}
	rateWork := applyMaxRates(runCtx, d.store, maxRates, d.cfg.Scheduler.MaxSleep.D()+time.Second, d.log) // before the scheduler gives a slot
	go rateWork(runCtx)

	var schedWG sync.WaitGroup
	schedCtx, stopSched := context.WithCancel(context.WithoutCancel(ctx))
	schedWG.Add(2)
	go func() {
		defer schedWG.Done()
		_ = d.sched.Run(schedCtx)
	}()
	go func() {
		defer schedWG.Done()
		d.clock.Run(schedCtx, d.log)
	}()

	errc := make(chan error, len(d.pipes))
	var pipeWG sync.WaitGroup
	for i, p := range d.pipes {
		pipeWG.Add(1)
		go func() {
			defer pipeWG.Done()
			if err := p.Run(runCtx); err != nil {
				if name := d.cfg.Ingest[i].Name; !strings.HasPrefix(err.Error(), "ingest "+name+": ") {
					err = fmt.Errorf("ingest %s: %w", name, err) // an opener's error names it already
				}
				errc <- err
				stop() // one ingest failed for good: stop the daemon so that it is restarted
			}
		}()
	}
	d.log.Info("delaybridge running", "ingests", len(d.pipes), "sinks", len(d.sinks), "shards", d.store.Shards())

	<-runCtx.Done()
	// One budget for the whole stop: the ingests drain and the scheduler
	// finishes its publishes at the same time, each within shutdown_timeout
	// of now; what is left of it goes to commits and closing.
	budget := d.cfg.ShutdownTimeout.D()
	shutdown, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	d.log.Info("stopping: no new messages are read or claimed; finishing what is in flight", "timeout", budget)
	stopSched()
	pipeWG.Wait()
	for i, p := range d.pipes {
		if src := p.Source(); src != nil {
			if err := src.Close(shutdown); err != nil {
				d.log.Warn("closing ingest", "ingest", d.cfg.Ingest[i].Name, "err", err)
			}
		}
	}
	d.sourcesClosed = true
	schedWG.Wait()
	d.closeAll(shutdown)
	close(errc)
	var errs []error
	for err := range errc {
		errs = append(errs, err)
	}
	d.log.Info("stopped")
	return errors.Join(errs...)
}

// evictionEvery is how often a running daemon reads every master's
// maxmemory-policy again (CONFIG SET can change it while it runs), for
// /readyz, which says the last answer: a probe costs no round trip to
// every master, and waits on none that is slow.
const evictionEvery = 10 * time.Second

// watchEviction reads the masters' eviction policy every evictionEvery
// until ctx ends; a reading that gets no answer, or an error other than a
// policy that deletes keys, keeps the last one.
func (d *Daemon) watchEviction(ctx context.Context) {
	lifecycle.Every(ctx, evictionEvery, func() {
		cctx, cancel := context.WithTimeout(ctx, evictionEvery)
		defer cancel()
		_, err := d.store.CheckEviction(cctx)
		if cctx.Err() != nil || err != nil && !errors.Is(err, store.ErrEvictionPolicy) {
			return // Redis out of reach: /readyz says that itself
		}
		d.eviction.Store(&err)
	})
}

// layoutEvery is how often a running daemon reads the layout Redis records
// (a newer delaybridge's migrate may change it): from a reading of one it
// does not know until one it knows, the store runs none of the shards'
// scripts, so that nothing is parked, claimed or changed in a layout this
// build does not know, and /readyz answers 503 with what to do.
const layoutEvery = time.Second

// watchLayout reads the layout every layoutEvery until ctx ends.
func (d *Daemon) watchLayout(ctx context.Context) {
	lifecycle.Every(ctx, layoutEvery, func() {
		cctx, cancel := context.WithTimeout(ctx, layoutEvery)
		defer cancel()
		_ = d.store.KnowsLayout(cctx) // the store keeps what it found
	})
}

// runRefused serves what a daemon that does not run can say, on
// admin.listen, until ctx ends: /healthz 200 (the process runs), and 503
// with the reason to everything else, /readyz included.
func (d *Daemon) runRefused(ctx context.Context) error {
	defer d.closeAll(context.Background())
	if d.cfg.Admin.Listen == "" {
		<-ctx.Done()
		return nil
	}
	tlsCfg, err := tlsutil.Server(d.cfg.Admin.TLS)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": "not running: " + d.refused.Error()})
	})
	srv := &http.Server{Handler: mux, TLSConfig: tlsCfg, ReadHeaderTimeout: 10 * time.Second}
	ln, err := net.Listen("tcp", d.cfg.Admin.Listen)
	if err != nil {
		return fmt.Errorf("admin: %w", err)
	}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	d.log.Info("admin server listening, answering 503: not running", "addr", ln.Addr().String())
	if tlsCfg != nil {
		err = srv.ServeTLS(ln, "", "")
	} else {
		err = srv.Serve(ln)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// fits is envelope.Limits.Fits: a message its sink's broker would refuse
// for its size (sinks.Sizer) is refused as it is taken in.
func (d *Daemon) fits(m *envelope.Message) error {
	if s, ok := d.sinks[m.Sink].(sinks.Sizer); ok {
		return s.Oversize(sinks.Outgoing{Message: m, Attempt: 1})
	}
	return nil
}

// connected is what connect opened for the ingests, by index in
// cfg.Ingest: each one's open, its source (nil while its broker does not
// answer) and then why (brokers.Unreachable).
type connected struct {
	opens   []func(context.Context) (ingest.Source, error)
	srcs    []ingest.Source
	srcErrs []error
}

// connect opens every sink (into d.sinks) and every ingest's source, all
// at once, so that brokers that take the connection and say nothing delay
// the start by one dial timeout, not one each. An ingest whose broker does
// not answer starts connecting (its pipeline opens it when it answers);
// any other failure stops the start, and ends the opens still under way.
// The error then names each failure; when the start was stopped (ctx
// ended) and nothing else failed, it wraps context.Canceled, and otherwise
// it does not.
func (d *Daemon) connect(ctx context.Context, cfg *config.Config, log *slog.Logger) (connected, error) {
	phase, cancel := context.WithCancel(ctx)
	defer cancel()
	c := connected{opens: make([]func(context.Context) (ingest.Source, error), len(cfg.Ingest))}
	for i := range cfg.Ingest {
		ic := &cfg.Ingest[i]
		c.opens[i] = func(ctx context.Context) (ingest.Source, error) {
			s, err := brokers.OpenSource(ctx, ic, log)
			if err != nil {
				return nil, err
			}
			return faultSource(s, log), nil
		}
	}
	var opened []sinks.Sink
	var sinkErrs []error
	var wg sync.WaitGroup
	wg.Go(func() {
		opened, sinkErrs = openAll(len(cfg.Sinks), func(i int) (sinks.Sink, error) {
			s, err := brokers.OpenSink(sinks.WithPublishTimeout(phase, cfg.Scheduler.PublishTimeout.D()), &cfg.Sinks[i], log)
			if err != nil {
				cancel() // a sink that does not open stops the start: no need to wait for the others
			}
			return s, err
		})
	})
	wg.Go(func() {
		c.srcs, c.srcErrs = openAll(len(c.opens), func(i int) (ingest.Source, error) {
			s, err := c.opens[i](phase)
			if err != nil && !brokers.Unreachable(err) {
				cancel() // a broker that answers and refuses stops the start
			}
			return s, err
		})
	})
	wg.Wait()
	for i, s := range opened {
		if sinkErrs[i] == nil {
			d.sinks[cfg.Sinks[i].Name] = faultSink(s, log)
		}
	}
	if phase.Err() == nil {
		return c, nil // every sink open; each ingest open or connecting
	}
	// Stopped, or something failed: the failures first, then what the
	// stop or a failure ended.
	var failed, ended []error
	for i, err := range slices.Concat(sinkErrs, c.srcErrs) {
		switch {
		case err == nil:
		case errors.Is(err, context.Canceled):
			ended = append(ended, err)
		case i >= len(sinkErrs) && brokers.Unreachable(err):
			// an ingest that would have started connecting
		default:
			failed = append(failed, err)
		}
	}
	for _, s := range c.srcs {
		if s != nil {
			_ = s.Close(context.Background())
		}
	}
	if len(failed) > 0 {
		return c, errors.Join(failed...)
	}
	if len(ended) == 0 {
		return c, fmt.Errorf("stopped while connecting: %w", ctx.Err())
	}
	return c, errors.Join(ended...)
}

// openAll calls open for 0..n-1 at once and returns each one's result and
// error, in that order.
func openAll[T any](n int, open func(i int) (T, error)) ([]T, []error) {
	out, errs := make([]T, n), make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { out[i], errs[i] = open(i) })
	}
	wg.Wait()
	return out, errs
}

// closeAll closes every connection that is open.
func (d *Daemon) closeAll(ctx context.Context) {
	if d.admin != nil {
		_ = d.admin.Shutdown(ctx)
	}
	if d.adminLn != nil {
		_ = d.adminLn.Close() // not served yet (a failed start); else closed with the server
	}
	if !d.sourcesClosed {
		for _, p := range d.pipes {
			if src := p.Source(); src != nil {
				_ = src.Close(ctx)
			}
		}
	}
	for _, s := range d.sinks {
		_ = s.Close()
	}
	if d.readyRedis != nil {
		_ = d.readyRedis.Close()
	}
	if d.store != nil {
		_ = d.store.Client().Close()
	}
	if d.stopTracing != nil {
		_ = d.stopTracing(ctx)
	}
}

// NewLogger builds the slog logger of cfg.Log writing to w.
func NewLogger(c config.Log, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(c.Level))
	opts := &slog.HandlerOptions{Level: level}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// LogRedisTo sends the Redis client's own log lines to log at DEBUG. By
// default go-redis prints them to stderr: a pool's dial failures, several
// lines for each, which the caller's error and the readiness probe already
// report in the daemon's (or the command line's) own format.
func LogRedisTo(log *slog.Logger) { redis.SetLogger(redisLogger{log}) }

// redisLogger sends go-redis's own messages (dial retries and the like) to
// slog at debug level: the failures that matter surface as errors of the
// operations, with context.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(_ context.Context, format string, v ...any) {
	l.log.Debug("redis client: " + fmt.Sprintf(format, v...))
}

// lostSaid is how long /readyz says that Redis lost its data.
const lostSaid = time.Hour

// warnings are /readyz's: Redis's persistence, and that Redis lost its
// data within lostSaid.
func (d *Daemon) warnings() []string {
	w := d.persistence.warnings()
	if at := d.lostAt.Load(); at != nil && time.Since(*at) < lostSaid {
		// ISO 8601's basic format: /readyz hides what looks like host:port
		// from a caller without the token, which 03:34:54 would.
		w = append(w, fmt.Sprintf("redis: lost its data %s ago, at %s (the store's record was missing): every message parked before then is gone",
			max(time.Since(*at), 0).Round(time.Second), at.UTC().Format("20060102T150405Z")))
	}
	return w
}

// keepRecord writes the store's layout and shard count into Redis again
// when Redis lost them while this daemon ran (it restarted without
// persistence, or was flushed): otherwise another instance with another
// shard count is let in, and finds parked messages unknown. A record that
// no longer matches (another shard count, a layout this build does not
// know) is logged once at ERROR and turns /readyz 503 while it lasts;
// Redis not answering is the readiness probe's to say.
func (d *Daemon) keepRecord(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, readyPing)
	defer cancel()
	lostAt, err := d.store.Rerecord(ctx, d.layout)
	if lostAt.After(d.started) {
		if prev := d.lostAt.Swap(&lostAt); prev == nil || !prev.Equal(lostAt) {
			d.log.Error("redis: the store's record was missing: Redis lost its data (it restarted without its AOF or RDB file, "+
				"was flushed, or another Redis answers at its address); every message parked before then is gone, and the ingests "+
				"read none of them again. Check Redis's persistence (appendonly yes) and its data directory",
				"redis_key", d.store.Keys().Config(), "lost_at", lostAt.UTC().Format(time.RFC3339Nano))
		}
	}
	if err != nil && !errors.Is(err, store.ErrShardMismatch) && !errors.Is(err, store.ErrLayoutUnknown) {
		d.log.Debug("cannot check the store's record; trying again at the next reading", "err", err)
		return
	}
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if prev := d.mismatch.Swap(&msg); msg == "" || prev != nil && *prev == msg {
		return // nothing to say, or said already
	}
	d.log.Error("redis: the store's record does not match this daemon: "+msg, "redis_key", d.store.Keys().Config())
}
