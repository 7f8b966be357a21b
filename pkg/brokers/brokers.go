// Package brokers is the registry of the brokers delaybridge reads from and
// publishes to. Each broker has one folder beside this file (natsbroker,
// kafkabroker, rabbitbroker) holding everything of it: its configuration
// blocks with their defaults and validation, the syntax of its
// destinations (reserved parts, validity, wildcards), its connection code,
// its ingest Source, its Sink, and its Send (what `delaybridge send` uses).
//
// A new broker is one more such folder and one more line in the registry
// below: the configuration then knows its key and its destinations, and
// the daemon and the command line open its sources and sinks through Open
// and Send here, with no switch on the kind anywhere. internal/membroker
// is such a broker, kept for tests: its test registers it and runs the
// conformance suites through this package.
//
// Importing this package registers the brokers with pkg/config; a program
// that loads a configuration imports it.
package brokers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"syscall"
	"time"

	"github.com/delaybridge/delaybridge/pkg/brokers/kafkabroker"
	"github.com/delaybridge/delaybridge/pkg/brokers/natsbroker"
	"github.com/delaybridge/delaybridge/pkg/brokers/rabbitbroker"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/ingest"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// registry is every broker of the build. Its order is the order of the
// reserved parts destination.Generic checks, and so of the reason it gives
// for a destination two brokers reserve (`_INBOX.`: NATS's first).
var registry = []config.Broker{
	natsbroker.Broker,
	kafkabroker.Broker,
	rabbitbroker.Broker,
}

func init() { Register(registry...) }

// Register adds brokers to the registry: the configuration then knows
// their keys, and OpenSource, OpenSink and Send open their blocks. Each
// broker's ingest block must be an Ingest and its sink block a Sink; it
// panics otherwise, or on a key registered twice (programming errors, seen
// at the start of any program or test). The registry above is registered
// at init; a test registers a broker of its own (internal/membroker).
func Register(bs ...config.Broker) {
	for _, b := range bs {
		if _, ok := b.NewIngest().(Ingest); !ok {
			panic(fmt.Sprintf("brokers: the ingest block of %q, %T, is not a brokers.Ingest", b.Kind, b.NewIngest()))
		}
		if _, ok := b.NewSink().(Sink); !ok {
			panic(fmt.Sprintf("brokers: the sink block of %q, %T, is not a brokers.Sink", b.Kind, b.NewSink()))
		}
	}
	config.RegisterBroker(bs...)
}

// Ingest is what a broker's ingest block (config.Ingest.Broker) can do
// besides being configured.
type Ingest interface {
	config.IngestBroker
	// Open connects a Source that reads the ingest's messages.
	Open(ctx context.Context, in *config.Ingest, log *slog.Logger) (ingest.Source, error)
	// Send publishes one message to the ingest's topic, queue or subject
	// the way an application would, and waits for the broker to take it.
	// It returns the message's publish time as the broker records it, the
	// one the daemon counts a delay from (ingest.Incoming.PublishedAt: a
	// Kafka record's timestamp, a JetStream message's time), or the zero
	// time where the broker records none precisely (the daemon then counts
	// from when it reads the message).
	Send(ctx context.Context, in *config.Ingest, p ingest.Publication) (time.Time, error)
}

// Sink is what a broker's sink block (config.Sink.Broker) can do besides
// being configured.
type Sink interface {
	config.SinkBroker
	// Open connects the sink named name.
	Open(ctx context.Context, name string, log *slog.Logger) (sinks.Sink, error)
}

// OpenSource connects the Source of the ingest in. The error names the
// ingest.
func OpenSource(ctx context.Context, in *config.Ingest, log *slog.Logger) (ingest.Source, error) {
	b, err := ingestOf(in)
	if err != nil {
		return nil, err
	}
	s, err := b.Open(ctx, in, log)
	if err != nil {
		return nil, fmt.Errorf("ingest %s: %w", in.Name, err)
	}
	return s, nil
}

// OpenSink connects the sink sc. The error names the sink.
func OpenSink(ctx context.Context, sc *config.Sink, log *slog.Logger) (sinks.Sink, error) {
	b, ok := sc.Broker.(Sink)
	if !ok {
		return nil, fmt.Errorf("sink %s: no broker block (one of %v) in this build", sc.Name, config.BrokerKinds())
	}
	s, err := b.Open(ctx, sc.Name, log)
	if err != nil {
		return nil, fmt.Errorf("sink %s: %w", sc.Name, err)
	}
	return s, nil
}

func ingestOf(in *config.Ingest) (Ingest, error) {
	b, ok := in.Broker.(Ingest)
	if !ok {
		return nil, fmt.Errorf("ingest %s: no broker block (one of %v) in this build", in.Name, config.BrokerKinds())
	}
	return b, nil
}

// Unreachable reports whether opening an ingest failed because no broker
// answered at its address (refused, no such host, no answer to the dial or
// the handshake: sinks.Unreachable, nats.go's "no servers available", a
// RabbitMQ broker silent after the connect), as opposed to one that
// answered and refused (credentials, TLS, a missing stream or topic). A
// request that timed out on a connection made (a JetStream API call the
// user may not make, a JetStream that is off) is not one: the broker is
// there, and the start stops with the cause.
func Unreachable(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) && !dialed(err) {
		return false
	}
	return natsbroker.Unreachable(err) || rabbitbroker.Unreachable(err)
}

// Waiting reports whether an ingest that waits for its broker (its first
// try was Unreachable) goes on waiting after err: what is Unreachable, or
// a connection made and then lost before the broker answered (EOF, a
// reset, a broken pipe: a broker restarting, a proxy in front of one that
// is still down). At start such a loss is not waited for, since a TLS or
// SASL mismatch looks the same; once the broker was found not answering,
// it is one more sign of the same.
func Waiting(err error) bool {
	return Unreachable(err) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed) ||
		rabbitbroker.Lost(err)
}

// dialed reports whether err is a failed dial (a *net.OpError of Op "dial").
func dialed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}
