package kafkabroker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"

	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// SinkParams of a Kafka sink. BatchTimeout and BatchSize are required;
// SinkConfig.ApplyDefaults gives the defaults of the configuration.
type SinkParams struct {
	Name    string
	Brokers []string
	// BatchTimeout is how long a partial batch waits for more messages.
	BatchTimeout time.Duration
	// BatchSize is the most messages per partition and produce request.
	BatchSize int
	// Compression: none (or empty), gzip, snappy, lz4, zstd.
	Compression string
	// MaxMessageBytes is the largest record (key, value and headers with
	// their framing) the sink sends: kafka-go's batch limit, which must not
	// pass the topics' max.message.bytes. A larger message is a permanent
	// error; a topic with a smaller max.message.bytes rejects larger
	// records itself, which is permanent too. 0: DefaultMaxMessageBytes.
	MaxMessageBytes int

	// TLS and SASL, when set, secure and authenticate every connection to
	// the brokers: the writers' and Ready's (Auth makes them).
	TLS  *tls.Config
	SASL sasl.Mechanism
}

// writeAttempts and writeTimeout bound what kafka-go does with one batch:
// this many produce requests at most (a leader change or a refused
// connection is retried at once), each given this long, about 10 s in all
// with the short back-off between them (50 ms): about
// scheduler.publish_timeout's default. Publish waits for kafka-go to be
// done with its batches (write), so they also bound a publish to brokers
// that do not answer. A request is not given less (say, a share of
// publish_timeout): kafka-go sends a request it stopped waiting for again,
// which a broker slower than that would append twice.
//
// writeSlack is what the wait itself (Sink.bound) allows beyond kafka-go's
// bound on a batch and the batch's own wait for more messages: the wait
// starts before the topic's metadata is read (with the caller's deadline
// gone, a broker that accepts connections and never answers would hold a
// metadata request for good), and it must outlast kafka-go's work on the
// batch. A batch that first waited behind another batch of its partition
// (kafka-go writes a partition's batches one at a time) can outlast it:
// its publish then fails while the batch may still be written.
const (
	writeAttempts = 2
	writeTimeout  = 5 * time.Second
	writeSlack    = 2 * time.Second
)

// readyTTL is how long a Ready check is reused.
const readyTTL = time.Second

// readyTimeout bounds a Ready check: connecting, TLS, SASL and one request.
const readyTimeout = 5 * time.Second

// Sink publishes to Kafka. Create it with New.
type Sink struct {
	cfg    SinkParams
	bound  time.Duration // of the wait for kafka-go on a batch (writeSlack)
	log    *slog.Logger
	tr     *kafka.Transport
	w      *kafka.Writer // batches across callers
	solo   *kafka.Writer // one record per request, to retry a too-large batch's records alone
	dialer *kafka.Dialer

	readyMu  sync.Mutex
	readyAt  time.Time
	readyErr error
}

var _ sinks.Sink = (*Sink)(nil)
var _ sinks.Ready = (*Sink)(nil)
var _ sinks.Sizer = (*Sink)(nil)

// New returns a Sink. It does not connect: the writer connects on the first
// Publish, and Ready checks that a broker answers.
func NewSink(cfg SinkParams, log *slog.Logger) (*Sink, error) {
	if len(cfg.Brokers) == 0 {
		return nil, fmt.Errorf("kafka sink %s: no brokers", cfg.Name)
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if cfg.BatchTimeout <= 0 || cfg.BatchSize <= 0 {
		return nil, fmt.Errorf("kafka sink %s: batch timeout (%v) and batch size (%d) are required (the kafka block's defaults give them)", cfg.Name, cfg.BatchTimeout, cfg.BatchSize)
	}
	var comp kafka.Compression
	switch cfg.Compression {
	case "", "none":
	case "gzip":
		comp = kafka.Gzip
	case "snappy":
		comp = kafka.Snappy
	case "lz4":
		comp = kafka.Lz4
	case "zstd":
		comp = kafka.Zstd
	default:
		return nil, fmt.Errorf("kafka sink %s: compression %q is not one of none, gzip, snappy, lz4, zstd", cfg.Name, cfg.Compression)
	}
	log = log.With("sink", cfg.Name)
	klog := kafka.LoggerFunc(func(format string, args ...any) {
		log.Debug("kafka-go: " + fmt.Sprintf(format, args...))
	})
	tr := &kafka.Transport{
		ClientID:    "delaybridge-" + cfg.Name,
		DialTimeout: 5 * time.Second,
		// Metadata is refreshed this often, so that a topic created after
		// an "unknown topic" failure is seen soon.
		MetadataTTL: 2 * time.Second,
		TLS:         cfg.TLS,
		SASL:        cfg.SASL,
	}
	writer := func(batchSize int) *kafka.Writer {
		return &kafka.Writer{
			Addr:            kafka.TCP(cfg.Brokers...),
			Balancer:        kafka.Murmur2Balancer{},
			RequiredAcks:    kafka.RequireAll,
			BatchTimeout:    cfg.BatchTimeout,
			BatchSize:       batchSize,
			BatchBytes:      int64(cfg.MaxMessageBytes),
			Compression:     comp,
			MaxAttempts:     writeAttempts,
			WriteTimeout:    writeTimeout,
			WriteBackoffMin: 50 * time.Millisecond,
			WriteBackoffMax: 500 * time.Millisecond,
			Transport:       tr,
			ErrorLogger:     klog,
		}
	}
	return &Sink{
		cfg:    cfg,
		bound:  writeAttempts*writeTimeout + cfg.BatchTimeout + writeSlack,
		log:    log,
		tr:     tr,
		w:      writer(cfg.BatchSize),
		solo:   writer(1),
		dialer: &kafka.Dialer{Timeout: readyTimeout, ClientID: "delaybridge-" + cfg.Name, TLS: cfg.TLS, SASLMechanism: cfg.SASL},
	}, nil
}

// Publish writes msgs, each to the topic named by its Destination, and
// waits for acks=all. Each message has its own result: a message the broker
// refused fails alone. Messages for different topics are written in
// parallel; messages for one partition keep their order within a call.
//
// Permanent errors: an invalid topic name, a message over MaxMessageBytes
// or over the topic's max.message.bytes. An unknown topic is retryable (it
// may be created). Nothing is handed to kafka-go once ctx has ended; what
// was handed over before is waited for (write), so that nothing is written
// after Publish returned: a message confirmed after ctx ended has no
// error, and one that failed has ctx's error with kafka-go's.
func (s *Sink) Publish(ctx context.Context, msgs []sinks.Outgoing) []error {
	errs := make([]error, len(msgs))
	kms := make([]kafka.Message, len(msgs))
	byTopic := make(map[string][]int)
	now := time.Now()
	for i, m := range msgs {
		if err := validTopic(m.Destination); err != nil {
			errs[i] = sinks.Permanent(sinks.Because(sinks.ReasonInvalid, fmt.Errorf("kafka sink %s: %w", s.cfg.Name, err)))
			continue
		}
		kms[i] = toKafka(m, now)
		if errs[i] = s.tooLarge(&kms[i], 0); errs[i] != nil {
			continue
		}
		byTopic[m.Destination] = append(byTopic[m.Destination], i)
	}
	if len(byTopic) == 1 {
		for topic, idx := range byTopic {
			s.publishTopic(ctx, topic, kms, idx, errs)
		}
		return errs
	}
	var wg sync.WaitGroup
	for topic, idx := range byTopic {
		wg.Go(func() { s.publishTopic(ctx, topic, kms, idx, errs) })
	}
	wg.Wait()
	return errs
}

// Oversize is sinks.Sizer: Publish's refusal of a record over
// max_message_bytes, with sinks.PublishGrowth to spare.
func (s *Sink) Oversize(m sinks.Outgoing) error {
	if sinks.Within(m, s.cfg.MaxMessageBytes-sinks.PublishGrowth) {
		return nil
	}
	km := toKafka(m, time.Time{})
	return s.tooLarge(&km, sinks.PublishGrowth)
}

// tooLarge is the Permanent error of a record over max_message_bytes less
// spare bytes, or nil.
func (s *Sink) tooLarge(km *kafka.Message, spare int) error {
	if n := recordSize(km); n+spare > s.cfg.MaxMessageBytes {
		room := ""
		if spare > 0 {
			room = fmt.Sprintf(" with %d bytes to spare for what later attempts add", spare)
		}
		return sinks.Permanent(sinks.Because(sinks.ReasonTooLarge, fmt.Errorf("kafka sink %s: message of about %d bytes does not fit its max_message_bytes %d%s (raise sinks[].kafka.max_message_bytes, and the topic's max.message.bytes with it)", s.cfg.Name, n, s.cfg.MaxMessageBytes, room)))
	}
	return nil
}

// expired fails the messages idx when the caller's time is up, by the
// clock (sinks.Expired): a batch handed to the Writer is written even once
// ctx has ended, so nothing is handed to it then.
func (s *Sink) expired(ctx context.Context, idx []int, errs []error) bool {
	err := sinks.Expired(ctx)
	if err == nil {
		return false
	}
	for _, i := range idx {
		errs[i] = sinks.NotSent(fmt.Errorf("kafka sink %s: not sent: %w", s.cfg.Name, err))
	}
	return true
}

// publishTopic writes the messages kms[idx] (all for topic) and sets their
// errs entries.
func (s *Sink) publishTopic(ctx context.Context, topic string, kms []kafka.Message, idx []int, errs []error) {
	if s.expired(ctx, idx, errs) {
		return
	}
	batch := make([]kafka.Message, len(idx))
	for j, i := range idx {
		batch[j] = kms[i]
	}
	err := s.write(ctx, s.w, batch)
	if err == nil {
		return
	}
	var werrs kafka.WriteErrors
	if !errors.As(err, &werrs) || len(werrs) != len(idx) {
		// The call failed as a whole: topic metadata (unknown topic,
		// brokers unreachable), or the wait's own bound.
		for _, i := range idx {
			errs[i] = s.classify(topic, late(ctx, err))
		}
		return
	}
	var alone []int
	for j, e := range werrs {
		switch {
		case e == nil:
		case tooLarge(e):
			// The batch may be too large for the topic although each record
			// fits: try the records one by one before calling it permanent.
			alone = append(alone, idx[j])
		default:
			errs[idx[j]] = s.classify(topic, late(ctx, e))
		}
	}
	if len(alone) == 0 {
		return
	}
	if s.expired(ctx, alone, errs) {
		return
	}
	batch = batch[:0]
	for _, i := range alone {
		batch = append(batch, kms[i])
	}
	err = s.write(ctx, s.solo, batch)
	if err == nil {
		return
	}
	if !errors.As(err, &werrs) || len(werrs) != len(alone) {
		for _, i := range alone {
			errs[i] = s.classify(topic, late(ctx, err))
		}
		return
	}
	for j, e := range werrs {
		if e != nil {
			errs[alone[j]] = s.classify(topic, late(ctx, e))
		}
	}
}

// write hands batch to w and waits until w is done with it (at most
// Sink.bound), whatever ctx does. kafka-go goes on with a batch whose call
// has ended, through its attempts (writeAttempts), so a call that returned
// at ctx's end would leave the batch to be written after the caller was
// told it failed, and a message cancelled meanwhile would still arrive. So
// each message's result is kafka-go's own: confirmed late is confirmed.
func (s *Sink) write(ctx context.Context, w *kafka.Writer, batch []kafka.Message) error {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.bound)
	defer cancel()
	return w.WriteMessages(wctx, batch...)
}

// late is a message's failure err, with ctx's error first once ctx has
// ended: the caller's time ran out before the broker confirmed (a timeout,
// to the scheduler), and kafka-go's reason follows.
func late(ctx context.Context, err error) error {
	if over := sinks.Over(ctx); over != nil && !errors.Is(err, over) {
		return fmt.Errorf("%w, and the broker did not confirm: %w", over, err)
	}
	return err
}

func tooLarge(err error) bool {
	return errors.Is(err, kafka.MessageSizeTooLarge) || errors.Is(err, kafka.RecordListTooLarge)
}

// classify wraps a publish error, as permanent when retrying cannot help.
func (s *Sink) classify(topic string, err error) error {
	var ke kafka.Error
	if errors.As(err, &ke) {
		switch ke {
		case kafka.MessageSizeTooLarge, kafka.RecordListTooLarge:
			return sinks.Permanent(sinks.Because(sinks.ReasonTooLarge, fmt.Errorf("kafka sink %s: topic %q refuses the message as too large (its max.message.bytes): %w", s.cfg.Name, topic, err)))
		case kafka.InvalidTopic, kafka.InvalidRecord:
			return sinks.Permanent(sinks.Because(sinks.ReasonInvalid, fmt.Errorf("kafka sink %s: topic %q: %w", s.cfg.Name, topic, err)))
		case kafka.UnknownTopicOrPartition:
			return sinks.Rejected(sinks.Because(sinks.ReasonNotFound, fmt.Errorf("kafka sink %s: topic %q does not exist (create it; the message is retried up to scheduler.max_attempts, then dead): %w", s.cfg.Name, topic, err)))
		case kafka.TopicAuthorizationFailed:
			return sinks.Rejected(sinks.Because(sinks.ReasonUnauthorized, fmt.Errorf("kafka sink %s: not authorized to produce to topic %q: %w", s.cfg.Name, topic, err)))
		}
	}
	// A refused SASL exchange or client certificate reaches the writer as a
	// closed connection; Ready's check (cached) says which.
	var probe func() error
	if s.cfg.TLS != nil || s.cfg.SASL != nil {
		probe = s.Ready
	}
	return fmt.Errorf("kafka sink %s: topic %q: %w", s.cfg.Name, topic, Diagnose(err, probe))
}

// toKafka builds the record: body, key, and the published headers
// (x-message-id, x-delaybridge-due-at, x-delaybridge-attempt included), then
// the ingest's properties as headers (sinks.PropertyHeaders). A null value
// (a tombstone), a null header value and an empty key go out as they came
// in; kafka-go writes a nil slice as null and an empty one as empty.
func toKafka(m sinks.Outgoing, now time.Time) kafka.Message {
	hs := append(m.OutHeaders(m.Attempt), sinks.PropertyHeaders(m.Message)...)
	km := kafka.Message{
		Topic:   m.Destination,
		Key:     m.Key,
		Value:   nonNil(m.Body),
		Time:    now,
		Headers: make([]kafka.Header, len(hs)),
	}
	if m.NullBody {
		km.Value = nil
	}
	for i, h := range hs {
		km.Headers[i] = kafka.Header{Key: h.Key}
		if !h.Null {
			km.Headers[i].Value = nonNil([]byte(h.Value))
		}
	}
	return km
}

// nonNil is b, or an empty slice for nil: what kafka-go writes as empty,
// not null.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// recordSize is an upper bound of a record's size where either side
// checks it: kafka-go (its totalSize, against BatchBytes: it refuses a
// whole call when one message is over it) and the broker (a batch of this
// record alone, against the topic's max.message.bytes: the batch's header,
// then the record with each varint at its widest). So a record within
// max_message_bytes is taken by a topic whose max.message.bytes is as
// large, Kafka's default included.
func recordSize(m *kafka.Message) int {
	const (
		batchHeader = 61 // base offset, length, epoch, magic, CRC, attributes, deltas, times, producer, count
		varint      = 5  // a length or delta below 2^35
		timeDelta   = 10 // a varint of 64 bits
	)
	n := batchHeader + varint + 1 + timeDelta + varint + varint + len(m.Key) + varint + len(m.Value) + varint
	for _, h := range m.Headers {
		n += varint + len(h.Key) + varint + len(h.Value)
	}
	return n
}

// validTopic applies Kafka's topic name rules.
func validTopic(t string) error {
	if t == "" || t == "." || t == ".." || len(t) > 249 {
		return fmt.Errorf("%q is not a valid Kafka topic name", t)
	}
	for _, c := range []byte(t) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%q is not a valid Kafka topic name (letters, digits, '.', '_', '-')", t)
		}
	}
	return nil
}

// Ready returns nil when a broker accepts a connection and answers a
// request on it (with TLS and SASL when configured, so a refused
// certificate or credential shows here, saying what to check); the answer
// is reused for a second.
func (s *Sink) Ready() error {
	s.readyMu.Lock()
	defer s.readyMu.Unlock()
	if !s.readyAt.IsZero() && time.Since(s.readyAt) < readyTTL {
		return s.readyErr
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	err := Probe(ctx, s.dialer, s.cfg.Brokers)
	if err != nil {
		err = fmt.Errorf("kafka: no broker of %v accepts a connection: %w", s.cfg.Brokers, err)
	}
	s.readyErr, s.readyAt = err, time.Now()
	return err
}

// Warm fetches the cluster's metadata and opens a connection to every
// broker through the writers' transport, so that the first publish after a
// start does not pay for them. A failure is only logged: the writers
// connect on their own later, and Ready tells whether they can.
func (s *Sink) Warm(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	c := &kafka.Client{Addr: kafka.TCP(s.cfg.Brokers...), Transport: s.tr}
	md, err := c.Metadata(ctx, &kafka.MetadataRequest{})
	if err != nil {
		s.log.Debug("kafka sink: cannot warm up (the first publish connects)", "err", err)
		return
	}
	for _, b := range md.Brokers {
		addr := kafka.TCP(net.JoinHostPort(b.Host, strconv.Itoa(b.Port)))
		if _, err := c.ApiVersions(ctx, &kafka.ApiVersionsRequest{Addr: addr}); err != nil {
			s.log.Debug("kafka sink: cannot warm up a broker connection", "broker", addr, "err", err)
		}
	}
}

// Close flushes what is still batched and closes the connections. Publish
// has already waited for every acknowledgement.
func (s *Sink) Close() error {
	err := errors.Join(s.w.Close(), s.solo.Close())
	s.tr.CloseIdleConnections()
	return err
}
