package kafkabroker

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/destination"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ingest"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// Kind is the key of a Kafka block in the configuration.
const Kind = "kafka"

// Broker is Kafka's entry in the broker registry (pkg/brokers).
var Broker = config.Broker{
	Kind:      Kind,
	NewIngest: func() config.IngestBroker { return new(IngestConfig) },
	NewSink:   func() config.SinkBroker { return new(SinkConfig) },
}

// Defaults of the Kafka blocks, as config.example.yaml documents them.
const (
	DefaultStartOffset             = "first"
	DefaultSessionTimeout          = 10 * time.Second
	DefaultMaxInFlightPerPartition = 1000
	DefaultCommitInterval          = 100 * time.Millisecond
	DefaultBatchTimeout            = time.Millisecond
	DefaultBatchSize               = 1000
	DefaultCompression             = "none"
	DefaultMaxMessageBytes         = 1 << 20
)

// IngestConfig is an ingest's kafka: block: a topic consumed by a consumer
// group.
type IngestConfig struct {
	Auth    `yaml:",inline"`
	Brokers []string `yaml:"brokers"`
	Topic   string   `yaml:"topic"`
	Group   string   `yaml:"group"`
	// StartOffset is where a group without a committed offset starts:
	// "first" (default) or "last".
	StartOffset string `yaml:"start_offset"`
	// SessionTimeout is how long the group waits for a silent member
	// before giving its partitions to another (default 10s).
	SessionTimeout config.Duration `yaml:"session_timeout"`
	// MaxInFlightPerPartition caps records of one partition read but not
	// yet parked; fetching pauses at the cap (default 1000).
	MaxInFlightPerPartition int `yaml:"max_in_flight_per_partition"`
	// CommitInterval is how often finished offsets are committed (default
	// 100ms); they are always committed on shutdown and on rebalance.
	CommitInterval config.Duration `yaml:"commit_interval"`
}

// SinkConfig is a sink's kafka: block; the destination is the topic, which must exist: the sink creates none, whatever the brokers' auto.create.topics.enable (a missing topic is an attempt, not_found).
type SinkConfig struct {
	Auth    `yaml:",inline"`
	Brokers []string `yaml:"brokers"`
	// BatchTimeout is how long a partial batch waits for more messages
	// (default 1ms: a single due message goes out at once).
	BatchTimeout config.Duration `yaml:"batch_timeout"`
	// BatchSize is the most messages per produce request (default 1000).
	BatchSize int `yaml:"batch_size"`
	// Compression: none (default), gzip, snappy, lz4, zstd.
	Compression string `yaml:"compression"`
	// MaxMessageBytes is the largest record the sink sends, key, value and
	// headers with their framing, and the largest batch of records (default
	// 1048576, just under Kafka's default max.message.bytes); a larger
	// message is refused as it comes (payload_too_large), or dead as too
	// large if it was parked before. Raise it with limits.max_payload_bytes,
	// and the max.message.bytes of every topic the sink writes to (or the
	// brokers' message.max.bytes) with it: a topic refuses a batch over its
	// own, which then goes one record at a time.
	MaxMessageBytes int `yaml:"max_message_bytes"`
}

// Auth is how a Kafka client authenticates: TLS and/or SASL.
type Auth struct {
	TLS  config.TLS `yaml:"tls"`
	SASL SASL       `yaml:"sasl"`
}

// SASL is SASL authentication to Kafka.
type SASL struct {
	// Mechanism: "" (none), "plain", "scram-sha-256", "scram-sha-512".
	// PLAIN sends the password in clear: use it with TLS.
	Mechanism    string        `yaml:"mechanism"`
	Username     string        `yaml:"username"`
	Password     config.Secret `yaml:"password"`
	PasswordFile string        `yaml:"password_file"`
}

// Kind returns "kafka".
func (*IngestConfig) Kind() string { return Kind }

// ApplyDefaults fills the unset fields.
func (c *IngestConfig) ApplyDefaults(*config.Ingest) {
	config.Default(&c.StartOffset, DefaultStartOffset)
	config.Default(&c.SessionTimeout, config.Duration(DefaultSessionTimeout))
	config.Default(&c.MaxInFlightPerPartition, DefaultMaxInFlightPerPartition)
	config.Default(&c.CommitInterval, config.Duration(DefaultCommitInterval))
}

// Validate checks the block.
func (c *IngestConfig) Validate(_ *config.Ingest, at string, p *config.Problems) {
	checkBrokers(p, at+".brokers", c.Brokers)
	c.Auth.validate(p, at)
	p.Required(at+".topic", c.Topic)
	p.Required(at+".group", c.Group)
	if c.StartOffset != "first" && c.StartOffset != "last" {
		p.Add(at+".start_offset", "%q is not one of first, last", c.StartOffset)
	}
	if c.SessionTimeout.D() < time.Second {
		p.Add(at+".session_timeout", "%s is less than 1s", c.SessionTimeout)
	}
	if c.MaxInFlightPerPartition < 1 {
		p.Add(at+".max_in_flight_per_partition", "must be at least 1")
	}
	p.Positive(at+".commit_interval", int64(c.CommitInterval))
}

// Dialects returns the contract's own (delaybridge), and kafka-scheduler,
// which reads the record key and tombstones.
func (*IngestConfig) Dialects() []envelope.Dialect {
	return []envelope.Dialect{envelope.DialectDelaybridge, envelope.DialectKafkaScheduler}
}

// Consumes returns the topic the ingest reads, on a Kafka sink: a message
// published there would be ingested again.
func (c *IngestConfig) Consumes(sink config.SinkBroker) []destination.Reserved {
	if _, ok := sink.(*SinkConfig); !ok || c.Topic == "" {
		return nil
	}
	return []destination.Reserved{Destinations.Consumed(c.Topic)}
}

// params translates the block into the Source's parameters.
func (c *IngestConfig) params(in *config.Ingest) (SourceParams, error) {
	tlsCfg, mech, err := ClientAuth(c.Auth)
	if err != nil {
		return SourceParams{}, err
	}
	return SourceParams{
		Name: in.Name, Brokers: c.Brokers, Topic: c.Topic, Group: c.Group, StartOffset: c.StartOffset,
		SessionTimeout: c.SessionTimeout.D(), MaxInFlightPerPartition: c.MaxInFlightPerPartition,
		CommitInterval: c.CommitInterval.D(), TLS: tlsCfg, SASL: mech,
	}, nil
}

// Open connects the ingest's Source.
func (c *IngestConfig) Open(ctx context.Context, in *config.Ingest, log *slog.Logger) (ingest.Source, error) {
	p, err := c.params(in)
	if err != nil {
		return nil, err
	}
	return NewSource(ctx, p, log)
}

// Send produces p to the ingest's topic, as a publisher would, and returns
// the record's timestamp.
func (c *IngestConfig) Send(ctx context.Context, in *config.Ingest, pub ingest.Publication) (time.Time, error) {
	p, err := c.params(in)
	if err != nil {
		return time.Time{}, err
	}
	return Send(ctx, p, pub)
}

// Kind returns "kafka".
func (*SinkConfig) Kind() string { return Kind }

// Destinations returns Destinations: the syntax of what the sink publishes to.
func (*SinkConfig) Destinations() destination.Syntax { return Destinations }

// Opens says what a route that lets publishers choose any topic opens.
func (*SinkConfig) Opens(name string) string {
	return fmt.Sprintf("sink %s writes to any topic its Kafka user may write to (the reserved topics stay refused: docs/security.md)", name)
}

// ApplyDefaults fills the unset fields.
func (c *SinkConfig) ApplyDefaults() {
	config.Default(&c.BatchTimeout, config.Duration(DefaultBatchTimeout))
	config.Default(&c.BatchSize, DefaultBatchSize)
	config.Default(&c.Compression, DefaultCompression)
	config.Default(&c.MaxMessageBytes, DefaultMaxMessageBytes)
}

// maxMessageBytesMin and Max bound sinks[].kafka.max_message_bytes: room
// for a record's framing and headers, and what a broker takes in one
// request by default (socket.request.max.bytes, 100 MiB).
const (
	maxMessageBytesMin = 1 << 10
	maxMessageBytesMax = 100 << 20
)

// Validate checks the block.
func (c *SinkConfig) Validate(at string, p *config.Problems) {
	if c.MaxMessageBytes < maxMessageBytesMin || c.MaxMessageBytes > maxMessageBytesMax {
		p.Add(at+".max_message_bytes", "%d is not between %d and %d", c.MaxMessageBytes, maxMessageBytesMin, maxMessageBytesMax)
	}
	checkBrokers(p, at+".brokers", c.Brokers)
	c.Auth.validate(p, at)
	p.Positive(at+".batch_timeout", int64(c.BatchTimeout))
	if c.BatchSize < 1 {
		p.Add(at+".batch_size", "must be at least 1")
	}
	switch c.Compression {
	case "none", "gzip", "snappy", "lz4", "zstd":
	default:
		p.Add(at+".compression", "%q is not one of none, gzip, snappy, lz4, zstd", c.Compression)
	}
}

// Open connects the sink and warms it (Sink.Warm).
func (c *SinkConfig) Open(ctx context.Context, name string, log *slog.Logger) (sinks.Sink, error) {
	tlsCfg, mech, err := ClientAuth(c.Auth)
	if err != nil {
		return nil, err
	}
	s, err := NewSink(SinkParams{Name: name, Brokers: c.Brokers, BatchTimeout: c.BatchTimeout.D(),
		BatchSize: c.BatchSize, Compression: c.Compression, MaxMessageBytes: c.MaxMessageBytes, TLS: tlsCfg, SASL: mech}, log)
	if err == nil {
		s.Warm(ctx)
	}
	return s, err
}

func checkBrokers(p *config.Problems, at string, brokers []string) {
	if len(brokers) == 0 {
		p.Add(at, "at least one broker is required")
	}
	for j, b := range brokers {
		p.HostPort(fmt.Sprintf("%s[%d]", at, j), b)
	}
}

func (a Auth) validate(p *config.Problems, at string) {
	p.TLS(at+".tls", a.TLS)
	s := a.SASL
	switch s.Mechanism {
	case "":
		if s.Username != "" || s.Password != "" {
			p.Add(at+".sasl.mechanism", "required with a username or password: plain, scram-sha-256 or scram-sha-512")
		}
	case "plain", "scram-sha-256", "scram-sha-512":
		p.Required(at+".sasl.username", s.Username)
		if s.Password == "" {
			p.Add(at+".sasl.password", "required (or password_file)")
		}
	default:
		p.Add(at+".sasl.mechanism", "%q is not one of plain, scram-sha-256, scram-sha-512", s.Mechanism)
	}
}
