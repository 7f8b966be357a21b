// Package membroker is a broker in this process's memory, for tests only:
// named queues that a sink appends to and an ingest reads, with
// acknowledgements, redelivery and release as a real broker has them. It
// is what a fourth broker looks like: one folder with its configuration
// blocks, its destination syntax, its Source and its Sink, and one
// registration (brokers.Register(membroker.Broker)); its test runs the
// ingest and sink conformance suites through pkg/brokers.
//
// Every queue lives on one bus of the process: an ingest's queue: names
// the queue it reads, and a sink's destination is the queue it appends to.
// Nothing survives the process.
package membroker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/destination"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ingest"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// Kind is the key of a memory block in the configuration.
const Kind = "mem"

// Broker is the memory broker's entry for the broker registry
// (brokers.Register).
var Broker = config.Broker{
	Kind:      Kind,
	NewIngest: func() config.IngestBroker { return new(IngestConfig) },
	NewSink:   func() config.SinkBroker { return new(SinkConfig) },
}

// Destinations is the syntax of queue names: dot-separated words with
// NATS's wildcards in patterns (destination.Subjects); the queues
// beginning with "$mem." are the broker's own.
var Destinations = destination.Syntax{
	Noun:     "memory queue",
	Reserved: []destination.Reserved{{Prefix: "$mem.", What: "the memory broker's own queues", Example: "$mem.>"}},
}

// IngestConfig is an ingest's mem: block.
type IngestConfig struct {
	Queue string `yaml:"queue"`
}

// SinkConfig is a sink's mem: block: the destination is the queue.
type SinkConfig struct{}

// Kind returns "mem".
func (*IngestConfig) Kind() string { return Kind }

// ApplyDefaults has nothing to fill.
func (*IngestConfig) ApplyDefaults(*config.Ingest) {}

// Validate checks the block.
func (c *IngestConfig) Validate(_ *config.Ingest, at string, p *config.Problems) {
	p.Required(at+".queue", c.Queue)
}

// Consumes returns the queue the ingest reads, on a memory sink.
func (c *IngestConfig) Consumes(sink config.SinkBroker) []destination.Reserved {
	if _, ok := sink.(*SinkConfig); !ok || c.Queue == "" {
		return nil
	}
	return []destination.Reserved{Destinations.Consumed(c.Queue)}
}

// Dialects returns the contract's own (delaybridge) alone.
func (*IngestConfig) Dialects() []envelope.Dialect {
	return []envelope.Dialect{envelope.DialectDelaybridge}
}

// Open connects a Source to the ingest's queue.
func (c *IngestConfig) Open(_ context.Context, in *config.Ingest, _ *slog.Logger) (ingest.Source, error) {
	return &Source{q: bus.queue(c.Queue)}, nil
}

// Send appends p to the ingest's queue and returns its publish time.
func (c *IngestConfig) Send(_ context.Context, _ *config.Ingest, p ingest.Publication) (time.Time, error) {
	return bus.queue(c.Queue).put(p.Headers, p.Body, p.Key), nil
}

// Kind returns "mem".
func (*SinkConfig) Kind() string { return Kind }

// ApplyDefaults has nothing to fill.
func (*SinkConfig) ApplyDefaults() {}

// Validate has nothing to check.
func (*SinkConfig) Validate(string, *config.Problems) {}

// Destinations returns Destinations.
func (*SinkConfig) Destinations() destination.Syntax { return Destinations }

// Opens says what a route that lets publishers choose any queue opens.
func (*SinkConfig) Opens(name string) string {
	return fmt.Sprintf("sink %s appends to any memory queue", name)
}

// Open connects the sink.
func (*SinkConfig) Open(context.Context, string, *slog.Logger) (sinks.Sink, error) {
	return &Sink{}, nil
}

// bus holds every queue of the process.
var bus = &queues{m: map[string]*queue{}}

type queues struct {
	mu sync.Mutex
	m  map[string]*queue
}

// queue returns the queue name, created on first use.
func (b *queues) queue(name string) *queue {
	b.mu.Lock()
	defer b.mu.Unlock()
	q, ok := b.m[name]
	if !ok {
		q = &queue{name: name, changed: make(chan struct{})}
		b.m[name] = q
	}
	return q
}

// message is one message on a queue; seq is its place, kept when it is
// delivered again.
type message struct {
	seq     uint64
	at      time.Time
	headers envelope.Headers
	body    []byte
	key     []byte
}

// queue is a FIFO of messages with the ones delivered and not yet settled
// held apart, by delivery.
type queue struct {
	name    string
	mu      sync.Mutex
	seq     uint64
	ready   []*message // by seq
	changed chan struct{}
}

// signal wakes every Read waiting on q. Call with q.mu held.
func (q *queue) signal() {
	close(q.changed)
	q.changed = make(chan struct{})
}

// put appends a message and returns its publish time.
func (q *queue) put(hs envelope.Headers, body, key []byte) time.Time {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.seq++
	m := &message{seq: q.seq, at: time.Now(), headers: slices.Clone(hs), body: slices.Clone(body), key: slices.Clone(key)}
	q.ready = append(q.ready, m)
	q.signal()
	return m.at
}

// requeue puts delivered messages back in their place. Call with q.mu held.
func (q *queue) requeue(ms ...*message) {
	for _, m := range ms {
		i, _ := slices.BinarySearchFunc(q.ready, m.seq, func(r *message, seq uint64) int { return cmp.Compare(r.seq, seq) })
		q.ready = slices.Insert(q.ready, i, m)
	}
	if len(ms) > 0 {
		q.signal()
	}
}

// Source reads one queue. What it read and did not acknowledge goes back
// to the queue on a nack, on Close, and is given back with its AckFunc
// after Release.
type Source struct {
	q        *queue
	closed   bool
	released bool
	held     map[*message]bool // read, not settled
}

var (
	_ ingest.Source   = (*Source)(nil)
	_ ingest.Releaser = (*Source)(nil)
	_ ingest.Ready    = (*Source)(nil)
)

// Read returns the queue's first message, waiting for one.
func (s *Source) Read(ctx context.Context) (*envelope.Incoming, ingest.AckFunc, error) {
	q := s.q
	for {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		q.mu.Lock()
		if s.closed {
			q.mu.Unlock()
			return nil, nil, ingest.ErrClosed
		}
		if !s.released && len(q.ready) > 0 {
			m := q.ready[0]
			q.ready = q.ready[1:]
			if s.held == nil {
				s.held = map[*message]bool{}
			}
			s.held[m] = true
			q.mu.Unlock()
			in := &envelope.Incoming{
				Headers: slices.Clone(m.headers), Body: m.body, Key: m.key, PublishedAt: m.at,
				Origin: envelope.Origin{Log: q.name, Pos: m.seq}, Source: q.name,
			}
			return in, func(_ context.Context, err error) error { return s.settle(m, err) }, nil
		}
		wait := q.changed
		q.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-wait:
		}
	}
}

// settle removes m on a nil err and puts it back otherwise; a message this
// Source no longer holds (it was closed) is left alone.
func (s *Source) settle(m *message, err error) error {
	s.q.mu.Lock()
	defer s.q.mu.Unlock()
	if !s.held[m] {
		return errors.New("membroker: the message is no longer held: it is delivered again")
	}
	delete(s.held, m)
	if err != nil {
		s.q.requeue(m)
	}
	return nil
}

// Close puts back what the Source holds and ends its Reads.
func (s *Source) Close(context.Context) error {
	s.q.mu.Lock()
	defer s.q.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	held := make([]*message, 0, len(s.held))
	for m := range s.held {
		held = append(held, m)
	}
	s.held = nil
	s.q.requeue(held...)
	s.q.signal()
	return nil
}

// Release stops reading; the Source fetches nothing ahead, so there is
// nothing else to give back.
func (s *Source) Release(context.Context) error {
	s.q.mu.Lock()
	defer s.q.mu.Unlock()
	s.released = true
	return nil
}

// Resume reads again.
func (s *Source) Resume(context.Context) error {
	s.q.mu.Lock()
	defer s.q.mu.Unlock()
	s.released = false
	s.q.signal()
	return nil
}

// Ready is nil until Close.
func (s *Source) Ready() error {
	s.q.mu.Lock()
	defer s.q.mu.Unlock()
	if s.closed {
		return ingest.ErrClosed
	}
	return nil
}

// Sink appends each message to the queue named by its destination, with
// the headers every sink writes (envelope.Message.OutHeaders) and the
// ingest's properties (sinks.PropertyHeaders).
type Sink struct{}

var (
	_ sinks.Sink  = (*Sink)(nil)
	_ sinks.Ready = (*Sink)(nil)
)

// Publish appends msgs; a message whose context has ended is not.
func (*Sink) Publish(ctx context.Context, msgs []sinks.Outgoing) []error {
	errs := make([]error, len(msgs))
	if err := ctx.Err(); err != nil {
		return sinks.Fill(errs, err)
	}
	for _, m := range msgs {
		hs := append(m.OutHeaders(m.Attempt), sinks.PropertyHeaders(m.Message)...)
		bus.queue(m.Destination).put(hs, m.Body, m.Key)
	}
	return errs
}

// Close has nothing to release.
func (*Sink) Close() error { return nil }

// Ready is always nil: the queues are in this process.
func (*Sink) Ready() error { return nil }
