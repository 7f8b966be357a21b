package rabbitbroker

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/destination"
	"github.com/delaybridge/delaybridge/pkg/envelope"
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
	// Bindings bind the queue to exchanges at every connect, the topology
	// Bento's bindings_declare or a Spring Binding bean would declare. The
	// messages' routing keys stay theirs: {source.1:} in a destination is
	// the routing key a message was published with.
	Bindings []Binding `yaml:"bindings"`
}

// Binding binds the ingest's queue to an exchange with a routing key
// (pattern, on a topic exchange).
type Binding struct {
	Exchange   string `yaml:"exchange"`
	RoutingKey string `yaml:"routing_key"`
	// ExchangeType, when given (direct, topic, fanout), declares the
	// exchange durable with that type if it is missing; an exchange that
	// exists with another type or arguments is an error at connect. Empty
	// (the default): the exchange must already exist; it is declared
	// passively, and never changed; a sink publishing to that exchange then
	// has only the binding's key refused as a loop, which on a fanout or
	// headers exchange is not all that comes back (validate warns).
	ExchangeType string `yaml:"exchange_type"`
}

// ExchangeTypes are the exchange types a binding may declare.
var ExchangeTypes = []string{amqp.ExchangeDirect, amqp.ExchangeTopic, amqp.ExchangeFanout}

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
	for i, b := range c.Bindings {
		bat := fmt.Sprintf("%s.bindings[%d]", at, i)
		switch {
		case strings.TrimSpace(b.Exchange) == "":
			p.Add(bat+".exchange", "required: the default exchange already routes to the queue by its name")
		case strings.HasPrefix(b.Exchange, "amq.") && b.ExchangeType != "":
			p.Add(bat+".exchange_type", "%q is a built-in exchange: it exists; leave exchange_type out", b.Exchange)
		}
		switch {
		case b.ExchangeType == "x-delayed-message":
			p.Add(bat+".exchange_type", "x-delayed-message is the plugin delaybridge replaces: bind to a %s exchange (docs/migrate-rabbitmq-delayed-exchange.md)", amqp.ExchangeTopic)
		case b.ExchangeType != "" && !slices.Contains(ExchangeTypes, b.ExchangeType):
			p.Add(bat+".exchange_type", "%q is not one of %s (declare other exchange types yourself and leave exchange_type out)", b.ExchangeType, strings.Join(ExchangeTypes, ", "))
		}
	}
}

// Dialects returns the contract's own (delaybridge) alone.
func (*IngestConfig) Dialects() []envelope.Dialect {
	return []envelope.Dialect{envelope.DialectDelaybridge}
}

// Consumes returns what reaches the ingest's queue through a RabbitMQ
// sink: on the default exchange, the queue's name; on an exchange a
// binding binds the queue to, the routing keys of the binding (every one
// on a fanout or headers exchange). A message published there would be
// ingested again.
func (c *IngestConfig) Consumes(sink config.SinkBroker) []destination.Reserved {
	sc, ok := sink.(*SinkConfig)
	if !ok || c.Queue == "" {
		return nil
	}
	if sc.Exchange == "" {
		return []destination.Reserved{{Prefix: c.Queue, Pattern: c.Queue, Example: c.Queue}}
	}
	var out []destination.Reserved
	for _, b := range c.Bindings {
		switch {
		case b.Exchange != sc.Exchange:
		case b.ExchangeType == amqp.ExchangeFanout || b.ExchangeType == amqp.ExchangeHeaders:
			// The binding's key is not read: every key, which only a
			// destination written out opens (Reserved).
			out = append(out, destination.Reserved{Pattern: "#", Example: "orders.retry"})
		case b.RoutingKey != "":
			out = append(out, Destinations.Consumed(b.RoutingKey))
		}
	}
	return out
}

var _ config.LoopWarner = (*IngestConfig)(nil)

// LoopWarnings warns of each binding to the exchange sink publishes to
// whose type is not given: on a fanout or headers exchange every key the
// sink publishes there reaches the queue, and Consumes reserves the
// binding's key alone.
func (c *IngestConfig) LoopWarnings(sink config.SinkBroker, sinkName, at string, w *config.Problems) {
	sc, ok := sink.(*SinkConfig)
	if !ok || c.Queue == "" || sc.Exchange == "" {
		return
	}
	for i, b := range c.Bindings {
		if b.Exchange == sc.Exchange && b.ExchangeType == "" {
			w.Add(fmt.Sprintf("%s.bindings[%d].exchange_type", at, i), "not set, and sink %s publishes to exchange %q: "+
				"if it is a fanout or headers exchange, every message the sink publishes there reaches queue %q again (a loop), "+
				"while only the key %q is refused; set exchange_type (fanout refuses every key not written out in allowed_destinations; "+
				"an exchange that exists must have that type, be durable and have no arguments, or the ingest fails to connect)",
				sinkName, b.Exchange, c.Queue, b.RoutingKey)
		}
	}
}

func (c *IngestConfig) params(in *config.Ingest) SourceParams {
	return SourceParams{Name: in.Name, URL: c.URL, Queue: c.Queue, Prefetch: c.Prefetch, Auth: c.Auth, Bindings: c.Bindings}
}

// Open connects the ingest's Source.
func (c *IngestConfig) Open(ctx context.Context, in *config.Ingest, log *slog.Logger) (ingest.Source, error) {
	return NewSource(ctx, c.params(in), log)
}

// Send publishes p to the ingest's queue, as a publisher would. RabbitMQ
// records no precise publish time (the timestamp property has whole
// seconds): the time is zero, and the daemon counts from when it reads the
// message.
func (c *IngestConfig) Send(ctx context.Context, in *config.Ingest, p ingest.Publication) (time.Time, error) {
	return time.Time{}, Send(ctx, c.params(in), p)
}

// Kind returns "rabbitmq".
func (*SinkConfig) Kind() string { return Kind }

// Destinations returns the syntax of the routing keys the sink publishes
// on its exchange (DestinationsOn).
func (c *SinkConfig) Destinations() destination.Syntax { return DestinationsOn(c.Exchange) }

// Opens says what a route that lets publishers choose any routing key
// opens: on the default exchange, every queue.
func (c *SinkConfig) Opens(name string) string {
	if c.Exchange == "" {
		return fmt.Sprintf("sink %s publishes on the default exchange (exchange: \"\"), where the routing key is a queue name: every queue its RabbitMQ user may write to", name)
	}
	return fmt.Sprintf("sink %s publishes any routing key on exchange %q", name, c.Exchange)
}

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
