package natsbroker

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/destination"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// SinkParams of a NATS sink.
type SinkParams struct {
	Name      string
	URL       string
	JetStream bool
	Options   []nats.Option // authentication and TLS (AuthOptions)
	// PublishTimeout is the most time a publish is given
	// (scheduler.publish_timeout; config.DefaultPublishTimeout when 0):
	// a PubAck is not waited for longer.
	PublishTimeout time.Duration

	maxPending int // the PubAcks awaited at most; asyncMaxPending when 0 (tests set less)
}

// Sink publishes to NATS. Create it with New.
type Sink struct {
	cfg SinkParams
	nc  *nats.Conn
	js  jetstream.JetStream
	// denied are the publishes the server refused (permissions).
	denied *denials
	// maxPending is the PubAcks the sink awaits at most (nats.go's bound).
	maxPending int
	// noLookupUntil (Unix ns) skips the lookup of duplicate after one ran
	// out of time.
	noLookupUntil atomic.Int64
	// noStreamLookupUntil (Unix ns) skips noStream's lookups after one
	// ran out of time.
	noStreamLookupUntil atomic.Int64
	// lastPubAck (Unix ns) is when a PubAck last came (acked); noRespFirst
	// and noRespLast when the run of "no responders" began and its last
	// came (sawNoResponders).
	lastPubAck, noRespFirst, noRespLast atomic.Int64
	// streams are storedBy's lookups.
	streams *streamLookups

	// jsAnswers caches whether JetStream answered its last look
	// (jetStreamAnswers), until jsAnsweredUntil (Unix ns).
	jsMu            sync.Mutex
	jsAnswers       bool
	jsAnsweredUntil time.Time
}

var _ sinks.Sink = (*Sink)(nil)
var _ sinks.Ready = (*Sink)(nil)
var _ sinks.Sizer = (*Sink)(nil)

// New connects to NATS.
func NewSink(cfg SinkParams, log *slog.Logger) (*Sink, error) {
	log = log.With("sink", cfg.Name)
	// No reconnect buffer: while disconnected a publish fails at once
	// (unavailable: the scheduler holds the message for the sink) instead
	// of waiting for its deadline in nats.go's buffer and then going out on
	// reconnect anyway, a second copy beside the one the scheduler sends
	// when the sink is back.
	denied := newDenials(log)
	opts := append([]nats.Option{nats.ReconnectBufSize(-1)}, cfg.Options...)
	opts = append(opts, nats.ErrorHandler(denied.asyncErr)) // after Connect's own, which it replaces
	nc, err := Connect(cfg.URL, "delaybridge sink "+cfg.Name, log, opts...)
	if Unreachable(err) {
		// No server answers now (down, or not started yet): the sink
		// connects as soon as one does, and meanwhile is not ready, so that
		// its messages are held and the daemon's other sinks and ingests
		// go on. A server that answers and refuses (credentials, TLS) is
		// a configuration error, which stops the start.
		log.Warn("nats sink cannot reach its server: its messages are held until it connects, which it keeps trying", "err", err)
		nc, err = Connect(cfg.URL, "delaybridge sink "+cfg.Name, log, append(opts, nats.RetryOnFailedConnect(true))...)
	}
	if err != nil {
		return nil, err
	}
	s := &Sink{cfg: cfg, nc: nc, denied: denied, maxPending: cmp.Or(cfg.maxPending, asyncMaxPending), streams: newStreamLookups()}
	if !cfg.JetStream {
		log.Warn("core NATS sink (jetstream: false): a publish is not confirmed, only flushed to the server; a message is lost when no subscriber or server takes it; set jetstream: true and a stream for the destinations for at-least-once")
	}
	if cfg.JetStream {
		// A PubAck that never comes (a subscriber that takes the
		// publish and does not answer, a publish the server refused)
		// leaves its future pending in nats.go, which the sink cannot
		// take back: nats.go drops it once the publish's time is over,
		// so that what is pending is what publishes under way wait for.
		s.js, err = jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(s.maxPending),
			jetstream.WithPublishAsyncTimeout(cmp.Or(cfg.PublishTimeout, config.DefaultPublishTimeout)),
			// PubAcks and "no responders" dated as they come, not as a
			// batch waiting behind another publish reads them (classify).
			jetstream.WithPublishAsyncAckHandler(func(jetstream.JetStream, *nats.Msg, *jetstream.PubAck) { s.acked() }),
			jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *nats.Msg, err error) {
				if noResponders(err) {
					s.sawNoResponders()
				}
			}))
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("nats sink %s: jetstream: %w", cfg.Name, err)
		}
	}
	return s, nil
}

// asyncMaxPending bounds the PubAcks a sink awaits (nats.go's bound; it
// keeps each message, body and headers, until its PubAck or the publish
// timeout): a destination that never answers holds its publishes' share
// of it for the publish timeout, a healthy stream for milliseconds. What
// it holds is what publishes under way wait for, which the scheduler
// holds in memory anyway. Once it is reached, the rest of a batch is not
// sent (sinks.NotSent: published again soon, not counted) after the batch
// waited capWait in all for slots: with the default timeout, it takes
// more than 26,000 publishes a second to destinations that do not answer.
const asyncMaxPending = 1 << 18

// capWait is how long a batch waits for slots of asyncMaxPending, all its
// messages together, before the rest of it is not sent: long enough for a
// healthy stream's PubAcks to free some.
const capWait = 20 * time.Millisecond

// Publish publishes msgs. With JetStream all are sent at once and then their
// PubAcks awaited; a PubAck that reports a duplicate counts as confirmed
// when the stream holds this very version of the message (duplicate). A
// publish the server refuses (its user may not publish to the subject)
// fails as unauthorized as soon as the server says so (denials), and one
// to a subject refused within refusedFor fails so without being sent.
func (s *Sink) Publish(ctx context.Context, msgs []sinks.Outgoing) []error {
	from, _ := s.denied.mark()
	errs := make([]error, len(msgs))
	nmsgs := make([]*nats.Msg, len(msgs))
	for i, m := range msgs {
		nmsgs[i], errs[i] = toNATS(m)
		if errs[i] == nil {
			if err := s.denied.refused(nmsgs[i].Subject); err != nil {
				errs[i] = s.classify(nmsgs[i].Subject, err)
			}
		}
	}
	if s.js == nil {
		return s.publishCore(ctx, nmsgs, errs, from)
	}
	futures := make([]jetstream.PubAckFuture, len(msgs))
	var full error      // once the PubAcks awaited are at maxPending: the rest is not sent
	slotWait := capWait // what this batch may still wait for slots, all messages together
	for i, nm := range nmsgs {
		if errs[i] != nil {
			continue
		}
		if full != nil {
			errs[i] = full
			continue
		}
		if err := sinks.Expired(ctx); err != nil { // the caller's time is up: send nothing more
			errs[i] = sinks.NotSent(fmt.Errorf("nats sink %s: not sent: %w", s.cfg.Name, err))
			continue
		}
		// No retry inside the client: it would publish the message again
		// on its own timer, 250 ms after a "no responders", past the
		// caller's ctx and the claim's lease (a paused daemon's message
		// cancelled meanwhile); the scheduler retries through Redis. A
		// wait for a slot ends before the caller's time to send does, and
		// the batch's waits together last capWait at most.
		wait := min(slotWait, sinks.Left(ctx))
		if wait <= 0 {
			wait = time.Nanosecond // nats.go's option takes no zero: as good as none
		}
		begun := time.Now()
		futures[i], errs[i] = s.js.PublishMsgAsync(nm, jetstream.WithRetryAttempts(0), jetstream.WithStallWait(wait))
		slotWait -= time.Since(begun)
		if errors.Is(errs[i], jetstream.ErrTooManyStalledMsgs) { // registered nothing, sent nothing
			full = sinks.NotSent(fmt.Errorf("nats sink %s: not sent: %d PubAcks awaited, the most a sink waits for (destinations that do not answer hold theirs for up to scheduler.publish_timeout): %w",
				s.cfg.Name, s.maxPending, errs[i]))
			futures[i], errs[i] = nil, full
			continue
		}
		errs[i] = s.publishErr(errs[i])
	}
	var lost map[string][]int // subject -> the messages whose PubAck did not come
	noPubAck := func(i int, why error) {
		errs[i] = fmt.Errorf("nats sink %s: no PubAck for %q within the publish timeout: %w", s.cfg.Name, nmsgs[i].Subject, why)
		if lost == nil {
			lost = map[string][]int{}
		}
		lost[nmsgs[i].Subject] = append(lost[nmsgs[i].Subject], i)
	}
	var unanswered []int // "no responders": classified once the batch's PubAcks are in
	failed := func(i int, err error) {
		if errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
			// nats.go stopped waiting before the caller did (its time,
			// the publish timeout, counts from just before the send,
			// so this is rare): the publish timed out.
			noPubAck(i, fmt.Errorf("%w (%w)", context.DeadlineExceeded, err))
			return
		}
		if noResponders(err) {
			// Dated as it came (NewSink's handler, which nats.go may run
			// only after this reads it: here too, then).
			s.sawNoResponders()
			errs[i], unanswered = err, append(unanswered, i)
			return
		}
		errs[i] = s.unconfirmed(nmsgs[i].Subject, err)
	}
	for i, f := range futures {
		if f == nil {
			continue
		}
		// What has answered counts before ctx: once ctx ended, waiting for a
		// PubAck that never came must not turn one that did into a failure
		// (the message would be published again).
		select {
		case ack := <-f.Ok():
			s.acked() // nats.go may run its handler only after this reads it
			errs[i] = s.duplicate(ctx, msgs[i], nmsgs[i], ack)
			continue
		case err := <-f.Err():
			failed(i, err)
			continue
		default:
		}
	wait:
		for {
			// The refusals so far, then a wait that ends at the next. (One
			// that may have been dropped is no reason to stop waiting for a
			// PubAck: a publish refused has none, and times out.)
			_, wake := s.denied.mark()
			if err := s.denied.since(from, nmsgs[i].Subject); err != nil && err != errRefusalsLost {
				errs[i] = s.classify(nmsgs[i].Subject, err) // no PubAck comes for it
				break wait
			}
			select {
			case ack := <-f.Ok():
				s.acked()
				errs[i] = s.duplicate(ctx, msgs[i], nmsgs[i], ack)
				break wait
			case err := <-f.Err():
				failed(i, err)
				break wait
			case <-wake:
			case <-ctx.Done():
				noPubAck(i, ctx.Err())
				break wait
			}
		}
	}
	for _, i := range unanswered {
		errs[i] = s.unconfirmed(nmsgs[i].Subject, errs[i])
	}
	s.noStream(lost, errs)
	return errs
}

// noStream asks, of the subjects whose PubAcks did not come, whether a
// stream of this account stores them, to say what to fix. A JetStream
// publish to a subject that no stream stores is refused at once ("no
// responders") unless a core NATS subscriber listens on it: that
// subscriber takes it (it gets a copy each time) and does not answer, so
// the publish times out like a stalled stream. The error stays a timeout,
// the stall it looks like to the scheduler: a stream in another JetStream
// domain or account, which this lookup does not see, may be the one that
// stalled. The lookups share duplicateLookup, past the caller's time, and
// stop at the first that does not answer, after which none is made for
// noLookupFor (a user without $JS.API.STREAM.NAMES waits out each).
func (s *Sink) noStream(lost map[string][]int, errs []error) {
	if len(lost) == 0 || time.Now().UnixNano() < s.noStreamLookupUntil.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), duplicateLookup)
	defer cancel()
	for subject, idx := range lost {
		_, err := s.js.StreamNameBySubject(ctx, subject)
		if ctx.Err() != nil {
			s.noStreamLookupUntil.Store(time.Now().Add(noLookupFor).UnixNano())
			return
		}
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		for _, i := range idx {
			errs[i] = fmt.Errorf("%w; no stream of this account stores %q: if a core NATS subscriber listens on it, it takes each publish without answering (create a stream for it, or set jetstream: false)",
				errs[i], subject)
		}
	}
}

// duplicate settles a PubAck that may say the stream's duplicate window
// knew the message's Nats-Msg-Id (DedupeID: its ID). That is this very
// version published before (a PubAck lost, the publish tried again), or
// another version of the ID within the window, which JetStream dropped: a
// timer armed again, a replacement of a message delivered, a new series of
// the ID. The stored message tells them apart by its due time and body;
// another version is published again under a Nats-Msg-Id of its own
// (versionID), which a retry of it finds in turn. A stored message that
// cannot be read within duplicateLookup (the user may not read the
// stream: $JS.API.STREAM.INFO and MSG.GET; a work-queue stream removed it)
// counts as another version: a duplicate at worst; after a lookup that
// ran out of time, none is made for noLookupFor. Two versions of the same
// due time and body are one.
func (s *Sink) duplicate(ctx context.Context, m sinks.Outgoing, nm *nats.Msg, ack *jetstream.PubAck) error {
	if ack == nil || !ack.Duplicate || nm.Header.Get(envelope.HeaderNatsMsgID) != DedupeID(m.Message) {
		return nil
	}
	if time.Now().UnixNano() >= s.noLookupUntil.Load() {
		lctx, cancel := context.WithTimeout(ctx, duplicateLookup)
		defer cancel()
		stream, err := s.js.Stream(lctx, ack.Stream)
		var stored *jetstream.RawStreamMsg
		if err == nil {
			stored, err = stream.GetMsg(lctx, ack.Sequence)
		}
		switch {
		case err == nil && stored.Header.Get(envelope.HeaderDueAt) == nm.Header.Get(envelope.HeaderDueAt) && bytes.Equal(stored.Data, nm.Data):
			return nil
		case lctx.Err() != nil && ctx.Err() == nil: // the lookup's own time ran out, not the publish's
			// The stream cannot be read in time (no rights: nats.go waits
			// out the request): the next duplicates are published again
			// without a lookup for a while, not each after a wait.
			s.noLookupUntil.Store(time.Now().Add(noLookupFor).UnixNano())
		}
	}
	nm.Header.Set(envelope.HeaderNatsMsgID, versionID(m.Message))
	if _, err := s.js.PublishMsg(ctx, nm, jetstream.WithRetryAttempts(0)); err != nil {
		if noResponders(err) {
			s.sawNoResponders()
		}
		return s.classify(nm.Subject, s.publishErr(err))
	}
	return nil
}

// duplicateLookup bounds the reading of the stored message a duplicate
// PubAck names, out of the publish's own time: nats.go answers a request
// the user may not make only at its deadline.
const duplicateLookup = 500 * time.Millisecond

// noLookupFor is how long duplicates are published again without a lookup
// after one ran out of time.
const noLookupFor = time.Minute

// publishCore publishes msgs on core NATS and flushes: a publish the
// server refused (denials) said so before it answered the flush.
func (s *Sink) publishCore(ctx context.Context, nmsgs []*nats.Msg, errs []error, from uint64) []error {
	for i, nm := range nmsgs {
		if errs[i] != nil {
			continue
		}
		if err := sinks.Expired(ctx); err != nil { // the caller's time is up: send nothing more
			errs[i] = sinks.NotSent(fmt.Errorf("nats sink %s: not sent: %w", s.cfg.Name, err))
			continue
		}
		errs[i] = s.publishErr(s.nc.PublishMsg(nm))
	}
	if err := Flush(ctx, s.nc); err != nil {
		return sinks.Fill(errs, fmt.Errorf("nats sink %s: flush: %w", s.cfg.Name, err))
	}
	s.denied.caughtUp(ctx, s.nc.LastError())
	for i, nm := range nmsgs {
		if errs[i] != nil {
			continue
		}
		if err := s.denied.since(from, nm.Subject); err != nil {
			errs[i] = s.classify(nm.Subject, err)
		}
	}
	return errs
}

// Oversize is sinks.Sizer: what nats.go refuses (ErrMaxPayload, permanent
// in publishErr), a message whose body and headers are over the server's
// max_payload, with sinks.PublishGrowth to spare.
func (s *Sink) Oversize(m sinks.Outgoing) error {
	limit := MaxPayload(s.nc)
	if limit <= 0 || sinks.Within(m, int(min(limit, math.MaxInt32))-sinks.PublishGrowth) {
		return nil
	}
	nm, err := toNATS(m)
	if err != nil {
		return nil // not its size: Publish says what
	}
	if n := nm.Size() - len(nm.Subject); int64(n+sinks.PublishGrowth) > limit {
		return sinks.Permanent(sinks.Because(sinks.ReasonTooLarge, fmt.Errorf("nats sink %s: message of %d bytes (body and headers) does not fit the server's max_payload %d with %d bytes to spare for what later attempts add (raise max_payload in the NATS server's configuration)", s.cfg.Name, n, limit, sinks.PublishGrowth)))
	}
	return nil
}

// publishErr wraps an error of the publish call itself; what the server
// can never accept (a message over max_payload, a header nats.go cannot
// encode) is Permanent.
func (s *Sink) publishErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, nats.ErrMaxPayload), errors.Is(err, nats.ErrBadHeaderMsg):
		r := sinks.ReasonTooLarge
		if errors.Is(err, nats.ErrBadHeaderMsg) {
			r = sinks.ReasonInvalid
		}
		return sinks.Permanent(sinks.Because(r, fmt.Errorf("nats sink %s: %w", s.cfg.Name, err)))
	case errors.Is(err, nats.ErrReconnectBufExceeded):
		// No reconnect buffer (NewSink): the connection is down.
		return fmt.Errorf("nats sink %s: not connected, reconnecting: %w", s.cfg.Name, err)
	}
	return fmt.Errorf("nats sink %s: %w", s.cfg.Name, err)
}

// unconfirmed is the error of a publish to subject that was sent and whose
// PubAck did not come (the connection lost meanwhile: nats.go fails the
// pending ones with ErrDisconnected): the stream may have stored it
// (sinks.Sent), unless the server said it has no stream for it, refused
// it, or its stream did not answer (sinks.Down).
func (s *Sink) unconfirmed(subject string, err error) error {
	if err = s.classify(subject, err); sinks.IsRejected(err) || sinks.IsDown(err) {
		return err
	}
	return sinks.Sent(err)
}

// classify names the common JetStream failure of a publish to subject.
// A publish that no stream answered ("no responders": nothing stored) is
// the sink's when JetStream answers nothing, neither the account's
// questions nor a publish of the sink since the "no responders" began (a
// server shutting down, JetStream off); its stream's, down for now
// (sinks.Down), when JetStream stores the sink's other publishes
// meanwhile or a stream of the account stores the subject (a JetStream
// cluster that lost the stream's leader, or its own: storedBy, where a
// lookup with no answer is JetStream not answering); else no stream
// stores it, or a lookup cannot tell (the user may not ask, or over its
// rate): the message's fault (not_found), counted.
func (s *Sink) classify(subject string, err error) error {
	switch {
	case noResponders(err):
		return s.unanswered(subject, err)
	case errors.Is(err, nats.ErrPermissionViolation):
		return sinks.Rejected(sinks.Because(sinks.ReasonUnauthorized, fmt.Errorf("nats sink %s: not authorized to publish to this subject: %w", s.cfg.Name, err)))
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrCodeDuplicateInProcess {
		// A publish of this message ID sent before is in the stream's
		// log, not stored yet (a cluster that lost its quorum: it is
		// when the quorum is back): in doubt, neither the message's
		// refusal nor counted.
		return sinks.Again(fmt.Errorf("nats sink %s: an earlier publish of it is in process in the stream, not stored yet (its cluster without a quorum), and may be stored: %w", s.cfg.Name, err))
	}
	if errors.As(err, &apiErr) && apiErr.Code >= 400 && apiErr.Code < 500 && apiErr.Code != 408 {
		// The stream refused this message (e.g. too large for it, or a
		// header it does not allow): the message's fault.
		return sinks.Rejected(sinks.Because(apiReason(apiErr), fmt.Errorf("nats sink %s: %w", s.cfg.Name, err)))
	}
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrCodeStreamStoreFailed && !strings.Contains(apiErr.Description, "store is closed") {
		// The stream that stores the subject could not store it, with a
		// 503: full under discard new, or the message too large for its
		// file store. That is its destination's fault, not the sink's: an
		// attempt of the message, and the sink's other destinations go
		// on. A stream closing (a restart, a leader change) is not: the
		// same code, "store is closed", is left to the sink's rules.
		return sinks.Rejected(sinks.Because(apiReason(apiErr), fmt.Errorf("nats sink %s: the stream did not store it: %w (a stream at its max_msgs, max_bytes or max_msgs_per_subject with discard new refuses new messages: raise the limit, or let it discard old ones)",
			s.cfg.Name, err)))
	}
	return fmt.Errorf("nats sink %s: %w", s.cfg.Name, err)
}

// jetStreamAnswers reports whether the server's JetStream answers (its
// account information), looked at most once per jsLookEvery: a publish
// that no stream answered is then the message's subject's fault.
func (s *Sink) jetStreamAnswers() bool {
	if s.js == nil {
		return true
	}
	s.jsMu.Lock()
	defer s.jsMu.Unlock()
	if time.Now().Before(s.jsAnsweredUntil) {
		return s.jsAnswers
	}
	ctx, cancel := context.WithTimeout(context.Background(), jsLookTimeout)
	defer cancel()
	from, _ := s.denied.mark()
	_, err := s.js.AccountInfo(ctx)
	var apiErr *jetstream.APIError
	// A user who may not ask ($JS.API.INFO refused) got an answer all
	// the same: the server's, refusing the question.
	s.jsAnswers = err == nil || s.denied.since(from, accountInfoAPI) != nil || !(errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrConnectionDraining) ||
		(errors.As(err, &apiErr) && apiErr.Code == 503)) // "JetStream system temporarily unavailable": a cluster without its leader
	s.jsAnsweredUntil = time.Now().Add(jsLookEvery)
	return s.jsAnswers
}

// How often, and how long, a sink looks whether JetStream answers.
const (
	jsLookEvery   = 500 * time.Millisecond
	jsLookTimeout = time.Second
)

// accountInfoAPI is the subject of jetStreamAnswers' question, as a
// refusal of it names it.
const accountInfoAPI = jetstream.DefaultAPIPrefix + "INFO"

// othersAnswerWithin is how recent a PubAck of the sink says JetStream
// stores its publishes, whatever its account's questions get; and how long
// without a "no responders" ends a run of them.
const othersAnswerWithin = 2 * time.Second

// noResponders reports whether no stream answered a JetStream publish.
func noResponders(err error) bool {
	return errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders)
}

// acked records that a PubAck came.
func (s *Sink) acked() { s.lastPubAck.Store(time.Now().UnixNano()) }

// sawNoResponders records a publish that no stream answered, as it comes:
// a run of them begins when none came for othersAnswerWithin.
func (s *Sink) sawNoResponders() {
	now := time.Now().UnixNano()
	if last := s.noRespLast.Swap(now); now-last >= int64(othersAnswerWithin) {
		s.noRespFirst.Store(now)
	}
}

// othersAnswer reports whether JetStream stored a publish of the sink
// after its run of "no responders" began, within othersAnswerWithin: a
// server that stopped JetStream (shutting down) stores none after.
func (s *Sink) othersAnswer() bool {
	ack := s.lastPubAck.Load()
	return ack > s.noRespFirst.Load() && time.Now().UnixNano()-ack < int64(othersAnswerWithin)
}

// unanswered classifies a publish to subject that no stream answered
// (classify).
func (s *Sink) unanswered(subject string, err error) error {
	if s.jetStreamAnswers() {
		switch stream, found := s.storedBy(subject); found {
		case lookFound:
			return sinks.Down(fmt.Errorf("nats sink %s: stream %s stores %q and does not answer (it has no leader: its servers down or cut off, or it is being moved); published again later, the attempt not counted: %w",
				s.cfg.Name, stream, subject, err))
		case lookLikely:
			return sinks.Down(fmt.Errorf("nats sink %s: no stream answered %q while stream %s, found without a leader lately, does not answer either (not looked up: over %d lookups a second); published again later, the attempt not counted: %w",
				s.cfg.Name, subject, stream, lookupRate, err))
		case lookNone, lookUnknown:
			return sinks.Rejected(sinks.Because(sinks.ReasonNotFound, fmt.Errorf("nats sink %s: no stream stores this subject (create a stream for it, or set jetstream: false): %w", s.cfg.Name, err)))
		}
		// lookUnavailable: JetStream stopped answering since
		// jetStreamAnswers looked.
	}
	if s.othersAnswer() {
		return sinks.Down(fmt.Errorf("nats sink %s: the stream that stores %q does not answer while JetStream stores the sink's other publishes (a JetStream cluster that lost the stream's leader or its own: servers down or cut off); published again later, the attempt not counted: %w",
			s.cfg.Name, subject, err))
	}
	// Nothing answers for JetStream at all: a server shutting down (it
	// stops JetStream before it closes the connections), or one whose
	// JetStream is off. The sink's fault, not the message's.
	return fmt.Errorf("nats sink %s: JetStream does not answer (the server is shutting down or restarting, its JetStream cluster has no leader, or JetStream is off): %w", s.cfg.Name, err)
}

// jsErrCodeStreamStoreFailed is the JetStream error a stream answers a
// publish it could not store with (nats-server's JSStreamStoreFailedF,
// which nats.go does not name).
const jsErrCodeStreamStoreFailed jetstream.ErrorCode = 10077

// jsErrCodeDuplicateInProcess is the JetStream error a publish gets while
// a publish of the same Nats-Msg-Id is proposed and not stored yet
// (nats-server's JSStreamDuplicateMessageConflict, a 409).
const jsErrCodeDuplicateInProcess jetstream.ErrorCode = 10158

// apiReason names a JetStream API error that refused a message.
func apiReason(e *jetstream.APIError) sinks.Reason {
	switch {
	case e.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum,
		e.ErrorCode == jsErrCodeStreamStoreFailed && strings.Contains(e.Description, "too large"):
		return sinks.ReasonTooLarge
	case e.ErrorCode == jetstream.JSErrCodeStreamNotFound || e.Code == 404:
		return sinks.ReasonNotFound
	case e.Code == 401 || e.Code == 403:
		return sinks.ReasonUnauthorized
	}
	return sinks.ReasonRejected
}

// toNATS builds the NATS message. NATS headers are text lines, so a header
// that cannot be carried exactly is a permanent error. The ingest's
// properties follow as headers (sinks.PropertyHeaders).
func toNATS(m sinks.Outgoing) (*nats.Msg, error) {
	if m.Destination == "" || strings.ContainsAny(m.Destination, " \t\r\n*>") || len(m.Destination) > maxSubject {
		// A subject over maxSubject would make the server close the
		// connection, which nats.go does not reopen: every message after
		// it held.
		why := invalidSubject(m.Destination)
		if why == "" {
			why = "it holds * or >"
		}
		return nil, sinks.Permanent(sinks.Because(sinks.ReasonInvalid, fmt.Errorf("%q is not a NATS subject to publish to: %s",
			destination.Printable(m.Destination), why)))
	}
	out, props := m.OutHeaders(m.Attempt), sinks.PropertyHeaders(m.Message)
	// The header map sized once, and one backing array for the values of
	// its keys (a key given twice appends): two allocations per message
	// where a map growing and a slice per key took nine.
	nm := &nats.Msg{Subject: m.Destination, Data: m.Body, Header: make(nats.Header, len(out)+len(props)+1)}
	vals := make([]string, 0, len(out)+len(props)+1)
	add := func(h envelope.Header) {
		if have, ok := nm.Header[h.Key]; ok {
			nm.Header[h.Key] = append(have, h.Value)
			return
		}
		vals = append(vals, h.Value)
		nm.Header[h.Key] = vals[len(vals)-1 : len(vals) : len(vals)]
	}
	for _, h := range out {
		if strings.EqualFold(h.Key, envelope.HeaderNatsMsgID) {
			continue // an earlier hop's ID field: set to this message's below
		}
		if isPublishDirective(h.Key) {
			continue // meant for the ingest's stream (nats.go's ExpectStream...), not the sink's
		}
		if reason := headerProblem(h); reason != "" {
			return nil, sinks.Permanent(sinks.Because(sinks.ReasonInvalid, fmt.Errorf("header %q cannot be sent over NATS: %s", h.Key, reason)))
		}
		add(h)
	}
	// The ingest's properties as headers; one NATS cannot carry exactly is
	// left out (the message is not failed for a field it did not ask for).
	for _, h := range props {
		if headerProblem(h) == "" {
			add(h)
		}
	}
	nm.Header.Set(envelope.HeaderNatsMsgID, DedupeID(m.Message))
	return nm, nil
}

// publishDirectives are the headers a JetStream server acts on when a
// message is published, beside Nats-Msg-Id: expectations (nats.go's
// ExpectStream, ExpectLastSequence...), a rollup, a per-message TTL, a
// counter increment, an atomic batch, a schedule, an API level, a trace;
// and the ones the server writes on messages of a stream that sources
// others or of a schedule, which it refuses from a publisher
// (Nats-Stream-Source: err_code 10227; Nats-Scheduler, Nats-Schedule-Next).
// An entry ending in "-", and Nats-Schedule, stand for every header they
// begin. A publisher sets the first for its publish to the ingest's stream; sent on
// to the sink's stream they would refuse the message (an expected stream
// of another name), purge a subject (a rollup), expire or schedule it, or
// keep it from being delivered at all (Nats-Trace-Only). The NATS sink
// leaves them out; other brokers' sinks forward them as any header.
var publishDirectives = []string{
	"Nats-Expected-", "Nats-Schedule", "Nats-Batch-", // prefixes: every header of these families
	"Nats-Rollup", "Nats-TTL", "Nats-Incr", "Nats-Required-Api-Level", "Nats-Trace-Dest", "Nats-Trace-Only",
	"Nats-Stream-Source", "Nats-Counter-Sources",
}

func isPublishDirective(key string) bool {
	if len(key) < 5 || !strings.EqualFold(key[:5], "Nats-") {
		return false
	}
	return slices.ContainsFunc(publishDirectives, func(d string) bool {
		if strings.HasSuffix(d, "-") || d == "Nats-Schedule" { // a family: Nats-Schedule-Target, Nats-Scheduler...
			return len(key) >= len(d) && strings.EqualFold(key[:len(d)], d)
		}
		return strings.EqualFold(d, key)
	})
}

// headerProblem says why NATS cannot carry h exactly, or returns "". Keys
// are printable ASCII without spaces and without the characters nats.go
// refuses; values are one text line, and nats.go trims their leading and
// trailing blanks.
func headerProblem(h envelope.Header) string {
	if h.Key == "" {
		return "empty key"
	}
	for i := 0; i < len(h.Key); i++ {
		if c := h.Key[i]; c <= ' ' || c >= 0x7f || strings.IndexByte(`"()/,:;<=>?@[\]{}`, c) >= 0 {
			return "keys must be printable ASCII without spaces or \"()/,:;<=>?@[\\]{}"
		}
	}
	if strings.ContainsAny(h.Value, "\r\n") {
		return "the value holds CR or LF (NATS headers are text lines)"
	}
	if textproto.TrimString(h.Value) != h.Value {
		return "the value starts or ends with a space or tab, which NATS drops"
	}
	return ""
}

// Ready returns nil while connected.
func (s *Sink) Ready() error { return Ready(s.nc) }

// Close closes the connection: the PubAcks still awaited (of publishes
// whose time is over) are dropped.
func (s *Sink) Close() error {
	s.nc.Close()
	return nil
}

// DedupeID is the Nats-Msg-Id of a message: its ID, so that JetStream drops
// a duplicate publish within its window; for a recurring message, its ID and
// occurrence ("ID#n"), since every occurrence carries the same x-message-id
// and JetStream would drop all but the first as duplicates.
func DedupeID(m *envelope.Message) string {
	if m.Recur != nil {
		return m.ID + "#" + strconv.Itoa(m.Recur.N)
	}
	return m.ID
}

// versionID is the Nats-Msg-Id of a version of an ID that JetStream's
// window took for another (Sink.duplicate): DedupeID and, after "@", when
// this version was taken in (Unix ms, base 36), which every publish of it
// keeps.
func versionID(m *envelope.Message) string {
	return DedupeID(m) + "@" + strconv.FormatInt(m.IngestedAt.UnixMilli(), 36)
}
