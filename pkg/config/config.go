// Package config loads and validates delaybridge's YAML configuration.
//
// Load expands ${VAR} (and ${VAR:-default}) in every value from the
// environment, rejects unknown keys, applies defaults and validates the
// result; every problem is reported with its field path, an entry of a list
// with its name, e.g. "ingest[0].kafka.brokers (orders-in): at least one
// broker is required", and a misspelt key with the key it likely meant.
// config.example.yaml documents every key.
package config

import (
	"time"
)

// Config is the whole file.
type Config struct {
	Redis     Redis     `yaml:"redis"`
	Admin     Admin     `yaml:"admin"`
	Log       Log       `yaml:"log"`
	Tracing   Tracing   `yaml:"tracing"`
	Scheduler Scheduler `yaml:"scheduler"`
	Limits    Limits    `yaml:"limits"`
	Dead      Dead      `yaml:"dead"`
	// Ingest lists where delayed messages come from; none is valid (a
	// deployment that only fires what is parked).
	Ingest []Ingest `yaml:"ingest"`
	// Sinks lists where due messages are published; at least one.
	Sinks []Sink `yaml:"sinks"`

	// Encryption, when present, encrypts parked messages in Redis.
	Encryption *Encryption `yaml:"encryption"`

	// ShutdownTimeout bounds a graceful stop: finishing in-flight parks
	// and publishes and committing offsets.
	ShutdownTimeout Duration `yaml:"shutdown_timeout"`

	// unread holds, while Parse validates, the paths of the values that
	// could not be read (see Parse).
	unread map[string]bool
}

// Redis is where messages are parked.
type Redis struct {
	// Addr is a single Redis, host:port: required unless addrs (Cluster)
	// or sentinel_addrs (Sentinel) is given.
	Addr    string   `yaml:"addr"`
	Addrs   []string `yaml:"addrs"`   // Redis Cluster seed nodes (with cluster: true)
	Cluster bool     `yaml:"cluster"` // use Redis Cluster
	// SentinelAddrs are the sentinels of a Redis replicated with Sentinel
	// (with master_name, instead of addr): the client asks them for the
	// current master and follows failovers.
	SentinelAddrs        []string `yaml:"sentinel_addrs"`
	MasterName           string   `yaml:"master_name"`            // the master the sentinels monitor
	SentinelPassword     Secret   `yaml:"sentinel_password"`      // the sentinels' own password, if any
	SentinelPasswordFile string   `yaml:"sentinel_password_file"` // or read from this file
	Username             string   `yaml:"username"`               // Redis 6+ ACL user
	Password             Secret   `yaml:"password"`               // Redis password (AUTH)
	PasswordFile         string   `yaml:"password_file"`          // or read from this file
	DB                   int      `yaml:"db"`                     // database number; not with cluster: true
	TLS                  TLS      `yaml:"tls"`                    // TLS to Redis

	KeyPrefix string `yaml:"key_prefix"` // every key starts with it
	// Shards is the number of shards (sorted sets) messages are spread
	// over: recorded in Redis on first start, fixed once messages are
	// parked (export and import change it).
	Shards int `yaml:"shards"`

	DialTimeout  Duration `yaml:"dial_timeout"`  // to connect
	ReadTimeout  Duration `yaml:"read_timeout"`  // for a reply
	WriteTimeout Duration `yaml:"write_timeout"` // for a command to be written
	PoolSize     int      `yaml:"pool_size"`     // connections per node; 0: go-redis's default, 10 per CPU
	// StartTimeout is how long a start waits for a Redis that does not
	// answer, or says it cannot serve yet (a failover, a restart loading
	// its data), before it fails; 0 fails at once.
	StartTimeout *Duration `yaml:"start_timeout"`
}

// Admin is the HTTP API.
type Admin struct {
	Listen    string    `yaml:"listen"`     // host:port; "" disables the admin server
	Token     Secret    `yaml:"token"`      // when set, /v1/ needs "Authorization: Bearer <token>"
	TokenFile string    `yaml:"token_file"` // or read the token from this file
	TLS       ServerTLS `yaml:"tls"`        // serve HTTPS
	// Pprof serves Go's runtime profiles under /debug/pprof/ (behind the
	// token, which it requires): off by default.
	Pprof bool `yaml:"pprof"`
	// AllowedHosts are the host names (or IP addresses) a request's Host
	// header may name, against DNS rebinding. Empty: when listen is on
	// loopback, its host, localhost, 127.0.0.1 and ::1; otherwise any.
	AllowedHosts []string `yaml:"allowed_hosts"`
}

// TLS configures a client connection's TLS. With only enabled: true the
// system's roots verify the server.
type TLS struct {
	Enabled    bool   `yaml:"enabled"`     // TLS on; the other keys need it
	CAFile     string `yaml:"ca_file"`     // PEM roots to verify the server with
	CertFile   string `yaml:"cert_file"`   // client certificate (PEM), for mutual TLS
	KeyFile    string `yaml:"key_file"`    // its key (PEM)
	ServerName string `yaml:"server_name"` // expected name in the server's certificate
	// InsecureSkipVerify accepts any server certificate: only for tests,
	// and never by default.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// ServerTLS is the admin server's certificate.
type ServerTLS struct {
	CertFile string `yaml:"cert_file"` // the server certificate (PEM), chain included
	KeyFile  string `yaml:"key_file"`  // its key (PEM)
}

// Log configures log/slog output on stderr.
type Log struct {
	Level  string `yaml:"level"`  // debug, info, warn, error
	Format string `yaml:"format"` // text or json
	// RepeatInterval is how often at most a line that repeats is logged
	// for one sink and destination (a failed publish, a dead message), for
	// one ingest and reason (a message rejected at ingest), for one ingest
	// (an ack its broker did not take), for one shard and kind of work (a
	// claim or commit Redis refused), and for one method and status (a
	// failed admin request): the first
	// is logged, the repeats within the interval are counted, and the
	// count is logged with the next line or, when none comes, as a line of
	// its own once the interval ended. A sink has at most 16 lines of a
	// kind per interval, whatever their destinations.
	RepeatInterval Duration `yaml:"repeat_interval"`
}

// Tracing configures OpenTelemetry spans for park and fire, exported over
// OTLP/HTTP as the standard OTEL_EXPORTER_OTLP_* variables say.
type Tracing struct {
	Enabled     bool     `yaml:"enabled"`      // spans delaybridge.park and delaybridge.fire, continuing the W3C traceparent
	SampleRatio *float64 `yaml:"sample_ratio"` // of new traces (default 1); sampled parents are followed
}

// Scheduler configures how due messages are claimed and published.
type Scheduler struct {
	// BatchSize is the most messages one claim takes from one shard.
	BatchSize int `yaml:"batch_size"`
	// Lease is how long a claimed message is held before any instance may
	// take it again; it bounds failover time after a crash.
	Lease Duration `yaml:"lease"`
	// LeaseMargin is how much of its lease a claimed message must have
	// left, by the instance's monotonic clock, for its publish to start
	// (each message of a batch a sink sends one at a time: none is begun
	// past it); past that it is put back and claimed again first, so that a process
	// paused past its lease publishes nothing that was cancelled or taken
	// over meanwhile. Unset: a fifth of the lease.
	LeaseMargin Duration `yaml:"lease_margin"`
	// MaxSleep bounds how long a shard sleeps without looking at Redis, so
	// that messages parked by other instances are seen.
	MaxSleep Duration `yaml:"max_sleep"`
	// PublishTimeout bounds one publish attempt; it must be shorter than
	// Lease.
	PublishTimeout Duration `yaml:"publish_timeout"`
	// MaxAttempts is how many publishes are tried before a message is dead.
	MaxAttempts int     `yaml:"max_attempts"`
	Backoff     Backoff `yaml:"backoff"`
	// LatePolicy says what happens to a message claimed more than
	// MaxLateness after its due time (after a long outage): "deliver"
	// (default: publish it anyway) or "dead" (keep it as dead, reason
	// "late"). MaxLateness 0 means no limit.
	LatePolicy  string   `yaml:"late_policy"`
	MaxLateness Duration `yaml:"max_lateness"`
	// DedupeWindow is how long a delivered message's ID (with where its
	// broker message was read) is remembered, so that a re-read of it (an
	// ingest redelivery after a crash or a rebalance) is acknowledged
	// without parking it again. Unset: 2m; 0 turns it off; at least the
	// lease.
	DedupeWindow *Duration `yaml:"dedupe_window"`
	// FireAhead is how far ahead of their due time messages are claimed
	// (found, read and decoded), to be published at the due instant after
	// a commit just before it that lets whatever came first (a cancel,
	// replace, reschedule or pause) win. Unset: 100ms; 0 claims only what
	// is due; less than half the lease.
	FireAhead *Duration `yaml:"fire_ahead"`
}

// Backoff is the exponential back-off between publish attempts:
// initial * multiplier^(attempt-1), capped at max, randomised by ±jitter (never past max).
type Backoff struct {
	Initial    Duration `yaml:"initial"`    // the wait after the first failed attempt
	Max        Duration `yaml:"max"`        // the longest wait
	Multiplier float64  `yaml:"multiplier"` // each wait is this many times the one before
	Jitter     float64  `yaml:"jitter"`     // 0..1, fraction of the delay
}

// Limits protect the service from oversized or far-future messages.
type Limits struct {
	MaxDelay Duration `yaml:"max_delay"` // a due time further than this from now is rejected
	// MaxPayloadBytes is the largest body: a larger one is rejected (dead
	// without its body); so is, by a daemon and kept whole, one its sink's
	// broker cannot take with its headers (a Kafka sink's
	// max_message_bytes, a NATS server's max_payload).
	MaxPayloadBytes int `yaml:"max_payload_bytes"`
	MaxHeaderBytes  int `yaml:"max_header_bytes"` // the sum of the headers' key and value sizes
	MaxIDBytes      int `yaml:"max_id_bytes"`     // the longest message ID (and group key)
	// MaxParkedMessages and MaxRedisMemory protect Redis: when the parked
	// messages or Redis's used memory reach them, ingest pauses (nothing is
	// read or acknowledged) until firing brings them down again. 0: no limit.
	MaxParkedMessages int64 `yaml:"max_parked_messages"`
	MaxRedisMemory    int64 `yaml:"max_redis_memory"` // bytes, INFO memory used_memory
	// MaxSeries bounds the live recurring series of the whole store; past
	// it a new series is rejected with the reason.
	MaxSeries int64 `yaml:"max_series"`
	// MinInterval is the shortest time between two occurrences of a
	// recurring message (x-delay-every, and the closest occurrences of an
	// x-delay-cron); a shorter schedule is rejected with the reason.
	MinInterval Duration `yaml:"min_interval"`
	// MaxDead bounds the dead messages each source keeps: every ingest,
	// and the admin API as one more. Beyond it the source's oldest are
	// deleted, within a second; the other sources keep theirs. 0: no bound
	// of its own (dead.max_messages bounds them all).
	MaxDead int `yaml:"max_dead"`
}

// Dead configures what is kept of messages that are rejected or undeliverable.
type Dead struct {
	// MaxMessages is how many dead messages are kept, spread evenly over
	// the shards; beyond its share a shard deletes the oldest of the source
	// (an ingest, or the admin API) that holds the most there, so that one
	// publisher's dead messages push out only its own while it holds more.
	MaxMessages int `yaml:"max_messages"`
	// Sink and Destination, when set, also publish every message that
	// becomes dead there (best effort; it is kept in Redis either way),
	// with the header x-delaybridge-dead-reason.
	Sink        string `yaml:"sink"`
	Destination string `yaml:"destination"` // where in dead.sink (with dead.sink)
}

// Encryption seals the key, headers and body of every parked and dead
// message in Redis with AES-256-GCM (pkg/seal); the routing fields (due
// time, priority, sink, destination and ingest names) stay readable. New
// messages use ActiveKey; a message sealed with any key of Keys opens, so a
// key is rotated by adding the new one everywhere, then making it active,
// running `delaybridge reencrypt`, and removing the old one (see pkg/seal).
type Encryption struct {
	ActiveKey string          `yaml:"active_key"` // the id of the key that seals new messages
	Keys      []EncryptionKey `yaml:"keys"`       // every key that may have sealed a stored message
	// RequireSealed refuses messages found in clear in Redis (they go dead
	// with the reason): turn it on once `delaybridge reencrypt` has sealed
	// what was parked before encryption, so that write access to Redis is
	// not enough to inject a message or strip one's sealing.
	RequireSealed bool `yaml:"require_sealed"`
}

// EncryptionKey is one AES-256 key: 32 bytes in standard base64, in Key or
// in the file KeyFile.
type EncryptionKey struct {
	// ID is stored with every message the key seals: never reuse an ID for
	// another key.
	ID      string `yaml:"id"`
	Key     Secret `yaml:"key"`      // 32 random bytes in standard base64 (openssl rand -base64 32)
	KeyFile string `yaml:"key_file"` // or read the key from this file
}

// Ingest reads delayed messages from one broker source.
type Ingest struct {
	Name  string `yaml:"name"`  // unique; names the ingest in metrics, logs, send --ingest and the messages' ingest
	Route Route  `yaml:"route"` // where its messages go

	// MaxInFlight caps messages read but not yet parked and acknowledged;
	// reading pauses at the cap.
	MaxInFlight int `yaml:"max_in_flight"`

	// MaxParked bounds this ingest's messages live in the store (parked,
	// in flight or held; 0: no bound of its own): at it, this ingest parks
	// nothing more until its messages fire (cancels still go through: those
	// read within max_in_flight of the waiting messages; one further back
	// in the topic, queue or stream waits its turn) while the other ingests
	// go on; limits.max_parked_messages bounds them all.
	MaxParked int64 `yaml:"max_parked"`
	// MaxSeries bounds this ingest's live recurring series (0: no bound of
	// its own): past it a new series is dead with reason max_series;
	// limits.max_series bounds them all.
	MaxSeries int64 `yaml:"max_series"`

	// Dialects are the header dialects the ingest reads (default
	// [delaybridge]): delaybridge, kafka-scheduler (Kafka ingests only).
	Dialects []string `yaml:"dialects"`

	// Broker is the block under the broker's key (kafka:, rabbitmq:,
	// nats:), defined by that broker's package (pkg/brokers).
	Broker IngestBroker `yaml:"-"`

	brokerKeys int // broker keys in the YAML mapping (one is right)
}

// Kind returns the broker's key ("kafka", "rabbitmq", "nats"), or "" when
// no broker is given.
func (i *Ingest) Kind() string {
	if i.Broker == nil {
		return ""
	}
	return i.Broker.Kind()
}

// Route says where an ingest's messages go.
type Route struct {
	Sink string `yaml:"sink"` // the name of the sink the messages go to (required)
	// Destination is the Kafka topic, NATS subject or AMQP routing key in
	// that sink (required). It may hold placeholders expanded per message:
	// {source}, {source.N}, {source.N:}, {header.NAME}.
	Destination string `yaml:"destination"`
	// AllowOverride lets x-delay-sink / x-delay-destination choose another
	// sink or destination, limited to allowed_sinks and
	// allowed_destinations when given.
	AllowOverride bool     `yaml:"allow_override"`
	AllowedSinks  []string `yaml:"allowed_sinks"` // the sinks x-delay-sink may name (empty: any)
	// AllowedDestinations are the destinations a publisher may reach, as
	// patterns in the sink broker's wildcards (NATS * and >, RabbitMQ * and
	// #, Kafka *). Empty with a destination a publisher chooses: warned
	// about by validate and at start.
	AllowedDestinations []string `yaml:"allowed_destinations"`
	// DefaultDelay applies to messages with neither x-delay nor
	// x-deliver-at; without it they are rejected.
	DefaultDelay *Duration `yaml:"default_delay"`
	// Missed is what a recurring message does with the occurrences missed
	// while nothing fired: once (default: one occurrence for them all),
	// all, or skip.
	Missed string `yaml:"missed"`
	// MissedMax bounds the occurrences missed: all publishes: the most
	// recent ones.
	MissedMax int `yaml:"missed_max"`
	// Recurring false refuses recurring messages (x-delay-every,
	// x-delay-cron): dead, with the reason. Default true.
	Recurring *bool `yaml:"recurring"`
}

// Sink publishes due messages to one broker.
type Sink struct {
	Name string `yaml:"name"` // unique; what routes, x-delay-sink and the API name it by
	// MaxRate throttles what is released to the sink, in messages per
	// second shared by every instance (0: no limit).
	MaxRate float64 `yaml:"max_rate"`

	// Broker is the block under the broker's key (rabbitmq:, kafka:,
	// nats:), defined by that broker's package (pkg/brokers).
	Broker SinkBroker `yaml:"-"`

	brokerKeys int
}

// Kind returns the broker's key ("kafka", "rabbitmq", "nats"), or "" when
// no broker is given.
func (s *Sink) Kind() string {
	if s.Broker == nil {
		return ""
	}
	return s.Broker.Kind()
}

// Duration is a time.Duration written as a Go duration string ("30s").
type Duration time.Duration

// D returns the time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// String formats like time.Duration.
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalYAML writes the duration string.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }
