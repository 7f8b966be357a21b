package kafkabroker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ingest"
)

// SourceParams of a Kafka ingest. Every field but TLS and SASL is required;
// IngestConfig.ApplyDefaults gives the defaults of the configuration.
type SourceParams struct {
	Name    string // ingest name, for logs and the client ID
	Brokers []string
	Topic   string
	Group   string // consumer group ID

	// StartOffset is where a partition without a committed offset starts:
	// "first" or "last". The start is committed as soon as the
	// partition is assigned, so records produced after the group first saw
	// the partition are never skipped, even with "last".
	StartOffset string

	// SessionTimeout is how long the group waits for a silent member before
	// giving its partitions to another. Heartbeats are sent
	// every tenth of it.
	SessionTimeout time.Duration

	// MaxInFlightPerPartition caps the records of one partition fetched but
	// not yet acknowledged; fetching that partition pauses at the cap.
	MaxInFlightPerPartition int

	// CommitInterval is how often finished offsets are committed. They are
	// also committed when a generation ends (rebalance) and
	// on Close.
	CommitInterval time.Duration

	// TLS and SASL, when set, secure and authenticate every connection to
	// the brokers: the group coordinator's, the partition readers', the
	// offset lookups' and the topic check's (Auth makes them).
	TLS  *tls.Config
	SASL sasl.Mechanism
}

const (
	// revokeDrain bounds the wait, when a generation ends, for records
	// already handed out to be acknowledged before the offsets are committed
	// and the partitions given up. A longer wait saves duplicates but holds
	// up the rebalance of the whole group.
	revokeDrain = 3 * time.Second

	// rewindPause is the pause before a partition is re-read from a record
	// that was acknowledged with an error.
	rewindPause = 500 * time.Millisecond
)

// Source is a Kafka ingest. Create it with New.
type Source struct {
	cfg    SourceParams
	log    *slog.Logger
	dialer *kafka.Dialer
	tr     *kafka.Transport // the client's own: see New
	client *kafka.Client

	groupMu  sync.Mutex // guards cg, runDone and released
	cg       *kafka.ConsumerGroup
	groupCfg kafka.ConsumerGroupConfig
	from     *assignedFrom // what this member's assignments as leader were made from
	released bool          // Release left the group, Resume did not join it again

	// Fetched records of every partition, in fetch order per partition.
	recs chan *record

	closeOnce sync.Once
	closed    chan struct{} // closed by Close
	groupLeft chan struct{} // closed when the group is closed and left
	runDone   chan struct{} // closed when the generation loop has exited
	drain     time.Duration // revokeDrain; tests shorten it

	mu        sync.Mutex
	gen       *generation // current generation; nil between generations
	joined    bool        // a generation was joined at least once
	joinErr   error       // last error joining the group; nil once joined
	commitErr error       // last commit error; nil after a successful commit
	closeErr  error       // result of the final commit on Close
	// topicMissing: the topic watcher found no topic at its last two
	// reads. wasMissing: it did, and no generation has read the topic
	// since: the topic it reads next was created after this Source
	// started.
	topicMissing, wasMissing bool
}

var _ ingest.Source = (*Source)(nil)
var _ ingest.Ready = (*Source)(nil)

// New checks that the topic exists and joins the consumer group. Joining and
// fetching go on in the background; Ready tells whether they work.
func NewSource(ctx context.Context, cfg SourceParams, log *slog.Logger) (*Source, error) {
	if err := cfg.check(); err != nil {
		return nil, fmt.Errorf("kafka ingest %s: %w", cfg.Name, err)
	}
	log = log.With("ingest", cfg.Name, "topic", cfg.Topic, "group", cfg.Group)
	dialer := &kafka.Dialer{Timeout: 10 * time.Second, ClientID: "delaybridge-" + cfg.Name, TLS: cfg.TLS, SASLMechanism: cfg.SASL}
	if err := checkTopic(ctx, dialer, cfg.Brokers, cfg.Topic); err != nil {
		return nil, fmt.Errorf("kafka ingest %s: %w", cfg.Name, Explain(err))
	}
	start := kafka.FirstOffset
	if cfg.StartOffset == "last" {
		start = kafka.LastOffset
	}
	heartbeat := min(max(cfg.SessionTimeout/10, 100*time.Millisecond), 3*time.Second)
	klog := kafka.LoggerFunc(func(format string, args ...any) {
		log.Debug("kafka-go: " + fmt.Sprintf(format, args...))
	})
	from := &assignedFrom{}
	groupCfg := kafka.ConsumerGroupConfig{
		ID:                cfg.Group,
		Brokers:           cfg.Brokers,
		Dialer:            dialer,
		Topics:            []string{cfg.Topic},
		GroupBalancers:    leadBalancers(cfg.Topic, from),
		HeartbeatInterval: heartbeat,
		SessionTimeout:    cfg.SessionTimeout,
		RebalanceTimeout:  max(cfg.SessionTimeout, revokeDrain+5*time.Second),
		JoinGroupBackoff:  time.Second,
		// Each generation watches the topic itself (watchTopic):
		// kafka-go's watcher misses a topic created again.
		WatchPartitionChanges: false,
		StartOffset:           start,
		Logger:                klog,
		ErrorLogger:           klog,
	}
	cg, err := kafka.NewConsumerGroup(groupCfg)
	if err != nil {
		return nil, fmt.Errorf("kafka ingest %s: consumer group: %w", cfg.Name, err)
	}
	// The start offset lookups (ListOffsets) go to the partition leaders of
	// the client's cached metadata, which kafka-go refreshes only every
	// MetadataTTL, not on "not leader" answers. kafka.DefaultTransport
	// caches for 6s: a partition of a topic created (or moved) since its
	// last refresh was not fetched for that long. Its own transport with a
	// short TTL makes the retry after a second succeed.
	tr := &kafka.Transport{
		ClientID:    dialer.ClientID,
		DialTimeout: dialer.Timeout,
		MetadataTTL: time.Second,
		TLS:         cfg.TLS,
		SASL:        cfg.SASL,
	}
	s := &Source{
		cfg:       cfg,
		log:       log,
		dialer:    dialer,
		tr:        tr,
		client:    &kafka.Client{Addr: kafka.TCP(cfg.Brokers...), Timeout: 10 * time.Second, Transport: tr},
		cg:        cg,
		groupCfg:  groupCfg,
		from:      from,
		recs:      make(chan *record, 64),
		closed:    make(chan struct{}),
		groupLeft: make(chan struct{}),
		runDone:   make(chan struct{}),
		drain:     revokeDrain,
	}
	go s.run(cg, s.runDone)
	return s, nil
}

func (c *SourceParams) check() error {
	switch {
	case len(c.Brokers) == 0:
		return errors.New("no brokers")
	case c.Topic == "":
		return errors.New("no topic")
	case c.Group == "":
		return errors.New("no consumer group")
	}
	switch c.StartOffset {
	case "first", "last":
	default:
		return fmt.Errorf("start offset %q is not one of first, last", c.StartOffset)
	}
	if c.SessionTimeout <= 0 || c.MaxInFlightPerPartition <= 0 || c.CommitInterval <= 0 {
		return fmt.Errorf("session timeout (%v), max in flight per partition (%d) and commit interval (%v) are required (the kafka block's defaults give them)",
			c.SessionTimeout, c.MaxInFlightPerPartition, c.CommitInterval)
	}
	return nil
}

// checkTopicTimeout bounds checkTopic's read of a topic's partitions.
const checkTopicTimeout = 10 * time.Second

// checkTopic fails when no broker answers or the topic does not exist.
func checkTopic(ctx context.Context, d *kafka.Dialer, brokers []string, topic string) error {
	var err error
	for _, b := range brokers {
		var conn *kafka.Conn
		conn, err = d.DialContext(ctx, "tcp", b)
		if ctx.Err() != nil {
			return fmt.Errorf("stopped while checking topic %q: %w", topic, ctx.Err())
		}
		if err != nil {
			continue
		}
		// A broker that takes the connection and never answers, or a stop
		// meanwhile, must not hold the read: bounded, and ended with ctx.
		_ = conn.SetDeadline(time.Now().Add(checkTopicTimeout))
		stop := context.AfterFunc(ctx, func() { conn.Close() })
		var parts []kafka.Partition
		parts, err = conn.ReadPartitions(topic)
		stop()
		conn.Close()
		if err == nil && len(parts) == 0 {
			err = kafka.UnknownTopicOrPartition
		}
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("stopped while checking topic %q: %w", topic, ctx.Err())
		}
		if errors.Is(err, kafka.UnknownTopicOrPartition) {
			return fmt.Errorf("topic %q does not exist on %s (create it first)", topic, b)
		}
	}
	return fmt.Errorf("no broker of %v answered: %w", brokers, err)
}

var _ ingest.Releaser = (*Source)(nil)

// Release leaves the consumer group, after the final commit of what was
// acknowledged, so that the group gives this member's partitions to the
// others at once: they read on from the committed offsets, the records
// this member read and did not park among them. Records it had fetched are
// dropped; acknowledging one it handed out does nothing. The time the
// partitions take to move is the group's rebalance, bounded by the other
// members' heartbeat (session_timeout/10) and rebalance timeout. Until
// Resume joins again, Read returns nothing.
func (s *Source) Release(context.Context) error {
	s.groupMu.Lock()
	if s.released || s.isClosed() {
		s.groupMu.Unlock()
		return nil
	}
	s.released = true
	cg, done := s.cg, s.runDone
	s.groupMu.Unlock()
	cg.Close() // ends the generation (its final commit), then leaves
	<-done
	s.log.Info("kafka ingest released: left the consumer group until redis is back")
	return nil
}

// Resume joins the consumer group again after Release.
func (s *Source) Resume(context.Context) error {
	s.groupMu.Lock()
	defer s.groupMu.Unlock()
	if !s.released || s.isClosed() {
		return nil
	}
	cg, err := kafka.NewConsumerGroup(s.groupCfg)
	if err != nil {
		return fmt.Errorf("kafka ingest %s: consumer group: %w", s.cfg.Name, err)
	}
	s.cg, s.runDone, s.released = cg, make(chan struct{}), false
	go s.run(cg, s.runDone)
	s.log.Info("kafka ingest resumed: joining the consumer group")
	return nil
}

// run joins generation after generation of cg until it closes (Close,
// Release), then closes done.
func (s *Source) run(cg *kafka.ConsumerGroup, done chan struct{}) {
	defer close(done)
	for {
		kg, err := cg.Next(context.Background())
		from := s.from.take() // made by this join (if it led), or a failed one
		if errors.Is(err, kafka.ErrGroupClosed) {
			return
		}
		if err != nil {
			s.mu.Lock()
			first := s.joinErr == nil
			s.joinErr = err
			s.mu.Unlock()
			if first {
				s.log.Warn("kafka consumer group: cannot join; retrying", "err", err)
			} else {
				s.log.Debug("kafka consumer group: still cannot join", "err", err)
			}
			continue
		}
		g := newGeneration(s, kg, from)
		s.mu.Lock()
		if s.joinErr != nil {
			s.log.Info("kafka consumer group joined again")
		}
		s.gen, s.joined, s.joinErr, s.commitErr = g, true, nil, nil
		s.mu.Unlock()
		g.start()
	}
}

// endGeneration is called by g when it has ended.
func (s *Source) endGeneration(g *generation, commitErr error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gen == g {
		s.gen = nil
	}
	select {
	case <-s.closed:
		s.closeErr = commitErr
	default:
	}
}

func (s *Source) setCommitErr(err error) {
	s.mu.Lock()
	s.commitErr = err
	s.mu.Unlock()
}

func (s *Source) isClosed() bool {
	select {
	case <-s.closed:
		return true
	default:
		return false
	}
}

// Read returns the next record of any assigned partition. Records of a
// partition come in offset order; records of different partitions
// interleave.
//
// The AckFunc with a nil error marks the record finished: its offset is
// committed once every earlier record of its partition is finished too.
// With an error the record stays unfinished, so nothing from it on is
// committed; after a short pause the partition is read again from its lowest
// unfinished record (records after it come again), and a restart or the
// partition's next owner re-reads it too. An AckFunc called after the
// partition was revoked (rebalance, Close) does nothing: the new owner reads
// the record again. The AckFunc never fails: commits happen in the
// background.
func (s *Source) Read(ctx context.Context) (*envelope.Incoming, ingest.AckFunc, error) {
	for {
		if s.isClosed() {
			return nil, nil, ingest.ErrClosed
		}
		select {
		case <-s.closed:
			return nil, nil, ingest.ErrClosed
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case r := <-s.recs:
			if !r.p.handOut(r.epoch) {
				continue // its partition was revoked or rewound: stale
			}
			return r.in, r.ack, nil
		}
	}
}

// incoming converts a record of topic/partition. A null value, a null key
// and a null header value stay null (nil, Tombstone, Header.Null); an
// empty one stays empty.
func incoming(topic string, partition int, rec *kafka.Record) (*envelope.Incoming, error) {
	key, err := readBytes(rec.Key)
	if err != nil {
		return nil, fmt.Errorf("kafka record %d key: %w", rec.Offset, err)
	}
	value, err := readBytes(rec.Value)
	if err != nil {
		return nil, fmt.Errorf("kafka record %d value: %w", rec.Offset, err)
	}
	in := &envelope.Incoming{
		Body:      value,
		Key:       key,
		Origin:    envelope.Origin{Log: topic + "/" + strconv.Itoa(partition), Pos: uint64(rec.Offset)},
		Source:    topic,
		Tombstone: value == nil,
	}
	if !rec.Time.IsZero() && rec.Time.UnixMilli() > 0 {
		in.PublishedAt = rec.Time
	}
	if len(rec.Headers) > 0 {
		in.Headers = make(envelope.Headers, len(rec.Headers))
		for i, h := range rec.Headers {
			in.Headers[i] = envelope.Header{Key: h.Key, Value: string(h.Value), Null: h.Value == nil}
		}
	}
	return in, nil
}

// readBytes reads a record's key or value: nil for a null one, an empty
// slice (not nil) for an empty one.
func readBytes(b kafka.Bytes) ([]byte, error) {
	if b == nil {
		return nil, nil
	}
	defer b.Close()
	out := make([]byte, b.Len())
	_, err := io.ReadFull(b, out)
	return out, err
}

// Ready returns nil while this member is in the group, the topic exists,
// its commits succeed and its partitions can be fetched; else it says why
// not. A rebalance in progress counts as ready.
func (s *Source) Ready() error {
	if s.isClosed() {
		return ingest.ErrClosed
	}
	s.mu.Lock()
	g, joined, joinErr, commitErr, missing := s.gen, s.joined, s.joinErr, s.commitErr, s.topicMissing
	s.mu.Unlock()
	switch {
	case !joined && joinErr == nil:
		return fmt.Errorf("kafka: joining consumer group %q on %v", s.cfg.Group, s.cfg.Brokers)
	case joinErr != nil:
		return fmt.Errorf("kafka: cannot join consumer group %q on %v: %w", s.cfg.Group, s.cfg.Brokers, Explain(joinErr))
	case missing:
		return s.errTopicMissing()
	case commitErr != nil:
		return fmt.Errorf("kafka: cannot commit offsets of group %q: %w", s.cfg.Group, Explain(commitErr))
	case g == nil:
		return nil // between two generations: a rebalance
	}
	for _, p := range g.parts {
		if err := p.fetchError(); err != nil {
			return fmt.Errorf("kafka: cannot fetch %s/%d: %w", p.topic, p.id, Explain(err))
		}
	}
	return nil
}

// Close stops fetching, commits the offsets of the records acknowledged so
// far, and leaves the group (so that its partitions move to other members at
// once). Records read but not yet acknowledged are not committed: whoever
// reads the partition next gets them again. Close returns the final commit's
// error, or ctx.Err() if ctx ends first (the group is still left in the
// background).
func (s *Source) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		close(s.closed)
		// Ends the generation (whose last act is the final commit), then
		// leaves the group.
		s.groupMu.Lock()
		cg, released := s.cg, s.released
		s.groupMu.Unlock()
		go func() {
			if !released { // Release left the group already
				cg.Close()
			}
			close(s.groupLeft)
			<-s.done()
			s.tr.CloseIdleConnections() // also when Close returned early
		}()
	})
	select {
	case <-s.groupLeft:
	case <-ctx.Done():
		return fmt.Errorf("kafka ingest %s: close: %w", s.cfg.Name, ctx.Err())
	}
	<-s.done()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closeErr != nil {
		return fmt.Errorf("kafka ingest %s: final commit: %w", s.cfg.Name, s.closeErr)
	}
	return nil
}

// done is closed when the current generation loop has exited.
func (s *Source) done() chan struct{} {
	s.groupMu.Lock()
	defer s.groupMu.Unlock()
	return s.runDone
}

// resolveOffset turns kafka.FirstOffset or kafka.LastOffset into an absolute
// offset of the partition.
func (s *Source) resolveOffset(ctx context.Context, topic string, partition int, which int64) (int64, error) {
	req := kafka.FirstOffsetOf(partition)
	if which == kafka.LastOffset {
		req = kafka.LastOffsetOf(partition)
	}
	res, err := s.client.ListOffsets(ctx, &kafka.ListOffsetsRequest{
		Topics: map[string][]kafka.OffsetRequest{topic: {req}},
	})
	if err != nil {
		return 0, err
	}
	for _, po := range res.Topics[topic] {
		if po.Partition != partition {
			continue
		}
		if po.Error != nil {
			return 0, po.Error
		}
		if which == kafka.LastOffset {
			return po.LastOffset, nil
		}
		return po.FirstOffset, nil
	}
	return 0, fmt.Errorf("list offsets: no answer for partition %d", partition)
}
