package natsbroker

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/destination"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ingest"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// Kind is the key of a NATS block in the configuration.
const Kind = "nats"

// Broker is NATS's entry in the broker registry (pkg/brokers).
var Broker = config.Broker{
	Kind:      Kind,
	NewIngest: func() config.IngestBroker { return new(IngestConfig) },
	NewSink:   func() config.SinkBroker { return new(SinkConfig) },
}

// DefaultAckWait is the JetStream redelivery timeout of an ingest.
const DefaultAckWait = 30 * time.Second

// IngestConfig is an ingest's nats: block. It consumes a JetStream stream
// with a durable pull consumer, or a core NATS subject (at most once) when
// Stream is empty.
type IngestConfig struct {
	Auth    `yaml:",inline"`
	URL     string          `yaml:"url"`
	Subject string          `yaml:"subject"`
	Stream  string          `yaml:"stream"`
	Durable string          `yaml:"durable"`
	AckWait config.Duration `yaml:"ack_wait"`
}

// SinkConfig is a sink's nats: block; the destination is the subject.
type SinkConfig struct {
	Auth `yaml:",inline"`
	URL  string `yaml:"url"`
	// JetStream waits for the stream's PubAck; without it a core NATS
	// publish has no confirmation (at most once on the sink side).
	JetStream bool `yaml:"jetstream"`
}

// Auth is how a NATS client authenticates: at most one of user and
// password, token, nkey seed file, or credentials (.creds) file; TLS
// independently.
type Auth struct {
	TLS          config.TLS    `yaml:"tls"`
	User         string        `yaml:"user"`
	Password     config.Secret `yaml:"password"`
	PasswordFile string        `yaml:"password_file"`
	Token        config.Secret `yaml:"token"`
	TokenFile    string        `yaml:"token_file"`
	NKeySeedFile string        `yaml:"nkey_seed_file"`
	CredsFile    string        `yaml:"creds_file"`
}

// Kind returns "nats".
func (*IngestConfig) Kind() string { return Kind }

// ApplyDefaults names the durable consumer after the ingest and sets the
// ack wait, for JetStream.
func (c *IngestConfig) ApplyDefaults(in *config.Ingest) {
	if c.Stream != "" {
		config.Default(&c.Durable, durableName(in.Name))
		config.Default(&c.AckWait, config.Duration(DefaultAckWait))
	}
}

// Validate checks the block.
func (c *IngestConfig) Validate(_ *config.Ingest, at string, p *config.Problems) {
	checkURL(p, at+".url", c.URL)
	c.Auth.validate(p, at)
	p.Required(at+".subject", c.Subject)
	if c.Stream == "" && c.Durable != "" {
		p.Add(at+".durable", "a durable consumer needs a JetStream stream (nats.stream)")
	}
	if c.Stream != "" {
		p.Positive(at+".ack_wait", int64(c.AckWait))
	}
	if strings.ContainsAny(c.Durable, ".*> \t") {
		p.Add(at+".durable", "%q must not contain '.', '*', '>' or white space", c.Durable)
	}
}

// Dialects returns the contract's own (delaybridge) alone.
func (*IngestConfig) Dialects() []envelope.Dialect {
	return []envelope.Dialect{envelope.DialectDelaybridge}
}

// Consumes returns the subjects the ingest reads, on a NATS sink: a
// message published there would be ingested again.
func (c *IngestConfig) Consumes(sink config.SinkBroker) []destination.Reserved {
	if _, ok := sink.(*SinkConfig); !ok || c.Subject == "" {
		return nil
	}
	return []destination.Reserved{Destinations.Consumed(c.Subject)}
}

// Open connects the ingest's Source.
func (c *IngestConfig) Open(ctx context.Context, in *config.Ingest, log *slog.Logger) (ingest.Source, error) {
	opts, err := AuthOptions(c.Auth)
	if err != nil {
		return nil, err
	}
	return NewSource(ctx, SourceParams{
		Name: in.Name, URL: c.URL, Options: opts, Subject: c.Subject, Stream: c.Stream,
		Durable: c.Durable, AckWait: c.AckWait.D(), MaxInFlight: in.MaxInFlight,
	}, log)
}

// Send publishes p to the ingest's subject (p.Subject when given, else the
// ingest's subject with its wildcards filled in), as a publisher would.
func (c *IngestConfig) Send(ctx context.Context, in *config.Ingest, p ingest.Publication) (time.Time, error) {
	opts, err := AuthOptions(c.Auth)
	if err != nil {
		return time.Time{}, err
	}
	return Send(ctx, SourceParams{Name: in.Name, URL: c.URL, Options: opts, Subject: c.Subject, Stream: c.Stream}, p)
}

// Kind returns "nats".
func (*SinkConfig) Kind() string { return Kind }

// Destinations returns Destinations: the syntax of what the sink publishes to.
func (*SinkConfig) Destinations() destination.Syntax { return Destinations }

// Opens says what a route that lets publishers choose any subject opens.
func (*SinkConfig) Opens(name string) string {
	return fmt.Sprintf("sink %s publishes to any subject its NATS user may publish to (the reserved subjects stay refused: docs/security.md)", name)
}

// ApplyDefaults has nothing to fill.
func (*SinkConfig) ApplyDefaults() {}

// Validate checks the block.
func (c *SinkConfig) Validate(at string, p *config.Problems) {
	checkURL(p, at+".url", c.URL)
	c.Auth.validate(p, at)
}

// Open connects the sink; ctx may carry the publish timeout
// (sinks.WithPublishTimeout).
func (c *SinkConfig) Open(ctx context.Context, name string, log *slog.Logger) (sinks.Sink, error) {
	opts, err := AuthOptions(c.Auth)
	if err != nil {
		return nil, err
	}
	return NewSink(SinkParams{Name: name, URL: c.URL, JetStream: c.JetStream, Options: opts, PublishTimeout: sinks.PublishTimeout(ctx)}, log)
}

// durableName makes a JetStream consumer name from an ingest name.
func durableName(name string) string {
	r := strings.NewReplacer(".", "_", "*", "_", ">", "_", " ", "_", "\t", "_")
	return "delaybridge_" + r.Replace(name)
}

// checkURL accepts nats.go's comma-separated server list.
func checkURL(p *config.Problems, at, v string) {
	if v == "" {
		p.Add(at, "required")
		return
	}
	for _, one := range strings.Split(v, ",") {
		p.URL(at, strings.TrimSpace(one), "nats", "tls", "ws", "wss")
	}
}

func (a Auth) validate(p *config.Problems, at string) {
	p.TLS(at+".tls", a.TLS)
	methods := 0
	if a.User != "" || a.Password != "" {
		methods++
		if a.User == "" {
			p.Add(at+".user", "required with a password")
		}
	}
	for _, set := range []bool{a.Token != "", a.NKeySeedFile != "", a.CredsFile != ""} {
		if set {
			methods++
		}
	}
	if methods > 1 {
		p.Add(at, "give one way to authenticate: user/password, token, nkey_seed_file or creds_file")
	}
}
