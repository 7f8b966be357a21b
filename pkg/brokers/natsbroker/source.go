package natsbroker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ingest"
)

// SourceParams of a NATS ingest.
type SourceParams struct {
	Name    string        // ingest name, for the connection name and logs
	URL     string        // comma-separated server list
	Options []nats.Option // authentication and TLS (AuthOptions)
	Subject string
	// Stream selects JetStream; empty means core NATS. The stream is
	// created (file storage, Subject as its subject) when it does not exist.
	Stream  string
	Durable string        // JetStream durable consumer name
	AckWait time.Duration // JetStream redelivery timeout (required with a stream)
	// MaxInFlight caps unacknowledged messages (JetStream MaxAckPending);
	// core NATS buffers ten times as many before it drops. Required.
	MaxInFlight int
}

// Source is a NATS ingest. Create it with NewSource.
type Source struct {
	cfg SourceParams
	log *slog.Logger
	nc  *nats.Conn

	// JetStream
	js       jetstream.JetStream
	cons     jetstream.Consumer
	stood    standing     // where the consumer stands, to create it again there
	created  atomic.Int64 // the stream's creation time, Unix ms (envelope.Incoming.LogCreated)
	iterMu   sync.Mutex
	iter     jetstream.MessagesContext // draining after Release, then nil until Resume
	released bool                      // Release was called, Resume not yet
	resume   chan struct{}             // closed by Resume; made by Release
	// core NATS
	sub *nats.Subscription

	// lost says why the consumer, deleted under the ingest, cannot be
	// created again yet (recreate); nil while it reads.
	lost atomic.Pointer[error]

	closeOnce sync.Once
	closed    chan struct{}
}

var _ ingest.Source = (*Source)(nil)
var _ ingest.Ready = (*Source)(nil)
var _ ingest.Progresser = (*Source)(nil)

// New connects and subscribes. For JetStream it creates the stream if it is
// missing and creates or updates the durable consumer.
func NewSource(ctx context.Context, cfg SourceParams, log *slog.Logger) (*Source, error) {
	if cfg.MaxInFlight <= 0 || (cfg.Stream != "" && cfg.AckWait <= 0) {
		return nil, fmt.Errorf("nats ingest %s: max in flight (%d) and, with a stream, ack wait (%v) are required (the configuration's defaults give them)", cfg.Name, cfg.MaxInFlight, cfg.AckWait)
	}
	log = log.With("ingest", cfg.Name)
	nc, err := Connect(cfg.URL, "delaybridge ingest "+cfg.Name, log, cfg.Options...)
	if err != nil {
		return nil, err
	}
	s := &Source{cfg: cfg, log: log, nc: nc, closed: make(chan struct{})}
	s.stood.renewed = s.renewed
	if cfg.Stream == "" {
		log.Warn("core NATS ingest (no nats.stream): at most once, a message in flight during a stop or crash is lost; set nats.stream for at-least-once", "subject", cfg.Subject)
		sub, err := nc.QueueSubscribeSync(cfg.Subject, "delaybridge_"+cfg.Name)
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("nats ingest %s: subscribe %q: %w", cfg.Name, cfg.Subject, err)
		}
		_ = sub.SetPendingLimits(cfg.MaxInFlight*10, -1)
		// SUB reaches the server asynchronously, and core NATS keeps nothing
		// for a subject without subscribers: be subscribed when New returns.
		if err := Flush(ctx, nc); err != nil {
			nc.Close()
			return nil, fmt.Errorf("nats ingest %s: subscribe %q: %w", cfg.Name, cfg.Subject, err)
		}
		s.sub = sub
		return s, nil
	}
	if err := s.setupJetStream(ctx); err != nil {
		nc.Close()
		return nil, err
	}
	return s, nil
}

func (s *Source) setupJetStream(ctx context.Context) error {
	js, err := jetstream.New(s.nc)
	if err != nil {
		return fmt.Errorf("nats ingest %s: jetstream: %w", s.cfg.Name, err)
	}
	s.js = js
	stream, err := s.stream(ctx, true)
	if err != nil {
		return err
	}
	cfg := s.consumerConfig()
	if have, err := stream.Consumer(ctx, cfg.Durable); err == nil {
		// Where it starts cannot be updated: one created again after its
		// acknowledgement floor (recreate) keeps that start.
		c := have.CachedInfo().Config
		cfg.DeliverPolicy, cfg.OptStartSeq, cfg.OptStartTime = c.DeliverPolicy, c.OptStartSeq, c.OptStartTime
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, cfg)
	if err != nil {
		return s.consumerErr(err)
	}
	s.cons = cons
	s.stood.set(stream, cons)
	s.created.Store(stream.CachedInfo().Created.UnixMilli())
	iter, err := s.pull()
	if err != nil {
		return err
	}
	s.iter = iter
	return nil
}

// stream returns the ingest's stream, created when it does not exist and
// create is set.
func (s *Source) stream(ctx context.Context, create bool) (jetstream.Stream, error) {
	cfg := s.cfg
	stream, err := s.js.Stream(ctx, cfg.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) && !create {
		return nil, fmt.Errorf("nats ingest %s: stream %q not found; it is created again %s after it went, unless an operator creates it first", cfg.Name, cfg.Stream, recreateStreamAfter)
	}
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s.log.Info("creating jetstream stream", "stream", cfg.Stream, "subject", cfg.Subject)
		stream, err = s.js.CreateStream(ctx, jetstream.StreamConfig{
			Name:     cfg.Stream,
			Subjects: []string{cfg.Subject},
			Storage:  jetstream.FileStorage,
		})
	}
	if err != nil {
		return nil, fmt.Errorf("nats ingest %s: stream %q: %w", cfg.Name, cfg.Stream, err)
	}
	return stream, nil
}

// consumerConfig is the durable consumer the ingest reads, from the
// stream's first message.
func (s *Source) consumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       s.cfg.Durable,
		FilterSubject: s.cfg.Subject,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       s.cfg.AckWait,
		MaxAckPending: s.cfg.MaxInFlight,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
}

func (s *Source) consumerErr(err error) error {
	return fmt.Errorf("nats ingest %s: consumer %q on stream %q (does the stream's subjects cover %q?): %w",
		s.cfg.Name, s.cfg.Durable, s.cfg.Stream, s.cfg.Subject, err)
}

// standing is where the durable consumer stood in its stream, as this
// instance last saw it: the consumer's acknowledgement floor (shared by
// every instance reading it) and the stream's creation time. A consumer
// deleted under the ingest (by an operator, or with its stream) is
// created again from the message after that floor, so that what was
// acknowledged is not read again (a replay of the whole stream would
// deliver again everything older than the dedupe window), and what was
// not is read again (a re-read the dedupe window knows). The floor is
// read again at most every standingEvery while messages are read and
// acknowledged, and once more after the last: a message acknowledged
// since is read again, and the window drops it. The start of a consumer
// so created cannot be changed: the Sources that open it later keep it
// (setupJetStream).
type standing struct {
	mu          sync.Mutex
	cons        jetstream.Consumer
	consCreated time.Time // the consumer's creation: another one is a consumer created again
	renewed     func()    // called when a refresh finds another consumer of the name (Source.renewed)
	created     time.Time // the stream's
	floor       uint64    // the consumer's ack floor, a stream sequence
	at          time.Time // when floor was read
	busy        bool      // a refresh is under way
	trailing    bool      // a refresh is due when standingEvery has passed
}

// standingEvery is how often the floor is read again while messages are
// read: one consumer info request.
const standingEvery = 2 * time.Second

func (st *standing) set(stream jetstream.Stream, cons jetstream.Consumer) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.cons, st.created, st.consCreated = cons, stream.CachedInfo().Created, cons.CachedInfo().Created
	st.floor, st.at = cons.CachedInfo().AckFloor.Stream, time.Now()
}

// refresh reads the floor again in the background when it is older than
// standingEvery.
func (st *standing) refresh() {
	st.mu.Lock()
	if st.cons == nil {
		st.mu.Unlock()
		return
	}
	if since := time.Since(st.at); st.busy || since < standingEvery {
		// Once more when the interval has passed, so that the floor of the
		// last messages read and acknowledged is read too, traffic or not.
		if !st.trailing {
			st.trailing = true
			time.AfterFunc(max(standingEvery-since, 0)+10*time.Millisecond, func() {
				st.mu.Lock()
				st.trailing = false
				st.mu.Unlock()
				st.refresh()
			})
		}
		st.mu.Unlock()
		return
	}
	st.busy, st.at = true, time.Now()
	cons := st.cons
	st.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), standingEvery)
		defer cancel()
		info, err := cons.Info(ctx)
		st.mu.Lock()
		defer st.mu.Unlock()
		st.busy = false
		if err == nil && st.cons == cons && !info.Created.Equal(st.consCreated) && st.renewed != nil {
			// Another instance created it again (its stream too, perhaps)
			// while this one was released or disconnected.
			go st.renewed()
		} else if err == nil && st.cons == cons {
			st.floor = info.AckFloor.Stream
		}
	}()
}

// from returns where a consumer created again on stream starts: after the
// floor, or the stream's first message when the stream is not the one the
// floor was read in (deleted and created again: its sequences start anew).
func (st *standing) from(stream jetstream.Stream) (c jetstream.ConsumerConfig, seq uint64, after, another bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if another = !stream.CachedInfo().Created.Equal(st.created); another || st.floor == 0 {
		return c, 0, false, another
	}
	c.DeliverPolicy, c.OptStartSeq = jetstream.DeliverByStartSequencePolicy, st.floor+1
	return c, st.floor + 1, true, false
}

// recreate creates the consumer again after it was deleted under the
// ingest (iter, the pull that saw it, ended), and pulls from it; it tries
// until it can, the Source closes or ctx ends. Another instance may have
// created it first: then it reads that one. A stream deleted with it is
// created again only once it has been gone for recreateStreamAfter.
func (s *Source) recreate(ctx context.Context, iter jetstream.MessagesContext, why error) error {
	s.log.Warn("jetstream pull ended by the server (its consumer deleted by an operator, or with its stream); creating the consumer again", "stream", s.cfg.Stream, "consumer", s.cfg.Durable, "err", why)
	gone := fmt.Errorf("nats ingest %s: consumer %q of stream %q gone (%w); creating it again", s.cfg.Name, s.cfg.Durable, s.cfg.Stream, why)
	s.lost.Store(&gone)
	wait := 100 * time.Millisecond
	for since := time.Now(); ; {
		err := s.recreateOnce(ctx, iter, time.Since(since) >= recreateStreamAfter)
		if err == nil {
			return nil
		}
		if stop := s.stopped(ctx); stop != nil {
			return stop
		}
		s.lost.Store(&err)
		next := wait
		if left := recreateStreamAfter - time.Since(since); left > 0 && left < next {
			next = left // the stream may be created then
		}
		s.log.Warn("jetstream consumer cannot be created again; trying again", "stream", s.cfg.Stream, "consumer", s.cfg.Durable, "err", err, "in", next)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.closed:
			return ingest.ErrClosed
		case <-time.After(next):
		}
		wait = min(2*wait, 10*time.Second)
	}
}

// recreateStreamAfter is how long a stream deleted under a running ingest
// is left to its deletion before the ingest creates it again. The server
// says the consumer is gone (and the stream not found) before it has moved
// the stream's files away: a stream created in that window opens the old
// files, and the deletion then takes them from under it, leaving a stream
// that answers no publish (nats-server 2.15: "critical write error"). An
// operator who deletes a stream to create it anew has it created first.
const recreateStreamAfter = 2 * time.Second

func (s *Source) recreateOnce(ctx context.Context, iter jetstream.MessagesContext, createStream bool) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stream, err := s.stream(ctx, createStream)
	if err != nil {
		return err
	}
	cfg := s.consumerConfig()
	start, seq, after, another := s.stood.from(stream)
	if after {
		cfg.DeliverPolicy, cfg.OptStartSeq = start.DeliverPolicy, start.OptStartSeq
	}
	cons, err := stream.CreateConsumer(ctx, cfg)
	switch {
	case errors.Is(err, jetstream.ErrConsumerExists):
		cons, err = stream.Consumer(ctx, s.cfg.Durable) // another instance's
		if err != nil {
			return s.consumerErr(err)
		}
		s.log.Info("jetstream consumer created again by another instance; reading it", "stream", s.cfg.Stream, "consumer", s.cfg.Durable)
	case err != nil:
		return s.consumerErr(err)
	case after:
		s.log.Info("jetstream consumer created again after the last message acknowledged", "stream", s.cfg.Stream, "consumer", s.cfg.Durable, "from_sequence", seq)
	case another:
		s.log.Warn("jetstream stream created again: read from its first message (the IDs derived from its positions are told from the old stream's by its creation time)",
			"stream", s.cfg.Stream, "consumer", s.cfg.Durable, "created", stream.CachedInfo().Created)
	default:
		s.log.Info("jetstream consumer created again from the stream's first message: nothing was acknowledged", "stream", s.cfg.Stream, "consumer", s.cfg.Durable)
	}
	s.iterMu.Lock()
	defer s.iterMu.Unlock()
	s.cons = cons
	s.stood.set(stream, cons)
	s.created.Store(stream.CachedInfo().Created.UnixMilli())
	if s.stopped(ctx) != nil {
		return s.stopped(ctx)
	}
	if s.iter == iter && !s.released {
		next, err := s.pull()
		if err != nil {
			return err
		}
		s.iter = next
	}
	s.lost.Store(nil)
	return nil
}

// pullExpiry is how long one pull request waits at the server. The
// server's heartbeats come at half of it, and two missed (pullExpiry
// without a word) end the wait for a consumer the server no longer has:
// one deleted, with its stream, before our pull request reached it is
// never reported otherwise (nats.go's default of 30 s left such an ingest
// reading nothing for 30 s, in a third of deletions made just after a
// start). An idle ingest sends a pull request every pullExpiry.
const pullExpiry = 5 * time.Second

// pull starts fetching from the consumer.
func (s *Source) pull() (jetstream.MessagesContext, error) {
	iter, err := s.cons.Messages(jetstream.PullMaxMessages(min(s.cfg.MaxInFlight, 500)), jetstream.PullExpiry(pullExpiry))
	if err != nil {
		return nil, fmt.Errorf("nats ingest %s: pull: %w", s.cfg.Name, err)
	}
	return iter, nil
}

var _ ingest.Releaser = (*Source)(nil)

// Release stops pulling. What was pulled and not yet read is still
// returned by Read (the iterator is drained, not dropped: dropped, it
// would come back only after the ack wait), for the caller to give back
// with its AckFunc (a Nak, delivered to another instance at once); then
// Read blocks until Resume. Core NATS has nothing to give back.
//
// It returns when the server has the unsubscribe (or after
// unsubscribeWait, or when ctx ends): the iterator drains from a goroutine
// of its own, and until the server has its UNSUB a pull request of ours
// still takes new messages, which a released Source must leave to the
// others (seen on a busy machine: one message published after Release
// came to it).
func (s *Source) Release(ctx context.Context) error {
	s.iterMu.Lock()
	if s.released || s.sub != nil {
		s.iterMu.Unlock()
		return nil
	}
	iter := s.iter
	iter.Drain()
	s.released, s.resume = true, make(chan struct{})
	s.iterMu.Unlock()
	s.log.Info("jetstream ingest released: pulling stopped until redis is back")
	ctx, cancel := context.WithTimeout(ctx, unsubscribeWait)
	defer cancel()
	return unsubscribed(ctx, iter)
}

// unsubscribeWait bounds Release's wait for the server: one round trip
// when it is there; a server that has not answered in a second is away,
// and what a pull request of ours took then comes back after the ack wait.
const unsubscribeWait = time.Second

// unsubscribed waits until a drained iterator's subscription is gone,
// which nats.go's drain makes so only once the server answered the flush
// after its UNSUB. The iterator's own type says so (Closed, of nats.go's
// pull subscription); one that cannot is not waited for.
func unsubscribed(ctx context.Context, iter jetstream.MessagesContext) error {
	c, ok := iter.(interface{ Closed() <-chan struct{} })
	if !ok {
		return nil
	}
	// Closed's channel is closed by the call that finds the subscription
	// gone, not when it goes: ask again until it is.
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-c.Closed():
			return nil
		case <-ctx.Done():
			return fmt.Errorf("jetstream ingest: release: the server has not confirmed the unsubscribe: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// consumerGone reports whether the server says the consumer, or its
// stream, does not exist.
func (s *Source) consumerGone(ctx context.Context) bool {
	s.iterMu.Lock()
	cons := s.cons
	s.iterMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	was := cons.CachedInfo().Created // Info updates it
	info, err := cons.Info(ctx)
	if err == nil && !info.Created.Equal(was) {
		s.renewed() // another instance created it again
	}
	return errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound)
}

// renewed reads the stream and the consumer again when another instance
// created the consumer again (and perhaps its stream) while this one was
// released or disconnected, so that its messages say the stream they come
// from (envelope.Incoming.LogCreated) and a later re-creation starts from
// the new floor.
func (s *Source) renewed() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := s.js.Stream(ctx, s.cfg.Stream)
	if err != nil {
		return
	}
	cons, err := stream.Consumer(ctx, s.cfg.Durable)
	if err != nil {
		return
	}
	s.iterMu.Lock()
	defer s.iterMu.Unlock()
	if created := stream.CachedInfo().Created.UnixMilli(); created != s.created.Load() {
		s.log.Info("jetstream stream created again while this instance was released or disconnected; reading it", "stream", s.cfg.Stream, "created", stream.CachedInfo().Created)
	}
	s.cons = cons
	s.stood.set(stream, cons)
	s.created.Store(stream.CachedInfo().Created.UnixMilli())
}

// Resume pulls again after Release; from the consumer created again when
// it was deleted meanwhile.
func (s *Source) Resume(ctx context.Context) error {
	if s.sub == nil && s.consumerGone(ctx) {
		s.iterMu.Lock()
		iter := s.iter
		s.iterMu.Unlock()
		if err := s.recreate(ctx, iter, jetstream.ErrConsumerNotFound); err != nil {
			return err
		}
	}
	s.iterMu.Lock()
	defer s.iterMu.Unlock()
	if !s.released || s.sub != nil {
		return nil
	}
	if s.iter != nil {
		s.iter.Stop() // still draining: what it holds was read or goes back after the ack wait
	}
	iter, err := s.pull()
	if err != nil {
		return err
	}
	s.iter, s.released = iter, false
	close(s.resume)
	s.log.Info("jetstream ingest resumed")
	return nil
}

// current returns the iterator to read from, waiting while released.
func (s *Source) current(ctx context.Context) (jetstream.MessagesContext, error) {
	for {
		s.iterMu.Lock()
		iter, resume := s.iter, s.resume
		s.iterMu.Unlock()
		if iter != nil {
			return iter, nil
		}
		select {
		case <-resume:
		case <-s.closed:
			return nil, ingest.ErrClosed
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Read returns the next message.
func (s *Source) Read(ctx context.Context) (*envelope.Incoming, ingest.AckFunc, error) {
	if s.sub != nil {
		return s.readCore(ctx)
	}
	for {
		iter, err := s.current(ctx)
		if err != nil {
			return nil, nil, err
		}
		msg, err := iter.Next(jetstream.NextContext(ctx))
		if err == nil {
			return s.incomingJS(msg)
		}
		if stop := s.stopped(ctx); stop != nil {
			return nil, nil, stop
		}
		if errors.Is(err, jetstream.ErrConsumerDeleted) {
			if err := s.recreate(ctx, iter, err); err != nil {
				return nil, nil, err
			}
			continue
		}
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
			s.iterMu.Lock()
			drained := s.released && s.iter == iter
			if drained || s.iter != iter {
				if drained {
					s.iter = nil // Release drained it: wait for Resume
				}
				s.iterMu.Unlock()
				continue
			}
			s.iterMu.Unlock()
			// Ended by nats.go, not by this Source: its consumer is gone.
			if err := s.recreate(ctx, iter, err); err != nil {
				return nil, nil, err
			}
			continue
		}
		// Missed heartbeats and other pull errors while the server is
		// away: the iterator keeps pulling once the connection is back.
		// A consumer deleted meanwhile (no pull of ours waited to be told)
		// answers none of them: it is created again.
		if errors.Is(err, jetstream.ErrNoHeartbeat) && s.consumerGone(ctx) {
			if err := s.recreate(ctx, iter, jetstream.ErrConsumerNotFound); err != nil {
				return nil, nil, err
			}
			continue
		}
		s.log.Debug("jetstream pull interrupted; continuing", "err", err)
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, nil, ctx.Err()
		case <-t.C:
		}
	}
}

// stopped says why a failed read must end Read: ingest.ErrClosed when the
// Source closed, ctx's error when it ended; nil when neither, and the error
// is the read's own.
func (s *Source) stopped(ctx context.Context) error {
	select {
	case <-s.closed:
		return ingest.ErrClosed
	default:
	}
	return ctx.Err()
}

func (s *Source) incomingJS(msg jetstream.Msg) (*envelope.Incoming, ingest.AckFunc, error) {
	s.stood.refresh()
	in := &envelope.Incoming{Headers: headers(msg.Headers()), Body: msg.Data(), Source: msg.Subject(), HeaderError: jsHeaderError(msg)}
	if md, err := msg.Metadata(); err == nil {
		in.PublishedAt = md.Timestamp
		in.Origin = envelope.Origin{Log: md.Stream, Pos: md.Sequence.Stream}
		if ms := s.created.Load(); ms != 0 {
			in.LogCreated = time.UnixMilli(ms)
		}
	}
	ack := func(ctx context.Context, err error) error {
		switch {
		case errors.Is(err, ingest.ErrInProgress):
			return msg.InProgress()
		case err != nil:
			return msg.Nak()
		}
		err = msg.Ack()
		s.stood.refresh()
		return err
	}
	return in, ack, nil
}

// ProgressEvery is how often a message kept unsettled on purpose is said to
// be in progress (ingest.Progresser): a third of the consumer's ack_wait,
// so that a late turn still comes before the server delivers it again.
// Core NATS delivers nothing again: 0.
func (s *Source) ProgressEvery() time.Duration {
	if s.sub != nil {
		return 0
	}
	return s.cfg.AckWait / 3
}

func (s *Source) readCore(ctx context.Context) (*envelope.Incoming, ingest.AckFunc, error) {
	msg, err := s.sub.NextMsgWithContext(ctx)
	for errors.Is(err, nats.ErrSlowConsumer) {
		// At most once: the client dropped what did not fit in its pending
		// limit. That is a loss to report, not the end of the Source.
		dropped, _ := s.sub.Dropped()
		s.log.Warn("core NATS ingest fell behind and dropped messages (at most once; set nats.stream for at-least-once)",
			"subject", s.cfg.Subject, "dropped_total", dropped)
		msg, err = s.sub.NextMsgWithContext(ctx)
	}
	if err != nil {
		if stop := s.stopped(ctx); stop != nil {
			return nil, nil, stop
		}
		return nil, nil, fmt.Errorf("nats ingest %s: %w", s.cfg.Name, err)
	}
	in := &envelope.Incoming{Headers: headers(msg.Header), Body: msg.Data, Source: msg.Subject,
		HeaderError: headerError(msg.Header, msg.Size(), msg.Subject, msg.Reply, msg.Data)}
	return in, noAck, nil
}

// noAck acknowledges a core NATS message: there is nothing to tell the server.
func noAck(context.Context, error) error { return nil }

// headerError says why a received message's header block could not be
// decoded, "" when it was or there was none. nats.go hands such a message
// on with a nil Header and reports nats.ErrBadHeaderMsg only to the
// connection's asynchronous error handler, which cannot tell which message
// it was; what the message still shows is its size on the wire (size: the
// subject, the reply subject, the header block and the data), larger than
// its parts without a header block.
func headerError(h nats.Header, size int, subject, reply string, data []byte) string {
	if h != nil || size <= len(subject)+len(reply)+len(data) {
		return ""
	}
	return nats.ErrBadHeaderMsg.Error() + " (the header block is not NATS/1.0 followed by \"Name: value\" lines)"
}

// jsHeaderError is headerError for a JetStream message, whose interface
// does not show the size: it is read from the *nats.Msg inside. When a
// future nats.go changes that layout, it finds nothing and the message goes
// on as before (TestNATSUndecodableHeaders in test/e2e pins the detection).
func jsHeaderError(m jetstream.Msg) string {
	if m.Headers() != nil {
		return ""
	}
	v := reflect.ValueOf(m)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return ""
	}
	inner := v.Elem().FieldByName("msg")
	if !inner.IsValid() || inner.Type() != reflect.TypeFor[*nats.Msg]() || inner.IsNil() {
		return ""
	}
	wsz := inner.Elem().FieldByName("wsz")
	if !wsz.IsValid() || wsz.Kind() != reflect.Int || wsz.Int() == 0 {
		return ""
	}
	return headerError(nil, int(wsz.Int()), m.Subject(), m.Reply(), m.Data())
}

// headers converts NATS headers (a map) to envelope headers, in key order so
// that the result is deterministic.
func headers(h nats.Header) envelope.Headers {
	if len(h) == 0 {
		return nil
	}
	keys := slices.Sorted(maps.Keys(h))
	out := make(envelope.Headers, 0, len(h))
	for _, k := range keys {
		for _, v := range h[k] {
			out = append(out, envelope.Header{Key: k, Value: v})
		}
	}
	return out
}

// Ready returns nil while connected and, with JetStream, reading its
// consumer.
func (s *Source) Ready() error {
	if err := Ready(s.nc); err != nil {
		return err
	}
	if err := s.lost.Load(); err != nil {
		return *err
	}
	return nil
}

// Close stops the subscription, gives back what the pull fetched and
// nobody read, and drains the connection, so that acks already sent reach
// the server.
func (s *Source) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		close(s.closed)
		s.iterMu.Lock()
		iter := s.iter
		s.iterMu.Unlock()
		if iter != nil {
			if n := giveBack(ctx, iter); n > 0 {
				s.log.Info("jetstream ingest closed: gave back the messages fetched and not read", "count", n)
			}
		}
		if s.sub != nil {
			_ = s.sub.Unsubscribe()
		}
		// Flush pending acks and naks before closing.
		_ = Flush(ctx, s.nc)
		s.nc.Close()
	})
	return nil
}

// giveBack stops a pull (drained, so that the server has its unsubscribe
// before it returns: until then it may still deliver) and gives back with
// a Nak every message it fetched that was not read, so that the server
// delivers them to another instance at once. Dropped, they stayed pending
// until the ack wait (30 s by default): a graceful stop, in a rolling
// update for one, made them that late. It returns how many; past
// giveBackWait (or ctx) the rest is left to the ack wait.
func giveBack(ctx context.Context, iter jetstream.MessagesContext) int {
	iter.Drain()
	ctx, cancel := context.WithTimeout(ctx, giveBackWait)
	defer cancel()
	n := 0
	for {
		msg, err := iter.Next(jetstream.NextContext(ctx))
		if err != nil {
			break // drained (ErrMsgIteratorClosed), or out of time
		}
		if msg.Nak() == nil {
			n++
		}
	}
	iter.Stop()
	return n
}

// giveBackWait bounds giveBack: the drain takes one round trip to the
// server, and a busy machine may take a while for it; a server that has not
// answered in a few seconds is away, and the stop must not wait for it
// (what is left comes back after the ack wait).
const giveBackWait = 3 * time.Second
