package rabbitbroker

import (
	"context"
	"log/slog"

	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/ingest"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// Kind is the key of a RabbitMQ block in the configuration.
const Kind = "rabbitmq"

// Broker is RabbitMQ's entry in the broker registry (pkg/brokers).
var Broker = config.Broker{
	Kind:      Kind,
	NewIngest: func() config.IngestBroker { return new(IngestConfig) },
	NewSink:   func() config.SinkBroker { return new(SinkConfig) },
}

// MaxPrefetch is the largest channel QoS AMQP can carry (a short).
const MaxPrefetch = 65535

// IngestConfig is an ingest's rabbitmq: block: a queue consumed with manual
// acks.
type IngestConfig struct {
	Auth  `yaml:",inline"`
	URL   string `yaml:"url"`
	Queue string `yaml:"queue"`
	// Prefetch is the channel's QoS: unacknowledged messages the broker
	// sends ahead (default: the ingest's max_in_flight).
	Prefetch int `yaml:"prefetch"`
}

// SinkConfig is a sink's rabbitmq: block: it publishes to an exchange; the
// destination is the routing key.
type SinkConfig struct {
	Auth     `yaml:",inline"`
	URL      string `yaml:"url"`
	Exchange string `yaml:"exchange"`
	// Mandatory makes an unroutable message a failed publish (retried, then
	// dead with reason "unroutable") instead of silently dropped (default
	// true).
	Mandatory *bool `yaml:"mandatory"`
}

// Auth is how an AMQP client authenticates. Username and password override
// those in the URL; External uses SASL EXTERNAL, the identity of the TLS
// client certificate (amqps with tls.cert_file and key_file, and the
// broker's rabbitmq_auth_mechanism_ssl plugin).
type Auth struct {
	TLS          config.TLS    `yaml:"tls"`
	Username     string        `yaml:"username"`
	Password     config.Secret `yaml:"password"`
	PasswordFile string        `yaml:"password_file"`
	External     bool          `yaml:"external"`
}

// Kind returns "rabbitmq".
func (*IngestConfig) Kind() string { return Kind }

// ApplyDefaults sets the prefetch to the ingest's max_in_flight.
func (c *IngestConfig) ApplyDefaults(in *config.Ingest) {
	config.Default(&c.Prefetch, in.MaxInFlight)
}

// Validate checks the block.
func (c *IngestConfig) Validate(_ *config.Ingest, at string, p *config.Problems) {
	p.URL(at+".url", c.URL, "amqp", "amqps")
	c.Auth.validate(p, at)
	p.Required(at+".queue", c.Queue)
	if c.Prefetch < 1 || c.Prefetch > MaxPrefetch {
		p.Add(at+".prefetch", "%d is not between 1 and %d", c.Prefetch, MaxPrefetch)
	}
}

func (c *IngestConfig) params(in *config.Ingest) SourceParams {
	return SourceParams{Name: in.Name, URL: c.URL, Queue: c.Queue, Prefetch: c.Prefetch, Auth: c.Auth}
}

// Open connects the ingest's Source.
func (c *IngestConfig) Open(ctx context.Context, in *config.Ingest, log *slog.Logger) (ingest.Source, error) {
	return NewSource(ctx, c.params(in), log)
}

// Send publishes p to the ingest's queue, as a publisher would.
func (c *IngestConfig) Send(ctx context.Context, in *config.Ingest, p ingest.Publication) error {
	return Send(ctx, c.params(in), p)
}

// Kind returns "rabbitmq".
func (*SinkConfig) Kind() string { return Kind }

// ApplyDefaults makes publishes mandatory unless said otherwise.
func (c *SinkConfig) ApplyDefaults() {
	if c.Mandatory == nil {
		yes := true
		c.Mandatory = &yes
	}
}

// Validate checks the block.
func (c *SinkConfig) Validate(at string, p *config.Problems) {
	p.URL(at+".url", c.URL, "amqp", "amqps")
	c.Auth.validate(p, at)
}

// Open connects the sink.
func (c *SinkConfig) Open(ctx context.Context, name string, log *slog.Logger) (sinks.Sink, error) {
	return NewSink(ctx, SinkParams{Name: name, URL: c.URL, Exchange: c.Exchange, Mandatory: *c.Mandatory, Auth: c.Auth}, log)
}

func (a Auth) validate(p *config.Problems, at string) {
	p.TLS(at+".tls", a.TLS)
	if a.Password != "" && a.Username == "" {
		p.Add(at+".username", "required with a password")
	}
	if a.External && (a.TLS.CertFile == "" || !a.TLS.Enabled) {
		p.Add(at+".external", "SASL EXTERNAL authenticates with the TLS client certificate: set tls.enabled, tls.cert_file and tls.key_file")
	}
	if a.External && a.Username != "" {
		p.Add(at+".username", "not used with external: true (the certificate is the identity)")
	}
}
