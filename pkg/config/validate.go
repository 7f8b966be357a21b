package config

import (
	"encoding/base64"
	"fmt"
	"math"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/pkg/destination"
	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// Defaults, as config.example.yaml documents them. They are named here
// once and applied by ApplyDefaults (the broker blocks' by their packages);
// the components a configuration builds take their values from it.
const (
	DefaultKeyPrefix         = "delaybridge"
	DefaultShards            = 16
	DefaultRedisDialTimeout  = 5 * time.Second
	DefaultRedisReadTimeout  = 3 * time.Second
	DefaultRedisWriteTimeout = 3 * time.Second
	DefaultRedisStartTimeout = 30 * time.Second

	DefaultAdminListen = "127.0.0.1:7070"
	DefaultLogLevel    = "info"
	DefaultLogFormat   = "text"
	// DefaultLogRepeatInterval is log.repeat_interval's.
	DefaultLogRepeatInterval = 10 * time.Second

	DefaultBatchSize = 256
	DefaultLease     = 30 * time.Second
	// DefaultLeaseMarginShare: scheduler.lease_margin is by default the
	// lease divided by it (DefaultLeaseMargin).
	DefaultLeaseMarginShare  = 5
	DefaultMaxSleep          = time.Second
	DefaultPublishTimeout    = 10 * time.Second
	DefaultMaxAttempts       = 10
	DefaultLatePolicy        = "deliver"
	DefaultBackoffInitial    = time.Second
	DefaultBackoffMax        = 5 * time.Minute
	DefaultBackoffMultiplier = 2.0
	DefaultBackoffJitter     = 0.2
	DefaultDedupeWindow      = 2 * time.Minute
	DefaultFireAhead         = 100 * time.Millisecond
	DefaultMissed            = envelope.MissedOnce
	DefaultMissedMax         = envelope.DefaultMissedMax

	DefaultMaxDelay        = 365 * 24 * time.Hour
	DefaultMaxPayloadBytes = 1 << 20
	DefaultMaxHeaderBytes  = 64 << 10
	DefaultMaxIDBytes      = 256
	DefaultMaxSeries       = 100_000
	DefaultMinInterval     = envelope.MinEvery

	DefaultDeadMaxMessages = 100_000

	// DefaultShutdownTimeout is the one budget of a graceful stop: the
	// daemon is gone within it (see daemon.Run).
	DefaultShutdownTimeout = 30 * time.Second

	DefaultMaxInFlight = 1000
)

// Bounds of values that have no natural limit, past which a value is a
// mistake.
const (
	MaxDedupeWindow = 7 * 24 * time.Hour
	MaxSinkRate     = 1_000_000
)

// DefaultLeaseMargin is scheduler.lease_margin's default for a lease.
func DefaultLeaseMargin(lease time.Duration) time.Duration { return lease / DefaultLeaseMarginShare }

// ApplyDefaults fills every unset field with its default.
func (c *Config) ApplyDefaults() {
	Default(&c.Redis.KeyPrefix, DefaultKeyPrefix)
	Default(&c.Redis.Shards, DefaultShards)
	Default(&c.Redis.DialTimeout, Duration(DefaultRedisDialTimeout))
	if c.Redis.StartTimeout == nil {
		w := Duration(DefaultRedisStartTimeout)
		c.Redis.StartTimeout = &w
	}
	Default(&c.Redis.ReadTimeout, Duration(DefaultRedisReadTimeout))
	Default(&c.Redis.WriteTimeout, Duration(DefaultRedisWriteTimeout))

	Default(&c.Admin.Listen, DefaultAdminListen)
	Default(&c.Log.Level, DefaultLogLevel)
	Default(&c.Log.Format, DefaultLogFormat)
	Default(&c.Log.RepeatInterval, Duration(DefaultLogRepeatInterval))
	if c.Tracing.SampleRatio == nil {
		one := 1.0
		c.Tracing.SampleRatio = &one
	}

	s := &c.Scheduler
	Default(&s.BatchSize, DefaultBatchSize)
	Default(&s.Lease, Duration(DefaultLease))
	Default(&s.LeaseMargin, Duration(DefaultLeaseMargin(s.Lease.D())))
	Default(&s.MaxSleep, Duration(DefaultMaxSleep))
	Default(&s.PublishTimeout, Duration(DefaultPublishTimeout))
	Default(&s.MaxAttempts, DefaultMaxAttempts)
	Default(&s.LatePolicy, DefaultLatePolicy)
	Default(&s.Backoff.Initial, Duration(DefaultBackoffInitial))
	Default(&s.Backoff.Max, Duration(DefaultBackoffMax))
	Default(&s.Backoff.Multiplier, DefaultBackoffMultiplier)
	Default(&s.Backoff.Jitter, DefaultBackoffJitter)
	if s.DedupeWindow == nil {
		w := Duration(DefaultDedupeWindow)
		s.DedupeWindow = &w
	}
	if s.FireAhead == nil {
		a := Duration(DefaultFireAhead)
		s.FireAhead = &a
	}

	Default(&c.Limits.MaxDelay, Duration(DefaultMaxDelay))
	Default(&c.Limits.MaxPayloadBytes, DefaultMaxPayloadBytes)
	Default(&c.Limits.MaxHeaderBytes, DefaultMaxHeaderBytes)
	Default(&c.Limits.MaxIDBytes, DefaultMaxIDBytes)
	Default(&c.Limits.MaxSeries, DefaultMaxSeries)
	Default(&c.Limits.MinInterval, Duration(DefaultMinInterval))

	Default(&c.Dead.MaxMessages, DefaultDeadMaxMessages)
	Default(&c.ShutdownTimeout, Duration(DefaultShutdownTimeout))

	for i := range c.Sinks {
		if b := c.Sinks[i].Broker; b != nil {
			b.ApplyDefaults()
		}
	}
	for i := range c.Ingest {
		in := &c.Ingest[i]
		Default(&in.MaxInFlight, DefaultMaxInFlight)
		Default(&in.Route.Missed, DefaultMissed.String())
		Default(&in.Route.MissedMax, DefaultMissedMax)
		if in.Route.Recurring == nil {
			yes := true
			in.Route.Recurring = &yes
		}
		if len(in.Dialects) == 0 {
			in.Dialects = []string{string(envelope.DialectDelaybridge)}
		}
		if in.Broker != nil {
			in.Broker.ApplyDefaults(in)
		}
	}
}

// Default sets *p to v when *p is the zero value: how every default is
// applied, here and in the broker packages.
func Default[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}

// Validate checks the whole configuration; the error is Problems.
func (c *Config) Validate() error {
	var p Problems
	c.validateRedis(&p)
	if c.Admin.Listen != "" {
		p.Listen("admin.listen", c.Admin.Listen)
	}
	if t := c.Admin.TLS; (t.CertFile == "") != (t.KeyFile == "") {
		p.Add("admin.tls", "give both cert_file and key_file")
	}
	if c.Admin.Pprof && c.Admin.Token.Reveal() == "" && !c.isUnread("admin.token") && !c.isUnread("admin.token_file") {
		p.Add("admin.pprof", "requires admin.token (or token_file): the profiles hold goroutine stacks, heap contents and command lines")
	}
	for i, h := range c.Admin.AllowedHosts {
		if reason := checkAllowedHost(h); reason != "" {
			p.Add(fmt.Sprintf("admin.allowed_hosts[%d]", i), "%q %s", h, reason)
		}
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		p.Add("log.level", "%q is not one of debug, info, warn, error", c.Log.Level)
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		p.Add("log.format", "%q is not one of text, json", c.Log.Format)
	}
	p.Positive("log.repeat_interval", int64(c.Log.RepeatInterval))
	if r := *c.Tracing.SampleRatio; r < 0 || r > 1 {
		p.Add("tracing.sample_ratio", "%g is not between 0 and 1", r)
	}
	c.validateScheduler(&p)
	p.Positive("limits.max_delay", int64(c.Limits.MaxDelay))
	p.Positive("limits.max_payload_bytes", int64(c.Limits.MaxPayloadBytes))
	p.Positive("limits.max_header_bytes", int64(c.Limits.MaxHeaderBytes))
	p.Positive("limits.max_id_bytes", int64(c.Limits.MaxIDBytes))
	if c.Limits.MinInterval.D() < envelope.MinEvery {
		p.Add("limits.min_interval", "%s is shorter than %s, the shortest a recurring message may repeat", c.Limits.MinInterval, envelope.MinEvery)
	}
	p.Positive("limits.max_series", c.Limits.MaxSeries)
	if c.Limits.MaxParkedMessages < 0 {
		p.Add("limits.max_parked_messages", "must not be negative (0: no limit)")
	}
	if c.Limits.MaxRedisMemory < 0 {
		p.Add("limits.max_redis_memory", "must not be negative (0: no limit)")
	}
	if c.Limits.MaxDead < 0 {
		p.Add("limits.max_dead", "must not be negative (0: no bound of its own)")
	}
	p.Positive("dead.max_messages", int64(c.Dead.MaxMessages))
	p.Positive("shutdown_timeout", int64(c.ShutdownTimeout))

	sinks := map[string]bool{}
	if len(c.Sinks) == 0 {
		p.Add("sinks", "at least one sink is required")
	}
	for i := range c.Sinks {
		c.validateSink(&p, i, sinks)
	}
	switch {
	case c.Dead.Sink != "" && !sinks[c.Dead.Sink] && !c.unreadEntries("sinks", "name"):
		p.Add("dead.sink", "%q names no sink in sinks", c.Dead.Sink)
	case c.Dead.Sink != "" && c.Dead.Destination == "":
		p.Add("dead.destination", "required with dead.sink")
	case c.Dead.Sink == "" && c.Dead.Destination != "":
		p.Add("dead.sink", "required with dead.destination")
	}
	names := map[string]bool{}
	for i := range c.Ingest {
		c.validateIngest(&p, i, names, sinks)
	}
	if c.Encryption != nil {
		c.Encryption.validate(&p, c)
	}
	if len(p) > 0 {
		return p.named(c.entryName)
	}
	return nil
}

func (c *Config) validateRedis(p *Problems) {
	r := &c.Redis
	sentinel := len(r.SentinelAddrs) > 0 || r.MasterName != ""
	switch {
	case sentinel && (r.Addr != "" || len(r.Addrs) > 0 || r.Cluster):
		p.Add("redis.sentinel_addrs", "with Sentinel, give sentinel_addrs and master_name only (not addr, addrs or cluster)")
	case sentinel && len(r.SentinelAddrs) == 0:
		p.Add("redis.sentinel_addrs", "master_name needs the sentinels in sentinel_addrs")
	case sentinel && r.MasterName == "":
		p.Add("redis.master_name", "sentinel_addrs needs the master_name the sentinels monitor")
	case sentinel:
	case r.Cluster && len(r.Addrs) == 0:
		p.Add("redis.addrs", "cluster: true needs the seed nodes in addrs")
	case r.Cluster && r.Addr != "":
		p.Add("redis.addr", "with cluster: true, give the nodes in addrs instead")
	case !r.Cluster && len(r.Addrs) > 0:
		p.Add("redis.addrs", "addrs is for Redis Cluster; set cluster: true, or give a single addr")
	case !r.Cluster && r.Addr == "":
		p.Add("redis.addr", "required (host:port of Redis)")
	}
	if r.Addr != "" {
		p.HostPort("redis.addr", r.Addr)
	}
	for i, a := range r.Addrs {
		p.HostPort(fmt.Sprintf("redis.addrs[%d]", i), a)
	}
	for i, a := range r.SentinelAddrs {
		p.HostPort(fmt.Sprintf("redis.sentinel_addrs[%d]", i), a)
	}
	if r.Cluster && r.DB != 0 {
		p.Add("redis.db", "Redis Cluster has only database 0")
	}
	if r.DB < 0 {
		p.Add("redis.db", "must not be negative")
	}
	if strings.ContainsAny(r.KeyPrefix, "{} \t\r\n") {
		p.Add("redis.key_prefix", "%q must not contain braces or white space (braces would change the cluster hash tag)", r.KeyPrefix)
	}
	if r.Shards < 1 || r.Shards > 1024 {
		p.Add("redis.shards", "%d is not between 1 and 1024", r.Shards)
	}
	p.Positive("redis.dial_timeout", int64(r.DialTimeout))
	p.Positive("redis.read_timeout", int64(r.ReadTimeout))
	p.Positive("redis.write_timeout", int64(r.WriteTimeout))
	if r.PoolSize < 0 {
		p.Add("redis.pool_size", "must not be negative")
	}
	if *r.StartTimeout < 0 {
		p.Add("redis.start_timeout", "must not be negative (0 fails a start at once when Redis does not answer)")
	}
	p.TLS("redis.tls", r.TLS)
}

func (c *Config) validateScheduler(p *Problems) {
	s := &c.Scheduler
	if s.BatchSize < 1 || s.BatchSize > 10_000 {
		p.Add("scheduler.batch_size", "%d is not between 1 and 10000", s.BatchSize)
	}
	p.Positive("scheduler.lease", int64(s.Lease))
	p.Positive("scheduler.lease_margin", int64(s.LeaseMargin))
	if s.LeaseMargin >= s.Lease && !c.isUnread("scheduler.lease") {
		p.Add("scheduler.lease_margin", "%s must be shorter than scheduler.lease %s: a publish starts only with this much of its lease left", s.LeaseMargin, s.Lease)
	}
	p.Positive("scheduler.max_sleep", int64(s.MaxSleep))
	p.Positive("scheduler.publish_timeout", int64(s.PublishTimeout))
	if s.PublishTimeout >= s.Lease && !c.isUnread("scheduler.lease") {
		p.Add("scheduler.publish_timeout", "%s must be shorter than scheduler.lease %s, or a slow publish would be taken over by another instance", s.PublishTimeout, s.Lease)
	}
	if s.LatePolicy != "deliver" && s.LatePolicy != "dead" {
		p.Add("scheduler.late_policy", "%q is not one of deliver, dead", s.LatePolicy)
	}
	if s.MaxLateness < 0 {
		p.Add("scheduler.max_lateness", "must not be negative")
	}
	if s.LatePolicy == "dead" && s.MaxLateness == 0 {
		p.Add("scheduler.max_lateness", "late_policy dead needs a max_lateness")
	}
	if s.MaxAttempts < 1 {
		p.Add("scheduler.max_attempts", "must be at least 1")
	}
	p.Positive("scheduler.backoff.initial", int64(s.Backoff.Initial))
	if s.Backoff.Max < s.Backoff.Initial && !c.isUnread("scheduler.backoff.initial") {
		p.Add("scheduler.backoff.max", "%s is less than backoff.initial %s", s.Backoff.Max, s.Backoff.Initial)
	}
	if s.Backoff.Multiplier < 1 {
		p.Add("scheduler.backoff.multiplier", "%g must be at least 1", s.Backoff.Multiplier)
	}
	if s.Backoff.Jitter < 0 || s.Backoff.Jitter > 1 {
		p.Add("scheduler.backoff.jitter", "%g is not between 0 and 1", s.Backoff.Jitter)
	}
	switch w := *s.DedupeWindow; {
	case w < 0:
		p.Add("scheduler.dedupe_window", "must not be negative (0 turns it off)")
	case w > 0 && w < s.Lease && !c.isUnread("scheduler.lease"):
		p.Add("scheduler.dedupe_window", "%s is shorter than scheduler.lease %s: a crashed instance's messages are taken over only after the lease, and their re-reads may come later than the window; make it at least the lease, or 0 to turn it off", w, s.Lease)
	case w.D() > MaxDedupeWindow:
		p.Add("scheduler.dedupe_window", "%s is over %s: Redis keeps a mark per delivered message for the whole window (docs/operations.md, \"The dedupe window\", gives its cost)", w, MaxDedupeWindow)
	}
	switch a := *s.FireAhead; {
	case a < 0:
		p.Add("scheduler.fire_ahead", "must not be negative (0 claims only what is due)")
	case a > s.Lease/2 && !c.isUnread("scheduler.lease"):
		p.Add("scheduler.fire_ahead", "%s is over half of scheduler.lease %s: a message claimed ahead is held under the lease until its due instant; make it shorter", a, s.Lease)
	}
}

func (c *Config) validateSink(p *Problems, i int, names map[string]bool) {
	s := &c.Sinks[i]
	at := fmt.Sprintf("sinks[%d]", i)
	checkName(p, at+".name", s.Name, names, "sink")
	switch {
	case s.MaxRate < 0 || math.IsNaN(s.MaxRate):
		p.Add(at+".max_rate", "must not be negative (0: no limit)")
	case s.MaxRate > MaxSinkRate:
		p.Add(at+".max_rate", "%g messages/s is over %g: no broker takes that much from one bridge; leave it out for no limit", s.MaxRate, float64(MaxSinkRate))
	case s.MaxRate > 0 && s.MaxRate < 0.001:
		p.Add(at+".max_rate", "%g messages/s is under one message in 1000 s; 0 means no limit", s.MaxRate)
	}
	checkOneBroker(p, at, s.brokerKeys, s.Broker != nil)
	if s.Broker != nil {
		s.Broker.Validate(at+"."+s.Kind(), p)
	}
}

func (c *Config) validateIngest(p *Problems, i int, names, sinks map[string]bool) {
	in := &c.Ingest[i]
	at := fmt.Sprintf("ingest[%d]", i)
	checkName(p, at+".name", in.Name, names, "ingest")
	checkOneBroker(p, at, in.brokerKeys, in.Broker != nil)
	if in.Broker != nil {
		in.Broker.Validate(in, at+"."+in.Kind(), p)
	}
	if in.MaxInFlight < 1 {
		p.Add(at+".max_in_flight", "must be at least 1")
	}
	if in.MaxParked < 0 {
		p.Add(at+".max_parked", "must not be negative (0: no bound of its own)")
	}
	if in.MaxSeries < 0 {
		p.Add(at+".max_series", "must not be negative (0: no bound of its own)")
	}
	r := &in.Route
	switch {
	case r.Sink == "":
		p.Add(at+".route.sink", "required: the name of one of sinks")
	case !sinks[r.Sink] && !c.unreadEntries("sinks", "name"):
		p.Add(at+".route.sink", "%q names no sink in sinks", r.Sink)
	}
	p.Required(at+".route.destination", r.Destination)
	if _, err := envelope.ParseTemplate(r.Destination); err != nil {
		p.Add(at+".route.destination", "%q: %v", r.Destination, err)
	}
	c.validateDialects(p, in, at)
	if len(r.AllowedSinks) > 0 && !r.AllowOverride {
		p.Add(at+".route.allow_override", "allowed_sinks restricts x-delay-sink; set allow_override: true to allow it")
	}
	for j, s := range r.AllowedSinks {
		if !sinks[s] && !c.unreadEntries("sinks", "name") {
			p.Add(fmt.Sprintf("%s.route.allowed_sinks[%d]", at, j), "%q names no sink in sinks", s)
		}
	}
	syntaxes := c.routeSyntaxes(r)
	for j, d := range r.AllowedDestinations {
		for _, syn := range syntaxes {
			if why := syn.CheckPattern(d); why != "" {
				p.Add(fmt.Sprintf("%s.route.allowed_destinations[%d]", at, j), "%s", why)
				break
			}
		}
	}
	if syn, ok := c.SinkDestinations(r.Sink); ok && r.Destination != "" && !strings.ContainsAny(r.Destination, "{}") {
		// A literal destination is checked here once; a template per message.
		if err := syn.Check(r.Destination, r.AllowedDestinations, false); err != nil {
			p.Add(at+".route.destination", "%v", err)
		}
	}
	if r.DefaultDelay != nil && *r.DefaultDelay < 0 {
		p.Add(at+".route.default_delay", "must not be negative")
	}
	if r.MissedMax < 1 {
		p.Add(at+".route.missed_max", "must be at least 1")
	}
	if _, err := envelope.ParseMissed(r.Missed); err != nil {
		p.Add(at+".route.missed", "%v", err)
	}
	if r.DefaultDelay != nil && *r.DefaultDelay > c.Limits.MaxDelay && !c.isUnread("limits.max_delay") {
		p.Add(at+".route.default_delay", "%s is over limits.max_delay %s", r.DefaultDelay, c.Limits.MaxDelay)
	}
}

// routeSyntaxes are the destination syntaxes of the sinks a route's
// messages may go to: its sink, and those x-delay-sink may choose.
func (c *Config) routeSyntaxes(r *Route) []destination.Syntax {
	var out []destination.Syntax
	for i := range c.Sinks {
		s := &c.Sinks[i]
		if s.Broker == nil {
			continue
		}
		if s.Name == r.Sink || (r.AllowOverride && (len(r.AllowedSinks) == 0 || slices.Contains(r.AllowedSinks, s.Name))) {
			out = append(out, s.Broker.Destinations())
		}
	}
	return out
}

// SinkDestinations returns the destination syntax of the sink named name;
// false when no sink of that name has a broker block. It is the one place
// that says where a sink never publishes unless a route names it: its
// broker's reserved parts (SinkBroker.Destinations) and the parts of its
// namespace this daemon uses itself (owned: what an ingest of this
// configuration consumes, the dead letters' destination). Every path
// that decides a destination uses it: ingest and import (the routes),
// the admin API and dead retries (ops), the scheduler before it publishes
// (daemon.DestinationGuard), and validate.
func (c *Config) SinkDestinations(name string) (destination.Syntax, bool) {
	for i := range c.Sinks {
		s := &c.Sinks[i]
		if s.Name == name && s.Broker != nil {
			syn := s.Broker.Destinations()
			for _, o := range c.owned(s) {
				syn = syn.Reserve(o.part)
			}
			return syn, true
		}
	}
	return destination.Syntax{}, false
}

// sameKind reports whether the sink named name has a broker of s's kind:
// it may be the same cluster under another name, whose namespace a
// publisher reaches through s.
func (c *Config) sameKind(name string, s *Sink) bool {
	for i := range c.Sinks {
		if o := &c.Sinks[i]; o.Name == name && o.Broker != nil {
			return o.Broker.Kind() == s.Broker.Kind()
		}
	}
	return false
}

// own is a part of a sink's namespace that this daemon uses itself.
type own struct {
	part destination.Reserved
	who  string // who uses it, for validate's list
}

// owned are the parts of the namespace of sink s that this daemon uses
// itself: what each ingest consumes (IngestBroker.Consumes), where a
// message published would come back to it (a loop), and the dead letters'
// destination (dead.destination) on every sink of the dead sink's broker
// kind, where one would pass for a dead letter, its
// x-delaybridge-dead-reason the publisher's.
func (c *Config) owned(s *Sink) []own {
	var out []own
	for j := range c.Ingest {
		in := &c.Ingest[j]
		if in.Broker == nil {
			continue
		}
		for _, r := range in.Broker.Consumes(s.Broker) {
			r.What = fmt.Sprintf("what ingest %s consumes: a message published there would come back to it (a loop)", in.Name)
			out = append(out, own{part: r, who: "ingest " + in.Name + " reads it"})
		}
	}
	if d := c.Dead.Destination; d != "" && c.sameKind(c.Dead.Sink, s) {
		out = append(out, own{part: destination.Reserved{Prefix: d, Pattern: d, Example: d,
			What: "the dead letters' destination (dead.destination): a message published there would pass for a dead letter"},
			who: "dead letters go there"})
	}
	return out
}

// Refused lists, for each sink, the parts of its namespace no message
// reaches unless a route's allowed_destinations names them literally
// (SinkDestinations): what `delaybridge validate` prints, one line a sink.
func (c *Config) Refused() []string {
	var out []string
	for i := range c.Sinks {
		s := &c.Sinks[i]
		if s.Broker == nil {
			continue
		}
		syn := s.Broker.Destinations()
		var parts []string
		for _, r := range syn.Reserved {
			parts = append(parts, r.String())
		}
		for _, o := range c.owned(s) {
			parts = append(parts, fmt.Sprintf("%s (%s)", o.part, o.who))
		}
		if len(parts) > 0 {
			out = append(out, fmt.Sprintf("sink %s (%ss): %s", s.Name, syn.Noun, strings.Join(parts, ", ")))
		}
	}
	return out
}

// Warnings are what a valid configuration opens that its author may not
// mean: a route whose destination a publisher chooses (allow_override, or
// a template with a placeholder) without route.allowed_destinations, and
// what an ingest may read of a sink's namespace that it cannot reserve
// (LoopWarner). `delaybridge validate` prints them and the daemon logs
// them at start.
func (c *Config) Warnings() Problems {
	var w Problems
	for i := range c.Ingest {
		in := &c.Ingest[i]
		if lw, ok := in.Broker.(LoopWarner); ok {
			for j := range c.Sinks {
				if c.Sinks[j].Broker != nil {
					lw.LoopWarnings(c.Sinks[j].Broker, c.Sinks[j].Name, fmt.Sprintf("ingest[%d].%s", i, in.Broker.Kind()), &w)
				}
			}
		}
		r := &in.Route
		at := fmt.Sprintf("ingest[%d].route", i)
		if strings.Contains(strings.ReplaceAll(r.Destination, "{{", ""), "{source}") {
			w.Add(at+".destination", "%q: {source} is the message's whole name as one token: a name with a dot "+
				"(a subject orders.created, a topic com.acme.orders) makes the message dead; {source.1:} is the whole name, dots included",
				r.Destination)
		}
		if len(r.AllowedDestinations) > 0 {
			continue
		}
		var who string
		switch {
		case r.AllowOverride:
			who = "allow_override lets a publisher choose any destination (x-delay-destination)"
		case hasPlaceholder(r.Destination):
			who = fmt.Sprintf("destination %q lets a publisher choose a destination through its placeholders", r.Destination)
		default:
			continue
		}
		var opens []string
		for _, s := range c.Sinks {
			if s.Name != r.Sink && !(r.AllowOverride && (len(r.AllowedSinks) == 0 || slices.Contains(r.AllowedSinks, s.Name))) {
				continue
			}
			if s.Broker != nil {
				opens = append(opens, s.Broker.Opens(s.Name))
			}
		}
		w.Add(at+".allowed_destinations", "not set, and %s: %s. List the destinations the publishers may use (patterns in the sink broker's wildcards)",
			who, strings.Join(opens, "; "))
	}
	return w.named(c.entryName)
}

// entryName is Problems.named's nameOf on a read configuration: the name
// of the ingest or sink at that path ("ingest[1]", "sinks[0]").
func (c *Config) entryName(entry string) string {
	var i int
	switch {
	case scanEntry(entry, "ingest[%d]", &i) && i < len(c.Ingest):
		return c.Ingest[i].Name
	case scanEntry(entry, "sinks[%d]", &i) && i < len(c.Sinks):
		return c.Sinks[i].Name
	}
	return ""
}

// scanEntry reads the index of entry, a list entry's path in format (one
// %d), into i.
func scanEntry(entry, format string, i *int) bool {
	n, err := fmt.Sscanf(entry, format, i)
	return err == nil && n == 1 && fmt.Sprintf(format, *i) == entry && *i >= 0
}

func hasPlaceholder(dest string) bool {
	t, err := envelope.ParseTemplate(dest)
	return err == nil && !t.Literal()
}

func (c *Config) validateDialects(p *Problems, in *Ingest, at string) {
	seen := map[string]bool{}
	for j, d := range in.Dialects {
		field := fmt.Sprintf("%s.dialects[%d]", at, j)
		switch {
		case !slices.Contains(envelope.Dialects, envelope.Dialect(d)):
			p.Add(field, "%q is not one of %s", d, joinDialects())
		case seen[d]:
			p.Add(field, "%q is given twice", d)
		case in.Broker != nil && !slices.Contains(in.Broker.Dialects(), envelope.Dialect(d)):
			p.Add(field, "%s: only on %s ingest, not %s", dialectReads(envelope.Dialect(d)), ingestsReading(envelope.Dialect(d)), in.Kind())
		case envelope.Dialect(d) == envelope.DialectKafkaScheduler && !in.Route.AllowOverride:
			p.Add(field, "kafka-scheduler publishes to the record's scheduler-target-topic: set route.allow_override: true (and restrict it with route.allowed_destinations)")
		}
		seen[d] = true
	}
}

// dialectReads says what a dialect reads that not every broker's messages
// have.
func dialectReads(d envelope.Dialect) string {
	if d == envelope.DialectKafkaScheduler {
		return "kafka-scheduler reads Kafka records (key, tombstones)"
	}
	return string(d)
}

// ingestsReading names the registered brokers whose ingests read dialect d
// (IngestBroker.Dialects): "a kafka", "a kafka or a nats".
func ingestsReading(d envelope.Dialect) string {
	var kinds []string
	for _, k := range BrokerKinds() {
		if slices.Contains(registered[k].NewIngest().Dialects(), d) {
			kinds = append(kinds, "a "+k)
		}
	}
	if len(kinds) == 0 {
		return "no"
	}
	return strings.Join(kinds, " or ")
}

func joinDialects() string {
	names := make([]string, len(envelope.Dialects))
	for i, d := range envelope.Dialects {
		names[i] = string(d)
	}
	return strings.Join(names, ", ")
}

// encryptionKeyID is what a key ID may be: it is stored with every message.
var encryptionKeyID = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

func (e *Encryption) validate(p *Problems, c *Config) {
	if len(e.Keys) == 0 {
		p.Add("encryption.keys", "at least one key is required (or remove encryption: to store messages in clear)")
	}
	ids := map[string]bool{}
	for i, k := range e.Keys {
		at := fmt.Sprintf("encryption.keys[%d]", i)
		switch {
		case k.ID == "":
			p.Add(at+".id", "required: a name stored with every message the key seals, e.g. k1")
		case !encryptionKeyID.MatchString(k.ID):
			p.Add(at+".id", "%q must be 1 to 64 letters, digits, '.', '_' or '-'", k.ID)
		case ids[k.ID]:
			p.Add(at+".id", "%q is used by another key", k.ID)
		}
		ids[k.ID] = true
		field := at + ".key"
		if k.KeyFile != "" {
			field = at + ".key_file"
		}
		// The value is never shown: base64's error names only an offset,
		// and the size is all that is said of a valid encoding.
		switch raw, err := base64.StdEncoding.DecodeString(k.Key.Reveal()); {
		case k.Key == "" && k.KeyFile == "":
			p.Add(at+".key", "required: 32 random bytes in standard base64 (openssl rand -base64 32), or key_file")
		case k.Key == "":
			p.Add(field, "gave no key (the file is empty, or could not be read): it must hold 32 random bytes in standard base64 (openssl rand -base64 32)")
		case err != nil:
			p.Add(field, "not valid standard base64 (make a key with: openssl rand -base64 32)")
		case len(raw) != 32:
			p.Add(field, "decodes to %d bytes; AES-256 needs 32 (make a key with: openssl rand -base64 32)", len(raw))
		}
	}
	switch {
	case e.ActiveKey == "":
		p.Add("encryption.active_key", "required: the id of the key that seals new messages")
	case !ids[e.ActiveKey] && !c.unreadEntries("encryption.keys", "id"):
		p.Add("encryption.active_key", "%q is not the id of a key in encryption.keys", e.ActiveKey)
	}
}

func checkName(p *Problems, at, name string, seen map[string]bool, what string) {
	switch {
	case name == "":
		p.Add(at, "required: a unique %s name", what)
	case seen[name]:
		p.Add(at, "%q is used by another %s", name, what)
	case strings.ContainsAny(name, " \t\r\n/"):
		p.Add(at, "%q must not contain white space or '/'", name)
	}
	seen[name] = true
}

// checkAllowedHost says why h cannot be an admin.allowed_hosts entry: a
// host name or an IP address, without scheme, port or path.
func checkAllowedHost(h string) string {
	switch {
	case h == "":
		return "is empty"
	case strings.ContainsAny(h, "/:[]@ \t") && net.ParseIP(h) == nil:
		return "must be a host name or an IP address, without scheme, port or path (e.g. admin.example.com)"
	}
	if net.ParseIP(h) != nil {
		return ""
	}
	for _, label := range strings.Split(strings.TrimSuffix(h, "."), ".") {
		if label == "" || len(label) > 63 || strings.HasPrefix(label, "-") || strings.HasSuffix(label, "-") ||
			strings.ContainsFunc(label, func(r rune) bool {
				return !(r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
			}) {
			return "is not a valid host name"
		}
	}
	return ""
}

// Required reports a value that is empty or only white space.
func (p *Problems) Required(at, v string) {
	if strings.TrimSpace(v) == "" {
		p.Add(at, "required")
	}
}

// Positive reports a value that is 0 or less.
func (p *Problems) Positive(at string, v int64) {
	if v <= 0 {
		p.Add(at, "must be positive")
	}
}

// HostPort reports a value that is not host:port of a server to dial
// (port 1 to 65535).
func (p *Problems) HostPort(at, v string) { p.hostPort(at, v, 1) }

// Listen reports a value that is not host:port to listen on (port 0: any
// free one).
func (p *Problems) Listen(at, v string) { p.hostPort(at, v, 0) }

func (p *Problems) hostPort(at, v string, lowest int) {
	_, port, err := net.SplitHostPort(v)
	if err != nil {
		p.Add(at, "%q is not host:port", v)
		return
	}
	p.port(at, port, lowest)
}

// port reports a port number out of range.
func (p *Problems) port(at, port string, lowest int) {
	if port == "" {
		p.Add(at, "the port is missing (host:port)")
	} else if n, err := strconv.Atoi(port); err == nil && (n < lowest || n > 65535) {
		p.Add(at, "port %s is not one of %d to 65535", port, lowest)
	}
}

// URL reports a value that is missing, not a URL, or of another scheme;
// the message never quotes the URL (it may hold a password).
func (p *Problems) URL(at, v string, schemes ...string) {
	if v == "" {
		p.Add(at, "required")
		return
	}
	if !strings.Contains(v, "://") && len(schemes) > 0 {
		p.Add(at, "not a URL: give its scheme and host, such as %s://127.0.0.1:%s", schemes[0], defaultPorts[schemes[0]])
		return
	}
	u, err := url.Parse(v)
	if err != nil {
		// url.Error quotes the URL, password included, and its inner error a piece of it.
		p.Add(at, "not a URL (a reserved character in the user or password, such as / # ? @ %%, must be percent-encoded)")
		return
	}
	if !slices.Contains(schemes, u.Scheme) {
		p.Add(at, "scheme %q is not one of %s", u.Scheme, strings.Join(schemes, ", "))
		return
	}
	if u.Port() != "" { // none: the scheme's own
		p.port(at, u.Port(), 1)
	}
}

// defaultPorts are the usual ports of the brokers' URL schemes, for the
// example in a problem.
var defaultPorts = map[string]string{"nats": "4222", "tls": "4222", "amqp": "5672", "amqps": "5671"}

// TLS reports a client TLS block that is inconsistent.
func (p *Problems) TLS(at string, t TLS) {
	if !t.Enabled && (t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != "" || t.InsecureSkipVerify) {
		p.Add(at+".enabled", "TLS settings are given but enabled is false; set enabled: true")
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		p.Add(at, "give both cert_file and key_file for a client certificate")
	}
}
