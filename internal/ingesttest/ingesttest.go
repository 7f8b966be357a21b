// Package ingesttest is the conformance suite of ingest adapters: every
// ingest.Source (the Sources of pkg/brokers/natsbroker, kafkabroker, rabbitbroker,
// and the in-memory test broker internal/membroker) runs Run against its
// real broker, so that they all keep the ingest contract the same way
// (pkg/ingest's Source, AckFunc and Ready, and the header rules of docs/reference.md).
// The idea is watermill's pubsub/tests.TestPubSub: one suite, a Features
// struct saying what a broker can promise, and a Harness that connects the
// suite to one adapter.
//
// # How to adopt it
//
// In the adapter's package, write one test per configuration (for NATS:
// JetStream and core NATS) that starts the broker with internal/testenv and
// calls Run:
//
//	func TestConformance(t *testing.T) {
//		k := testenv.Kafka(t)
//		ingesttest.Run(t, ingesttest.Harness{
//			// a fresh topic per key, read by the group "delaybridge" (the
//			// same group on every Open of the key, so that a reopen resumes
//			// at the committed offsets)
//			Open:    func(t *testing.T, key string) ingest.Source { ... },
//			// produce like an application (acks=all), no special headers
//			Publish: func(t *testing.T, key string, m ingesttest.Message) { ... },
//			Features: ingesttest.Features{AtLeastOnce: true, Nack: true,
//				Ordered: true, PublishedAt: true, Keys: true, PositionID: true,
//				DuplicateHeaders: true, BinaryHeaders: true},
//			RedeliveryDelay: 5 * time.Second, // group rebalance after a reopen
//			StopBroker:  func(t *testing.T) { k.Close() },
//			StartBroker: func(t *testing.T) { k.Restart() },
//		})
//	}
//
// Run calls Open before it publishes to a key, and it closes every Source
// that Open returned itself (closing is part of what it checks), so Open
// need not register a Close. The harness owns the broker side: creating
// topics, queues or streams, and its own publisher connection.
//
// Subtests that cannot apply to a broker (Features false) are skipped with
// the reason. A subtest that fails because of a known adapter bug can be
// listed in Harness.KnownBugs: it is then skipped with the bug's description,
// unless DELAYBRIDGE_CONFORMANCE_STRICT=1 is set.
//
// The suite never sleeps to synchronise: it waits on Read with deadlines and
// polls Ready. Only proving that something does NOT happen (an acknowledged
// message is not delivered again) needs a time window, and that window is
// derived from Harness.RedeliveryDelay.
package ingesttest

import (
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/conformance"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ingest"
)

// Harness connects the suite to one ingest adapter and its broker.
type Harness struct {
	// Open returns a new Source reading the topic, queue or subject named
	// by key. Each subtest uses fresh keys (lower-case letters, digits and
	// '-', at most 80 bytes), so the harness may create the topic, queue or
	// stream on first use. Opening the same key again must resume the same
	// durable position (Kafka consumer group, AMQP queue, JetStream durable
	// consumer), so that messages read but not acknowledged are delivered
	// again. Open fails the test itself when it cannot connect.
	Open func(t *testing.T, key string) ingest.Source

	// Publish publishes m to the key's topic, queue or subject the way an
	// application would, and returns once the broker has it (Kafka
	// acks=all, AMQP publisher confirm, JetStream PubAck; core NATS: the
	// server has a subscriber for the subject and the publisher flushed).
	// It adds nothing of its own to the message. Features say which parts
	// of Message the broker can carry; Publish may ignore the others.
	// Publish is called from the test goroutine only, and only after Open
	// for that key; after StartBroker it should retry until the broker
	// takes the message again.
	Publish func(t *testing.T, key string, m Message)

	// SourceName returns the name Incoming.Source must carry for what
	// Publish published to key: the Kafka topic, the NATS subject, the
	// AMQP routing key (destination templates expand {source} from it).
	// Required.
	SourceName func(key string) string

	Features Features

	// RedeliveryDelay is the longest the broker takes to deliver again a
	// message that was read but not acknowledged when its Source was
	// closed, once the key is opened again: JetStream's AckWait, Kafka's
	// group rebalance, ~0 for AMQP. The suite waits that long (plus
	// Timeout) for redeliveries, and that long to prove the absence of
	// one. Keep it short in the harness (JetStream AckWait of 2s).
	RedeliveryDelay time.Duration

	// Timeout bounds every other wait for a message (default 30s).
	Timeout time.Duration

	// Backlog is how many messages the Backlog subtest publishes before
	// it reads any (default 5000). Set it above what the Source holds in
	// flight (JetStream MaxAckPending, AMQP prefetch, a client-side
	// pending limit), so that the broker must hold messages back, or,
	// for an at-most-once broker, the client must drop some without
	// failing.
	Backlog int

	// StopBroker stops the broker (all of it: the adapter must see it
	// gone) and returns once it is down; StartBroker starts it again with
	// its data (topics, queues, streams, committed positions) and returns
	// once it accepts connections. Both nil when the test cannot restart
	// the broker; the BrokerRestart subtest is then skipped.
	StopBroker  func(t *testing.T)
	StartBroker func(t *testing.T)

	// KnownBugs maps a subtest name (e.g. "Headers") to a description of
	// a known adapter bug that makes it fail. Such subtests are skipped
	// with that description unless DELAYBRIDGE_CONFORMANCE_STRICT=1.
	KnownBugs map[string]string
}

// Message is what Harness.Publish publishes.
type Message struct {
	// Headers in order; the same key may appear twice only when
	// Features.DuplicateHeaders, and values hold arbitrary bytes only when
	// Features.BinaryHeaders.
	Headers envelope.Headers
	Body    []byte
	// Key is the Kafka record key (nil: none); only when Features.Keys.
	// Several messages of one subtest share a key when their order
	// matters, so that a partitioned broker keeps them in one partition.
	Key []byte
	// NativeID is the broker's own message ID property (AMQP message_id);
	// "" means none. Set only when Features.NativeID != "".
	NativeID string
}

// Features says what the broker and adapter promise. The suite checks
// exactly these promises: a feature that is false is either skipped or
// checked to be absent (e.g. PublishedAt false: Incoming.PublishedAt must
// be zero, as the contract says for AMQP).
type Features struct {
	// AtLeastOnce: a message read but not acknowledged is delivered again
	// after Close and a new Open (false: core NATS, which keeps nothing).
	AtLeastOnce bool
	// Nack: AckFunc(ctx, err) with err != nil brings the message back to
	// the same open Source (JetStream Nak, AMQP nack with requeue; Kafka
	// with the Kafka Source: the partition is read again from the nacked record
	// after a short pause, later records included, which AckIndividually
	// false allows). False when only a reopen reads it again.
	Nack bool
	// AckIndividually: acknowledging a message settles it alone, whatever
	// happened to earlier ones (JetStream, AMQP). Kafka: false, it commits
	// an offset only when every earlier offset of its partition is done,
	// so an acknowledged record after an unacknowledged one is read again.
	AckIndividually bool
	// Ordered: messages with the same Key (or all messages, without Keys)
	// are read in publish order, when nothing fails.
	Ordered bool
	// PublishedAt: Incoming.PublishedAt is the broker's publish time with
	// sub-second precision (Kafka record timestamp, JetStream time).
	PublishedAt bool
	// Keys: Message.Key reaches Incoming.Key (Kafka). Without it,
	// Incoming.Key must be nil.
	Keys bool
	// Origin is what Incoming.Origin holds (envelope.Origin): OriginLog,
	// a Log and Pos unique per message and the same when it is delivered
	// again (Kafka topic/partition and offset, JetStream stream and
	// sequence); OriginPrint, a Print that is the same when it is delivered
	// again, with Incoming.Redelivered set then and only then (AMQP);
	// OriginNone, the zero Origin and never Redelivered (core NATS).
	Origin OriginKind
	// NativeID names the broker property the adapter reads into
	// Incoming.NativeID (AMQP: "message_id"); "" when none, and then
	// Incoming.NativeID must be "".
	NativeID string
	// DuplicateHeaders: a header key may appear more than once and every
	// value arrives, in order (Kafka, NATS; not an AMQP table).
	DuplicateHeaders bool
	// BinaryHeaders: header values may hold any bytes, CR, LF, NUL and
	// leading spaces included (Kafka, AMQP; not NATS, whose headers are
	// text lines).
	BinaryHeaders bool
	// Tombstones: a message published without a body (Message.Body nil)
	// arrives with Incoming.Tombstone set (Kafka: a record with a null
	// value). Without it, Incoming.Tombstone is never set.
	Tombstones bool
	// MaxBody is the largest body the broker takes as configured in the
	// test (0: 1 MiB, the contract's default limits.max_payload_bytes).
	// NATS's default max_payload of 1 MiB includes the headers.
	MaxBody int
}

// StrictEnv is the environment variable that makes Run run the subtests
// listed in Harness.KnownBugs too.
const StrictEnv = "DELAYBRIDGE_CONFORMANCE_STRICT"

// IDHeader is the header the suite adds to every message it publishes, to
// recognise it (value: a decimal sequence number unique within one Run).
// Adapters must deliver it like any other header.
const IDHeader = "ingesttest-id"

// Run runs the suite as subtests of t. Subtests run one after another (they
// share the broker, and BrokerRestart stops it).
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.Open == nil || h.Publish == nil || h.SourceName == nil {
		t.Fatal("ingesttest: Harness.Open, Harness.Publish and Harness.SourceName are required")
	}
	if (h.StopBroker == nil) != (h.StartBroker == nil) {
		t.Fatal("ingesttest: set both Harness.StopBroker and Harness.StartBroker, or neither")
	}
	if h.Timeout <= 0 {
		h.Timeout = 30 * time.Second
	}
	if h.Backlog <= 0 {
		h.Backlog = 5000
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
		{"Key", s.testKey},
		{"NativeID", s.testNativeID},
		{"PublishedAt", s.testPublishedAt},
		{"Origin", s.testOrigin},
		{"SourceAndTombstone", s.testSourceAndTombstone},
		{"AckOnlyAfterSuccess", s.testAckOnlyAfterSuccess},
		{"NackRedelivers", s.testNack},
		{"Ordered", s.testOrdered},
		{"ConcurrentAcks", s.testConcurrentAcks},
		{"Backlog", s.testBacklog},
		{"ReadContext", s.testReadContext},
		{"Release", s.testRelease},
		{"Close", s.testClose},
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
	run  string       // random per Run, so that keys never collide across runs on one broker
	seq  atomic.Int64 // message sequence (IDHeader)
	keys atomic.Int64 // key sequence
}

// key returns a fresh key for the current subtest.
func (s *suite) key(t *testing.T) string {
	return conformance.Key(t, "it", s.run, s.keys.Add(1))
}

// OriginKind is what a broker's messages say of their place in its order
// (Features.Origin).
type OriginKind int

// Origin kinds.
const (
	OriginNone  OriginKind = iota // no order, no redelivery (core NATS)
	OriginLog                     // a log and a position (Kafka, JetStream)
	OriginPrint                   // a content print and a redelivered flag (AMQP)
)
