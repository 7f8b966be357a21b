package config

import (
	"encoding/base64"
	"fmt"
	"net"
	"net/url"
	"path"
	"regexp"
	"strings"
	"time"
)

// Defaults, as documented in config.example.yaml.
const (
	DefaultAdminListen = "127.0.0.1:7070"
	DefaultKeyPrefix   = "delaybridge"
	DefaultShards      = 16
)

// ApplyDefaults fills every unset field with its default.
func (c *Config) ApplyDefaults() {
	setStr(&c.Redis.KeyPrefix, DefaultKeyPrefix)
	setInt(&c.Redis.Shards, DefaultShards)
	setDur(&c.Redis.DialTimeout, 5*time.Second)
	setDur(&c.Redis.ReadTimeout, 3*time.Second)
	setDur(&c.Redis.WriteTimeout, 3*time.Second)

	setStr(&c.Admin.Listen, DefaultAdminListen)
	setStr(&c.Log.Level, "info")
	setStr(&c.Log.Format, "text")
	if c.Tracing.SampleRatio == nil {
		one := 1.0
		c.Tracing.SampleRatio = &one
	}

	s := &c.Scheduler
	setInt(&s.BatchSize, 256)
	setDur(&s.Lease, 30*time.Second)
	setDur(&s.MaxSleep, time.Second)
	setDur(&s.PublishTimeout, 10*time.Second)
	setInt(&s.MaxAttempts, 10)
	setStr(&s.LatePolicy, "deliver")
	setDur(&s.Backoff.Initial, time.Second)
	setDur(&s.Backoff.Max, 5*time.Minute)
	if s.Backoff.Multiplier == 0 {
		s.Backoff.Multiplier = 2
	}
	if s.Backoff.Jitter == 0 {
		s.Backoff.Jitter = 0.2
	}

	setDur(&c.Limits.MaxDelay, 365*24*time.Hour)
	setInt(&c.Limits.MaxPayloadBytes, 1<<20)
	setInt(&c.Limits.MaxHeaderBytes, 64<<10)
	setInt(&c.Limits.MaxIDBytes, 256)

	setInt(&c.Dead.MaxMessages, 100_000)
	setDur(&c.ShutdownTimeout, 30*time.Second)

	for i := range c.Sinks {
		if k := c.Sinks[i].Kafka; k != nil {
			setDur(&k.BatchTimeout, time.Millisecond)
			setInt(&k.BatchSize, 1000)
			setStr(&k.Compression, "none")
		}
		if r := c.Sinks[i].RabbitMQ; r != nil && r.Mandatory == nil {
			yes := true
			r.Mandatory = &yes
		}
	}

	for i := range c.Ingest {
		in := &c.Ingest[i]
		setInt(&in.MaxInFlight, 1000)
		if k := in.Kafka; k != nil {
			setStr(&k.StartOffset, "first")
			setDur(&k.SessionTimeout, 10*time.Second)
			setInt(&k.MaxInFlightPerPartition, 1000)
			setDur(&k.CommitInterval, 100*time.Millisecond)
		}
		if r := in.RabbitMQ; r != nil {
			setInt(&r.Prefetch, in.MaxInFlight)
		}
		if n := in.NATS; n != nil && n.Stream != "" {
			setStr(&n.Durable, durableName(in.Name))
			setDur(&n.AckWait, 30*time.Second)
		}
	}
}

// durableName makes a JetStream consumer name from an ingest name.
func durableName(name string) string {
	r := strings.NewReplacer(".", "_", "*", "_", ">", "_", " ", "_", "\t", "_")
	return "delaybridge_" + r.Replace(name)
}

func setStr(p *string, v string) {
	if *p == "" {
		*p = v
	}
}

func setInt(p *int, v int) {
	if *p == 0 {
		*p = v
	}
}

func setDur(p *Duration, v time.Duration) {
	if *p == 0 {
		*p = Duration(v)
	}
}

// Validate checks the whole configuration; the error is Problems.
func (c *Config) Validate() error {
	var p Problems
	c.validateRedis(&p)
	if c.Admin.Listen != "" {
		checkHostPort(&p, "admin.listen", c.Admin.Listen)
	}
	if t := c.Admin.TLS; (t.CertFile == "") != (t.KeyFile == "") {
		p.add("admin.tls", "give both cert_file and key_file")
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		p.add("log.level", "%q is not one of debug, info, warn, error", c.Log.Level)
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		p.add("log.format", "%q is not one of text, json", c.Log.Format)
	}
	if r := *c.Tracing.SampleRatio; r < 0 || r > 1 {
		p.add("tracing.sample_ratio", "%g is not between 0 and 1", r)
	}
	c.validateScheduler(&p)
	positive(&p, "limits.max_delay", int64(c.Limits.MaxDelay))
	positive(&p, "limits.max_payload_bytes", int64(c.Limits.MaxPayloadBytes))
	positive(&p, "limits.max_header_bytes", int64(c.Limits.MaxHeaderBytes))
	positive(&p, "limits.max_id_bytes", int64(c.Limits.MaxIDBytes))
	if c.Limits.MaxParkedMessages < 0 {
		p.add("limits.max_parked_messages", "must not be negative (0: no limit)")
	}
	if c.Limits.MaxRedisMemory < 0 {
		p.add("limits.max_redis_memory", "must not be negative (0: no limit)")
	}
	positive(&p, "dead.max_messages", int64(c.Dead.MaxMessages))
	positive(&p, "shutdown_timeout", int64(c.ShutdownTimeout))

	sinks := map[string]bool{}
	if len(c.Sinks) == 0 {
		p.add("sinks", "at least one sink is required")
	}
	for i := range c.Sinks {
		c.validateSink(&p, i, sinks)
	}
	switch {
	case c.Dead.Sink != "" && !sinks[c.Dead.Sink]:
		p.add("dead.sink", "%q names no sink in sinks", c.Dead.Sink)
	case c.Dead.Sink != "" && c.Dead.Destination == "":
		p.add("dead.destination", "required with dead.sink")
	case c.Dead.Sink == "" && c.Dead.Destination != "":
		p.add("dead.sink", "required with dead.destination")
	}
	names := map[string]bool{}
	for i := range c.Ingest {
		c.validateIngest(&p, i, names, sinks)
	}
	if c.Encryption != nil {
		c.Encryption.validate(&p)
	}
	if len(p) > 0 {
		return p
	}
	return nil
}

func (c *Config) validateRedis(p *Problems) {
	r := &c.Redis
	sentinel := len(r.SentinelAddrs) > 0 || r.MasterName != ""
	switch {
	case sentinel && (r.Addr != "" || len(r.Addrs) > 0 || r.Cluster):
		p.add("redis.sentinel_addrs", "with Sentinel, give sentinel_addrs and master_name only (not addr, addrs or cluster)")
	case sentinel && len(r.SentinelAddrs) == 0:
		p.add("redis.sentinel_addrs", "master_name needs the sentinels in sentinel_addrs")
	case sentinel && r.MasterName == "":
		p.add("redis.master_name", "sentinel_addrs needs the master_name the sentinels monitor")
	case sentinel:
	case r.Cluster && len(r.Addrs) == 0:
		p.add("redis.addrs", "cluster: true needs the seed nodes in addrs")
	case r.Cluster && r.Addr != "":
		p.add("redis.addr", "with cluster: true, give the nodes in addrs instead")
	case !r.Cluster && len(r.Addrs) > 0:
		p.add("redis.addrs", "addrs is for Redis Cluster; set cluster: true, or give a single addr")
	case !r.Cluster && r.Addr == "":
		p.add("redis.addr", "required (host:port of Redis)")
	}
	if r.Addr != "" {
		checkHostPort(p, "redis.addr", r.Addr)
	}
	for i, a := range r.Addrs {
		checkHostPort(p, fmt.Sprintf("redis.addrs[%d]", i), a)
	}
	for i, a := range r.SentinelAddrs {
		checkHostPort(p, fmt.Sprintf("redis.sentinel_addrs[%d]", i), a)
	}
	if r.Cluster && r.DB != 0 {
		p.add("redis.db", "Redis Cluster has only database 0")
	}
	if r.DB < 0 {
		p.add("redis.db", "must not be negative")
	}
	if strings.ContainsAny(r.KeyPrefix, "{} \t\r\n") {
		p.add("redis.key_prefix", "%q must not contain braces or white space (braces would change the cluster hash tag)", r.KeyPrefix)
	}
	if r.Shards < 1 || r.Shards > 1024 {
		p.add("redis.shards", "%d is not between 1 and 1024", r.Shards)
	}
	positive(p, "redis.dial_timeout", int64(r.DialTimeout))
	positive(p, "redis.read_timeout", int64(r.ReadTimeout))
	positive(p, "redis.write_timeout", int64(r.WriteTimeout))
	if r.PoolSize < 0 {
		p.add("redis.pool_size", "must not be negative")
	}
	checkTLS(p, "redis.tls", r.TLS)
}

func (c *Config) validateScheduler(p *Problems) {
	s := &c.Scheduler
	if s.BatchSize < 1 || s.BatchSize > 10_000 {
		p.add("scheduler.batch_size", "%d is not between 1 and 10000", s.BatchSize)
	}
	positive(p, "scheduler.lease", int64(s.Lease))
	positive(p, "scheduler.max_sleep", int64(s.MaxSleep))
	positive(p, "scheduler.publish_timeout", int64(s.PublishTimeout))
	if s.PublishTimeout >= s.Lease {
		p.add("scheduler.publish_timeout", "%s must be shorter than scheduler.lease %s, or a slow publish would be taken over by another instance", s.PublishTimeout, s.Lease)
	}
	if s.LatePolicy != "deliver" && s.LatePolicy != "dead" {
		p.add("scheduler.late_policy", "%q is not one of deliver, dead", s.LatePolicy)
	}
	if s.MaxLateness < 0 {
		p.add("scheduler.max_lateness", "must not be negative")
	}
	if s.LatePolicy == "dead" && s.MaxLateness == 0 {
		p.add("scheduler.max_lateness", "late_policy dead needs a max_lateness")
	}
	if s.MaxAttempts < 1 {
		p.add("scheduler.max_attempts", "must be at least 1")
	}
	positive(p, "scheduler.backoff.initial", int64(s.Backoff.Initial))
	if s.Backoff.Max < s.Backoff.Initial {
		p.add("scheduler.backoff.max", "%s is less than backoff.initial %s", s.Backoff.Max, s.Backoff.Initial)
	}
	if s.Backoff.Multiplier < 1 {
		p.add("scheduler.backoff.multiplier", "%g must be at least 1", s.Backoff.Multiplier)
	}
	if s.Backoff.Jitter < 0 || s.Backoff.Jitter > 1 {
		p.add("scheduler.backoff.jitter", "%g is not between 0 and 1", s.Backoff.Jitter)
	}
}

func (c *Config) validateSink(p *Problems, i int, names map[string]bool) {
	s := &c.Sinks[i]
	at := fmt.Sprintf("sinks[%d]", i)
	checkName(p, at+".name", s.Name, names, "sink")
	kinds := 0
	if s.RabbitMQ != nil {
		kinds++
		checkURL(p, at+".rabbitmq.url", s.RabbitMQ.URL, "amqp", "amqps")
		checkRabbitAuth(p, at+".rabbitmq", s.RabbitMQ.RabbitMQAuth)
	}
	if k := s.Kafka; k != nil {
		kinds++
		checkBrokers(p, at+".kafka.brokers", k.Brokers)
		checkKafkaAuth(p, at+".kafka", k.KafkaAuth)
		positive(p, at+".kafka.batch_timeout", int64(k.BatchTimeout))
		if k.BatchSize < 1 {
			p.add(at+".kafka.batch_size", "must be at least 1")
		}
		switch k.Compression {
		case "none", "gzip", "snappy", "lz4", "zstd":
		default:
			p.add(at+".kafka.compression", "%q is not one of none, gzip, snappy, lz4, zstd", k.Compression)
		}
	}
	if s.NATS != nil {
		kinds++
		checkNATSURL(p, at+".nats.url", s.NATS.URL)
		checkNATSAuth(p, at+".nats", s.NATS.NATSAuth)
	}
	if kinds != 1 {
		p.add(at, "give exactly one of rabbitmq, kafka, nats (got %d)", kinds)
	}
}

func (c *Config) validateIngest(p *Problems, i int, names, sinks map[string]bool) {
	in := &c.Ingest[i]
	at := fmt.Sprintf("ingest[%d]", i)
	checkName(p, at+".name", in.Name, names, "ingest")
	kinds := 0
	if k := in.Kafka; k != nil {
		kinds++
		checkBrokers(p, at+".kafka.brokers", k.Brokers)
		checkKafkaAuth(p, at+".kafka", k.KafkaAuth)
		required(p, at+".kafka.topic", k.Topic)
		required(p, at+".kafka.group", k.Group)
		if k.StartOffset != "first" && k.StartOffset != "last" {
			p.add(at+".kafka.start_offset", "%q is not one of first, last", k.StartOffset)
		}
		if k.SessionTimeout.D() < time.Second {
			p.add(at+".kafka.session_timeout", "%s is less than 1s", k.SessionTimeout)
		}
		if k.MaxInFlightPerPartition < 1 {
			p.add(at+".kafka.max_in_flight_per_partition", "must be at least 1")
		}
		positive(p, at+".kafka.commit_interval", int64(k.CommitInterval))
	}
	if r := in.RabbitMQ; r != nil {
		kinds++
		checkURL(p, at+".rabbitmq.url", r.URL, "amqp", "amqps")
		checkRabbitAuth(p, at+".rabbitmq", r.RabbitMQAuth)
		required(p, at+".rabbitmq.queue", r.Queue)
		if r.Prefetch < 1 || r.Prefetch > 65535 {
			p.add(at+".rabbitmq.prefetch", "%d is not between 1 and 65535", r.Prefetch)
		}
	}
	if n := in.NATS; n != nil {
		kinds++
		checkNATSURL(p, at+".nats.url", n.URL)
		checkNATSAuth(p, at+".nats", n.NATSAuth)
		required(p, at+".nats.subject", n.Subject)
		if n.Stream == "" && n.Durable != "" {
			p.add(at+".nats.durable", "a durable consumer needs a JetStream stream (nats.stream)")
		}
		if strings.ContainsAny(n.Durable, ".*> \t") {
			p.add(at+".nats.durable", "%q must not contain '.', '*', '>' or white space", n.Durable)
		}
	}
	if kinds != 1 {
		p.add(at, "give exactly one of kafka, rabbitmq, nats (got %d)", kinds)
	}
	if in.MaxInFlight < 1 {
		p.add(at+".max_in_flight", "must be at least 1")
	}
	r := &in.Route
	switch {
	case r.Sink == "":
		p.add(at+".route.sink", "required: the name of one of sinks")
	case !sinks[r.Sink]:
		p.add(at+".route.sink", "%q names no sink in sinks", r.Sink)
	}
	required(p, at+".route.destination", r.Destination)
	if (len(r.AllowedSinks) > 0 || len(r.AllowedDestinations) > 0) && !r.AllowOverride {
		p.add(at+".route.allow_override", "allowed_sinks/allowed_destinations restrict overrides; set allow_override: true to allow them")
	}
	for j, s := range r.AllowedSinks {
		if !sinks[s] {
			p.add(fmt.Sprintf("%s.route.allowed_sinks[%d]", at, j), "%q names no sink in sinks", s)
		}
	}
	for j, d := range r.AllowedDestinations {
		if _, err := path.Match(d, ""); err != nil {
			p.add(fmt.Sprintf("%s.route.allowed_destinations[%d]", at, j), "%q is not a valid pattern: %v", d, err)
		}
	}
	if r.DefaultDelay != nil && *r.DefaultDelay < 0 {
		p.add(at+".route.default_delay", "must not be negative")
	}
	if r.DefaultDelay != nil && *r.DefaultDelay > c.Limits.MaxDelay {
		p.add(at+".route.default_delay", "%s is over limits.max_delay %s", r.DefaultDelay, c.Limits.MaxDelay)
	}
}

// encryptionKeyID is what a key ID may be: it is stored with every message.
var encryptionKeyID = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

func (e *Encryption) validate(p *Problems) {
	if len(e.Keys) == 0 {
		p.add("encryption.keys", "at least one key is required (or remove encryption: to store messages in clear)")
	}
	ids := map[string]bool{}
	for i, k := range e.Keys {
		at := fmt.Sprintf("encryption.keys[%d]", i)
		switch {
		case k.ID == "":
			p.add(at+".id", "required: a name stored with every message the key seals, e.g. k1")
		case !encryptionKeyID.MatchString(k.ID):
			p.add(at+".id", "%q must be 1 to 64 letters, digits, '.', '_' or '-'", k.ID)
		case ids[k.ID]:
			p.add(at+".id", "%q is used by another key", k.ID)
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
			p.add(at+".key", "required: 32 random bytes in standard base64 (openssl rand -base64 32), or key_file")
		case err != nil:
			p.add(field, "not valid standard base64 (make a key with: openssl rand -base64 32)")
		case len(raw) != 32:
			p.add(field, "decodes to %d bytes; AES-256 needs 32 (make a key with: openssl rand -base64 32)", len(raw))
		}
	}
	switch {
	case e.ActiveKey == "":
		p.add("encryption.active_key", "required: the id of the key that seals new messages")
	case !ids[e.ActiveKey]:
		p.add("encryption.active_key", "%q is not the id of a key in encryption.keys", e.ActiveKey)
	}
}

func checkName(p *Problems, at, name string, seen map[string]bool, what string) {
	switch {
	case name == "":
		p.add(at, "required: a unique %s name", what)
	case seen[name]:
		p.add(at, "%q is used by another %s", name, what)
	case strings.ContainsAny(name, " \t\r\n/"):
		p.add(at, "%q must not contain white space or '/'", name)
	}
	seen[name] = true
}

func required(p *Problems, at, v string) {
	if strings.TrimSpace(v) == "" {
		p.add(at, "required")
	}
}

func positive(p *Problems, at string, v int64) {
	if v <= 0 {
		p.add(at, "must be positive")
	}
}

func checkHostPort(p *Problems, at, v string) {
	if _, _, err := net.SplitHostPort(v); err != nil {
		p.add(at, "%q is not host:port", v)
	}
}

func checkBrokers(p *Problems, at string, brokers []string) {
	if len(brokers) == 0 {
		p.add(at, "at least one broker is required")
	}
	for j, b := range brokers {
		checkHostPort(p, fmt.Sprintf("%s[%d]", at, j), b)
	}
}

func checkURL(p *Problems, at, v string, schemes ...string) {
	if v == "" {
		p.add(at, "required")
		return
	}
	u, err := url.Parse(v)
	if err != nil {
		// url.Error quotes the URL, password included, and its inner error a piece of it.
		p.add(at, "not a URL (a reserved character in the user or password, such as / # ? @ %%, must be percent-encoded)")
		return
	}
	for _, s := range schemes {
		if u.Scheme == s {
			return
		}
	}
	p.add(at, "scheme %q is not one of %s", u.Scheme, strings.Join(schemes, ", "))
}

// checkNATSURL accepts nats.go's comma-separated server list.
func checkNATSURL(p *Problems, at, v string) {
	if v == "" {
		p.add(at, "required")
		return
	}
	for _, one := range strings.Split(v, ",") {
		checkURL(p, at, strings.TrimSpace(one), "nats", "tls", "ws", "wss")
	}
}

func checkTLS(p *Problems, at string, t TLS) {
	if !t.Enabled && (t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != "" || t.InsecureSkipVerify) {
		p.add(at+".enabled", "TLS settings are given but enabled is false; set enabled: true")
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		p.add(at, "give both cert_file and key_file for a client certificate")
	}
}

func checkKafkaAuth(p *Problems, at string, a KafkaAuth) {
	checkTLS(p, at+".tls", a.TLS)
	s := a.SASL
	switch s.Mechanism {
	case "":
		if s.Username != "" || s.Password != "" {
			p.add(at+".sasl.mechanism", "required with a username or password: plain, scram-sha-256 or scram-sha-512")
		}
	case "plain", "scram-sha-256", "scram-sha-512":
		required(p, at+".sasl.username", s.Username)
		if s.Password == "" {
			p.add(at+".sasl.password", "required (or password_file)")
		}
	default:
		p.add(at+".sasl.mechanism", "%q is not one of plain, scram-sha-256, scram-sha-512", s.Mechanism)
	}
}

func checkRabbitAuth(p *Problems, at string, a RabbitMQAuth) {
	checkTLS(p, at+".tls", a.TLS)
	if a.Password != "" && a.Username == "" {
		p.add(at+".username", "required with a password")
	}
	if a.External && (a.TLS.CertFile == "" || !a.TLS.Enabled) {
		p.add(at+".external", "SASL EXTERNAL authenticates with the TLS client certificate: set tls.enabled, tls.cert_file and tls.key_file")
	}
	if a.External && a.Username != "" {
		p.add(at+".username", "not used with external: true (the certificate is the identity)")
	}
}

func checkNATSAuth(p *Problems, at string, a NATSAuth) {
	checkTLS(p, at+".tls", a.TLS)
	methods := 0
	if a.User != "" || a.Password != "" {
		methods++
		if a.User == "" {
			p.add(at+".user", "required with a password")
		}
	}
	for _, set := range []bool{a.Token != "", a.NKeySeedFile != "", a.CredsFile != ""} {
		if set {
			methods++
		}
	}
	if methods > 1 {
		p.add(at, "give one way to authenticate: user/password, token, nkey_seed_file or creds_file")
	}
}
