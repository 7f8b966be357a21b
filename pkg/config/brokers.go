package config

import (
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/delaybridge/delaybridge/pkg/destination"
	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// IngestBroker is the broker block of an ingest: the mapping under its
// kind's key (nats:, kafka:, rabbitmq:). Each broker package defines one;
// pkg/brokers registers them.
type IngestBroker interface {
	// Kind is the block's key: "nats", "kafka", "rabbitmq".
	Kind() string
	// ApplyDefaults fills the unset fields. The ingest's own fields
	// (max_in_flight) have their defaults already.
	ApplyDefaults(in *Ingest)
	// Validate adds every problem of the block to p, each under a path
	// that starts with at (e.g. "ingest[0].nats").
	Validate(in *Ingest, at string, p *Problems)
	// Consumes returns the parts of the namespace of sink (a sink block of
	// any broker) that this ingest reads: a message published there comes
	// back to it, a loop. nil for a sink of another broker. Config's
	// SinkDestinations reserves them (destination.Reserved, with Prefix,
	// Pattern and Example set).
	Consumes(sink SinkBroker) []destination.Reserved
	// Dialects are the dialects (ingest[].dialects) the ingest's messages
	// can carry: envelope.DialectDelaybridge on every broker, and one that
	// needs what only this broker's messages have (kafka-scheduler: a Kafka
	// record's key and tombstones).
	Dialects() []envelope.Dialect
}

// LoopWarner is an IngestBroker that may read what it cannot reserve
// (Consumes): Config.Warnings adds what LoopWarnings says of each sink, at
// paths under at (its block, "ingest[0].rabbitmq").
type LoopWarner interface {
	LoopWarnings(sink SinkBroker, sinkName, at string, w *Problems)
}

// SinkBroker is the broker block of a sink, as IngestBroker is of an
// ingest.
type SinkBroker interface {
	Kind() string
	ApplyDefaults()
	Validate(at string, p *Problems)
	// Destinations is how the broker names the destinations the sink
	// publishes to: their syntax, its control plane, the wildcards of
	// route.allowed_destinations.
	Destinations() destination.Syntax
	// Opens says what a route opens to its publishers when they may choose
	// any destination of the sink named name (Config.Warnings).
	Opens(name string) string
}

// Broker is one kind of broker as the configuration knows it: the key of
// its blocks and a zero block of each side to decode into.
type Broker struct {
	Kind      string
	NewIngest func() IngestBroker
	NewSink   func() SinkBroker
}

// registered is every broker kind RegisterBroker was given, by key.
var registered = map[string]Broker{}

// RegisterBroker makes each broker's key a known key of ingest and sink
// entries, and the reserved parts of its sink's destinations ones that
// destination.Generic refuses. pkg/brokers calls it for every broker of
// the build; a program that loads a configuration imports pkg/brokers. It
// panics on a key registered twice (a programming error).
func RegisterBroker(bs ...Broker) {
	for _, b := range bs {
		if _, dup := registered[b.Kind]; dup {
			panic(fmt.Sprintf("config: broker %q registered twice", b.Kind))
		}
		registered[b.Kind] = b
		destination.RegisterBroker(b.NewSink().Destinations())
	}
}

// BrokerKinds returns the registered keys, sorted.
func BrokerKinds() []string {
	kinds := make([]string, 0, len(registered))
	for k := range registered {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	return kinds
}

// UnmarshalYAML decodes the ingest's own keys and its broker block.
// Unknown keys are left to checkKeys, which reports them with their path.
func (i *Ingest) UnmarshalYAML(n *yaml.Node) error {
	type plain Ingest // without this method
	if err := n.Decode((*plain)(i)); err != nil {
		return err
	}
	return decodeBrokerBlock(n, &i.brokerKeys, func(b Broker, block *yaml.Node) error {
		ib := b.NewIngest()
		i.Broker = ib
		return block.Decode(ib)
	})
}

// UnmarshalYAML decodes the sink's own keys and its broker block.
func (s *Sink) UnmarshalYAML(n *yaml.Node) error {
	type plain Sink
	if err := n.Decode((*plain)(s)); err != nil {
		return err
	}
	return decodeBrokerBlock(n, &s.brokerKeys, func(b Broker, block *yaml.Node) error {
		sb := b.NewSink()
		s.Broker = sb
		return block.Decode(sb)
	})
}

// decodeBrokerBlock calls decode for every key of the mapping n that names
// a registered broker, and counts them in *count. Type errors of the blocks
// are returned together as one *yaml.TypeError, so that decoding goes on.
func decodeBrokerBlock(n *yaml.Node, count *int, decode func(Broker, *yaml.Node) error) error {
	if n.Kind != yaml.MappingNode {
		return nil
	}
	var errs []string
	for k := 0; k+1 < len(n.Content); k += 2 {
		b, ok := registered[n.Content[k].Value]
		if !ok {
			continue
		}
		*count++
		if err := decode(b, n.Content[k+1]); err != nil {
			var te *yaml.TypeError
			if errors.As(err, &te) {
				errs = append(errs, te.Errors...)
			} else {
				errs = append(errs, err.Error())
			}
		}
	}
	if len(errs) > 0 {
		return &yaml.TypeError{Errors: errs}
	}
	return nil
}

var (
	ingestType = reflect.TypeOf(Ingest{})
	sinkType   = reflect.TypeOf(Sink{})
)

// brokerFields adds the registered broker keys to the known fields of an
// ingest or a sink entry, for checkKeys.
func brokerFields(t reflect.Type, fields map[string]reflect.Type) {
	for kind, b := range registered {
		switch t {
		case ingestType:
			fields[kind] = reflect.TypeOf(b.NewIngest())
		case sinkType:
			fields[kind] = reflect.TypeOf(b.NewSink())
		}
	}
}

// checkOneBroker reports an entry with no broker block or more than one.
func checkOneBroker(p *Problems, at string, keys int, given bool) {
	if keys == 0 && given {
		keys = 1 // built in Go, not decoded
	}
	if keys != 1 {
		p.Add(at, "give exactly one of %s (got %d)", strings.Join(BrokerKinds(), ", "), keys)
	}
}
