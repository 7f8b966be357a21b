// Package sinktest is the conformance suite of sink adapters: every
// sinks.Sink (the Sinks of pkg/brokers/natsbroker, kafkabroker, rabbitbroker,
// and the in-memory test broker internal/membroker) runs Run against its real
// broker, so that they all keep the sink contract the same way (pkg/sinks's
// Sink, Permanent and Ready, and "Written on every published message" of docs/reference.md).
// The idea is watermill's pubsub/tests.TestPubSub: one suite, a Features
// struct saying what a broker can promise, and a Harness that connects the
// suite to one adapter.
//
// # How to adopt it
//
// In the adapter's package, write one test per configuration that starts
// the broker with internal/testenv and calls Run:
//
//	func TestConformance(t *testing.T) {
//		node := testenv.RabbitMQ(t)
//		sinktest.Run(t, sinktest.Harness{
//			Open: func(t *testing.T) sinks.Sink { ... rabbitbroker.New(...) },
//			// a fresh queue bound so that the sink's destination reaches it
//			Destination: func(t *testing.T, key string) string { ... },
//			// a consumer of that queue, started before Destination returns
//			// or at Consume, translating each delivery to a Received
//			Consume: func(t *testing.T, dest string) <-chan sinktest.Received { ... },
//			// a routing key no queue is bound to (mandatory publish)
//			UnroutableDestination: func(t *testing.T) string { return "nowhere." + ... },
//			Features: sinktest.Features{Confirms: true, BrokerID: true,
//				Ordered: true, BinaryHeaders: true},
//			StopBroker:  func(t *testing.T) { node.Stop(t) },
//			StartBroker: func(t *testing.T) { node.Start(t) },
//		})
//	}
//
// Run closes every Sink that Open returned itself. Subtests that cannot
// apply to a broker (Features false) are skipped with the reason. A subtest
// that fails because of a known adapter bug can be listed in
// Harness.KnownBugs: it is then skipped with the bug's description, unless
// DELAYBRIDGE_CONFORMANCE_STRICT=1 is set.
//
// The suite never sleeps to synchronise: it waits on Consume's channel with
// deadlines and polls Ready.
package sinktest

import (
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/conformance"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// Harness connects the suite to one sink adapter and its broker.
type Harness struct {
	// Open returns a new, connected Sink. It fails the test itself when it
	// cannot connect.
	Open func(t *testing.T) sinks.Sink

	// Destination returns a fresh destination (Kafka topic, AMQP routing
	// key, NATS subject) for key that exists and is stored or routed such
	// that Consume sees what is published to it. Keys are lower-case
	// letters, digits and '-', at most 80 bytes.
	Destination func(t *testing.T, key string) string

	// Consume returns every message published to dest from now on (or
	// since dest was created), as the broker delivers it to a consumer. It
	// is called at most once per destination, before the suite publishes
	// to it, and it must be receiving when it returns (core NATS: the
	// subscription is flushed). The channel must not block the broker
	// connection: buffer generously (the suite publishes up to 1000
	// messages to one destination). The harness stops consuming in
	// t.Cleanup.
	//
	// Received.Headers holds the application headers only: where the
	// broker's own ID field is a header (NATS Nats-Msg-Id), Consume moves
	// it to Received.BrokerID.
	Consume func(t *testing.T, dest string) <-chan Received

	// UnroutableDestination returns a destination the broker refuses
	// (AMQP: a routing key no queue is bound to, with mandatory publish;
	// JetStream: a subject no stream stores). nil when the broker cannot
	// tell (core NATS, Kafka with auto-created topics).
	UnroutableDestination func(t *testing.T) string

	Features Features

	// StopBroker stops the broker and returns once it is down;
	// StartBroker starts it again with its data and returns once it
	// accepts connections. Both nil when the test cannot restart the
	// broker; the BrokerRestart subtest is then skipped.
	StopBroker  func(t *testing.T)
	StartBroker func(t *testing.T)

	// Timeout bounds every wait for a message or a state (default 30s).
	Timeout time.Duration

	// KnownBugs maps a subtest name (e.g. "Headers") to a description of
	// a known adapter bug that makes it fail. Such subtests are skipped
	// with that description unless DELAYBRIDGE_CONFORMANCE_STRICT=1.
	KnownBugs map[string]string
}

// Received is one message as a consumer of the destination got it.
type Received struct {
	Headers  envelope.Headers // application headers, in broker order
	Body     []byte
	Key      []byte // Kafka record key; nil when none
	BrokerID string // the broker's own message ID (AMQP message_id, NATS Nats-Msg-Id); "" when none
}

// Features says what the broker and adapter promise.
type Features struct {
	// Confirms: a nil error from Publish means the broker has the message
	// (AMQP publisher confirm, Kafka acks=all, JetStream PubAck), and an
	// unconfirmed publish is an error. False for core NATS, where nil only
	// means "flushed to the server".
	Confirms bool
	// Keys: Message.Key is the record key (Kafka).
	Keys bool
	// BrokerID: the message ID is also set as the broker's own ID field
	// (AMQP message_id, NATS Nats-Msg-Id) and Consume reports it.
	BrokerID bool
	// BrokerIDHeader names the header that is the broker's ID field (NATS:
	// Nats-Msg-Id): an incoming copy of it is replaced by the message ID.
	// Elsewhere such a header is an ordinary ingest header and is forwarded,
	// as the contract says of every ingest header but the control headers.
	BrokerIDHeader string
	// Ordered: the messages of one Publish call, and of successive calls,
	// to one destination (with one key) arrive in that order.
	Ordered bool
	// Dedupe: the broker drops a second publish of the same message ID
	// inside its window (JetStream); Publish still reports it confirmed.
	Dedupe bool
	// DuplicateHeaders: a header key may appear more than once and every
	// value arrives, in order (Kafka, NATS; not an AMQP table).
	DuplicateHeaders bool
	// BinaryHeaders: header keys and values may hold any bytes (Kafka,
	// AMQP). Without it, a header the broker cannot carry exactly must fail
	// its message alone with a Permanent error, never arrive altered.
	BinaryHeaders bool
	// MaxBody is the largest body the broker takes as configured in the
	// test (0: 1 MiB, the contract's default limits.max_payload_bytes).
	MaxBody int
	// OversizeBody, when > 0, is a body size the broker refuses: such a
	// message must fail alone, with a Permanent error.
	OversizeBody int
}

// StrictEnv is the environment variable that makes Run run the subtests
// listed in Harness.KnownBugs too.
const StrictEnv = "DELAYBRIDGE_CONFORMANCE_STRICT"

// Run runs the suite as subtests of t, one after another.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.Open == nil || h.Destination == nil || h.Consume == nil {
		t.Fatal("sinktest: Harness.Open, Destination and Consume are required")
	}
	if (h.StopBroker == nil) != (h.StartBroker == nil) {
		t.Fatal("sinktest: set both Harness.StopBroker and Harness.StartBroker, or neither")
	}
	if h.Timeout <= 0 {
		h.Timeout = 30 * time.Second
	}
	if h.Features.MaxBody <= 0 {
		h.Features.MaxBody = 1 << 20
	}
	s := &suite{h: h, run: conformance.RandomHex(3)}
	cases := []struct {
		name string
		f    func(t *testing.T)
	}{
		{"Ready", s.testReady},
		{"Body", s.testBody},
		{"Headers", s.testHeaders},
		{"DuplicateHeaders", s.testDuplicateHeaders},
		{"UncarriableHeaders", s.testUncarriableHeaders},
		{"Key", s.testKey},
		{"Batch1000", s.testBatch},
		{"PerMessageErrors", s.testPerMessageErrors},
		{"OversizeBody", s.testOversize},
		{"Sizer", s.testSizer},
		{"Concurrent", s.testConcurrent},
		{"Ordered", s.testOrdered},
		{"Dedupe", s.testDedupe},
		{"Context", s.testContext},
		{"BrokerRestart", s.testBrokerRestart},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if reason, ok := h.KnownBugs[c.name]; ok && os.Getenv(StrictEnv) == "" {
				t.Skipf("KNOWN BUG, skipped (set %s=1 to run): %s", StrictEnv, reason)
			}
			c.f(t)
		})
	}
}

type suite struct {
	h    Harness
	run  string       // random per Run: IDs and keys never collide across runs
	seq  atomic.Int64 // message sequence
	keys atomic.Int64 // key sequence
}

// key returns a fresh key for the current subtest.
func (s *suite) key(t *testing.T) string {
	return conformance.Key(t, "st", s.run, s.keys.Add(1))
}
