package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/lifecycle"
	"github.com/delaybridge/delaybridge/pkg/logrepeat"
	"github.com/delaybridge/delaybridge/pkg/metrics"
	"github.com/delaybridge/delaybridge/pkg/sinks"
	"github.com/delaybridge/delaybridge/pkg/store"
	"github.com/delaybridge/delaybridge/pkg/tracing"
)

// Store is the part of the store a Pipeline needs (*store.Store).
type Store interface {
	Park(ctx context.Context, msgs []*envelope.Message) ([]store.ParkResult, error)
	Reject(ctx context.Context, rs []store.Rejected) ([]string, error)
	Cancel(ctx context.Context, id string) error
	CancelGroup(ctx context.Context, group string) (cancelled, inflight int, err error)
	// AcksConfirmed forgets the re-read marks of messages whose acks the
	// broker processed (AckConfirmer).
	AcksConfirmed(ctx context.Context, msgs []*envelope.Message) error
	// Ping checks that Redis answers (after a hand-back: see HandBackAfter).
	Ping(ctx context.Context) error
}

// PipelineParams configure a Pipeline.
type PipelineParams struct {
	Name string
	// Source is what the pipeline reads; or, when it is nil, Open opens it
	// at the start of Run, again with back-off while Waiting says its error
	// is one to wait out (its broker does not answer yet), Ready saying so
	// meanwhile; another error of Open ends Run with it.
	Source  Source
	Open    func(ctx context.Context) (Source, error)
	Waiting func(error) bool
	// OpenErr is why Open failed before the pipeline was made (the
	// caller's first try, which it reported): Run waits before trying
	// again, and Ready says it from the start.
	OpenErr error
	Route   *envelope.Route
	Limits  envelope.Limits
	Store   Store

	// Notify is told of every newly parked message, so that the scheduler
	// wakes early for a message due sooner than it planned. May be nil.
	Notify func(id string, due time.Time)

	// MaxInFlight bounds messages read but not yet acknowledged (the
	// ingest's max_in_flight; required): the read-ahead channel is sized so
	// that it and the batches being parked hold about that many.
	MaxInFlight int
	// DrainTimeout bounds the work done after Run's context ends: messages
	// already read are parked and acknowledged within it, or nacked
	// (required).
	DrainTimeout time.Duration

	// DeadLetter, when set, gets a copy of every rejected message.
	DeadLetter *sinks.DeadLetter

	// Capacity, when set (store.NewCapacity), is asked before messages are
	// parked, and says how many may be while Redis is near its limits
	// (limits.max_parked_messages, max_redis_memory, the ingest's
	// max_parked): the rest wait in the pipeline's waiting room (room.go).
	Capacity store.Gate

	// HandBackAfter is how long parking may fail because this process
	// cannot reach Redis (store.Unreachable) before the pipeline hands its
	// work back to the other instances: it returns what it holds unparked
	// to the broker and releases the source (ingest.Releaser), until Redis
	// answers again. 0 means DefaultHandBackAfter.
	HandBackAfter time.Duration

	// RepeatInterval is log.repeat_interval: a rejected message is logged
	// at most once per reason per interval, and an ack the broker did not
	// take once per interval, the others counted (0: each is logged).
	RepeatInterval time.Duration

	Metrics *metrics.Metrics
	Tracer  *tracing.Tracer // nil: no spans
	Logger  *slog.Logger
	Now     func() time.Time // default time.Now
}

// DefaultHandBackAfter is PipelineParams.HandBackAfter's default: long
// enough that a blip does not move the work, short against the lease
// (scheduler.lease, 30 s), which bounds the lateness of what the cut
// instance had claimed.
const DefaultHandBackAfter = 2 * time.Second

// errHandedBack is why a batch is returned to its broker: this instance
// cannot reach Redis and handed its work back.
var errHandedBack = errors.New("this instance cannot reach redis: the message is handed back to its broker for another instance")

// Pipeline reads one Source and parks what it reads.
type Pipeline struct {
	p        PipelineParams
	log      *slog.Logger
	redisErr atomic.Pointer[error]  // last Redis failure while parking, or why the waiting room fills; nil when fine
	cut      atomic.Bool            // handed back: Redis unreachable (handBack)
	room     *waitingRoom           // what waits for the store to have room (room.go)
	src      atomic.Pointer[Source] // the source; nil until Open succeeds
	openErr  atomic.Pointer[error]  // why Open has not succeeded yet

	logsMu sync.Mutex
	logs   map[string]time.Time // the first log of each name read, as recorded (nameLog)

	rejects *logrepeat.Warner // the rejections logged, per reason code (RepeatInterval)
	// ackFails are the acks the broker did not take, logged once per
	// RepeatInterval: a connection that closes fails every ack of what it
	// delivered at once.
	ackFails *logrepeat.Warner
}

// parkBatch caps messages parked per Redis round trip (at most MaxInFlight).
const parkBatch = 256

// parkWorkers is how many batches are parked at the same time, so that
// reading and parsing the next batch overlaps the Redis round trip of the
// current one. A batch that must see the parks before it (ordered) waits
// for every batch before it, and the batches after it wait for it.
const parkWorkers = 2

// ackTimeout bounds telling the broker the fate of messages (acks, nacks);
// it does not follow the pipeline's context, so that acks still go out while
// stopping.
const ackTimeout = 10 * time.Second

// NewPipeline returns a Pipeline; Run starts it.
func NewPipeline(p PipelineParams) *Pipeline {
	if p.MaxInFlight <= 0 || p.DrainTimeout <= 0 {
		panic(fmt.Sprintf("ingest.NewPipeline %s: MaxInFlight (%d) and DrainTimeout (%v) are required", p.Name, p.MaxInFlight, p.DrainTimeout))
	}
	if p.Now == nil {
		p.Now = time.Now
	}
	if p.Logger == nil {
		p.Logger = slog.Default()
	}
	if p.HandBackAfter <= 0 {
		p.HandBackAfter = DefaultHandBackAfter
	}
	pl := &Pipeline{p: p, log: p.Logger.With("ingest", p.Name), logs: map[string]time.Time{}}
	pl.rejects = logrepeat.NewWarner(pl.log, "message rejected, kept as dead", p.RepeatInterval, maxRejectKeys)
	pl.ackFails = logrepeat.NewWarner(pl.log, "cannot acknowledge the message to the broker; it may be delivered again", p.RepeatInterval, 1)
	pl.room = newWaitingRoom(p.MaxInFlight, pl.log)
	if p.OpenErr != nil {
		pl.openErr.Store(&p.OpenErr)
	}
	if p.Source != nil {
		pl.src.Store(&p.Source)
	} else if p.Open == nil {
		panic(fmt.Sprintf("ingest.NewPipeline %s: Source or Open is required", p.Name))
	}
	return pl
}

// Source returns what the pipeline reads; nil before Open succeeded.
func (pl *Pipeline) Source() Source {
	if s := pl.src.Load(); s != nil {
		return *s
	}
	return nil
}

// open opens the source (PipelineParams.Open), waiting out the errors
// Waiting names with back-off; it returns nil when ctx ends first.
func (pl *Pipeline) open(ctx context.Context) error {
	var bo lifecycle.Backoff
	if pl.openErr.Load() != nil && !bo.Wait(ctx, nil) { // the caller's try failed
		return nil
	}
	for {
		src, err := pl.p.Open(ctx)
		if err == nil {
			pl.src.Store(&src)
			pl.openErr.Store(nil)
			if bo.Failing() {
				pl.log.Info("ingest connected to its broker")
			}
			return nil
		}
		if ctx.Err() != nil {
			return nil
		}
		if pl.p.Waiting == nil || !pl.p.Waiting(err) {
			return err
		}
		if last := pl.openErr.Load(); last == nil || (*last).Error() != err.Error() {
			pl.log.Warn("ingest cannot reach its broker: it keeps trying, and the rest of the bridge runs meanwhile", "err", err)
		}
		pl.openErr.Store(&err)
		if !bo.Wait(ctx, nil) {
			return nil
		}
	}
}

// Ready returns nil when the source is connected and parking works.
func (pl *Pipeline) Ready() error {
	src := pl.Source()
	if src == nil {
		if err := pl.openErr.Load(); err != nil {
			why := strings.TrimPrefix((*err).Error(), "ingest "+pl.p.Name+": ") // the opener's error may name the ingest
			return fmt.Errorf("ingest %s: its broker does not answer; connecting: %s", pl.p.Name, why)
		}
		return fmt.Errorf("ingest %s: connecting to its broker", pl.p.Name)
	}
	if r, ok := src.(Ready); ok {
		if err := r.Ready(); err != nil {
			return fmt.Errorf("ingest %s: %w", pl.p.Name, err)
		}
	}
	if err := pl.Paused(); err != nil {
		if pl.cut.Load() {
			return fmt.Errorf("ingest %s: redis unreachable from this instance, its work handed back to the others until it answers: %w", pl.p.Name, err)
		}
		return fmt.Errorf("ingest %s: paused: %w", pl.p.Name, err)
	}
	return nil
}

// Paused returns why the pipeline waits before parking (a limit is reached
// or Redis refuses parks), or nil while parking works. While Redis refuses
// parks it reads and acknowledges nothing: the broker keeps the messages;
// while the store is full it parks nothing and goes on reading, so that
// cancels go through (room.go).
func (pl *Pipeline) Paused() error {
	if err := pl.room.waitingErr(); err != nil {
		return err
	}
	if e := pl.redisErr.Load(); e != nil {
		return *e
	}
	return nil
}

type item struct {
	in  *envelope.Incoming
	ack AckFunc
	at  time.Time // moment of ingest
}

// Run reads and parks until ctx ends or the source fails. When ctx ends it
// stops reading, parks and acknowledges what was already read (within
// DrainTimeout), and returns nil.
func (pl *Pipeline) Run(ctx context.Context) error {
	if pl.Source() == nil {
		if err := pl.open(ctx); err != nil || pl.Source() == nil {
			return err // nil: stopped before the broker answered
		}
	}
	// Messages in flight: those waiting in the channel plus a batch per worker.
	maxBatch := min(parkBatch, pl.p.MaxInFlight)
	items := make(chan item, max(1, pl.p.MaxInFlight-parkWorkers*maxBatch))
	readErr := make(chan error, 1)
	go func() {
		defer close(items)
		readErr <- pl.read(ctx, items)
	}()

	// Work on messages already read survives ctx, bounded by DrainTimeout.
	work, cancelWork := lifecycle.DrainContext(ctx, pl.p.DrainTimeout)
	defer cancelWork()

	roomDone := make(chan struct{})
	go func() {
		defer close(roomDone)
		pl.parkRoom(work)
	}()
	sumCtx, stopSum := context.WithCancel(work) // on through the drain
	var sums sync.WaitGroup
	sums.Go(func() { pl.rejects.Run(sumCtx, pl.p.Now) })
	sums.Go(func() { pl.ackFails.Run(sumCtx, pl.p.Now) })
	defer func() { stopSum(); sums.Wait() }()
	defer func() { cancelWork(); <-roomDone }()

	workers := make(chan struct{}, parkWorkers)
	var running sync.WaitGroup
	for it := range items {
		batch := make([]item, 1, maxBatch)
		batch[0] = it
		inOrder := ordered(it)
	more:
		for len(batch) < maxBatch {
			select {
			case it, ok := <-items:
				if !ok {
					break more
				}
				batch = append(batch, it)
				inOrder = inOrder || ordered(it)
			default:
				break more
			}
		}
		if inOrder {
			running.Wait() // every park before it is done
			pl.handle(work, batch)
			continue
		}
		workers <- struct{}{}
		running.Add(1)
		go func() {
			defer func() { <-workers; running.Done() }()
			pl.handle(work, batch)
		}()
	}
	running.Wait()
	err := <-readErr
	if ctx.Err() != nil && (errors.Is(err, ctx.Err()) || errors.Is(err, ErrClosed)) {
		return nil
	}
	return err
}

// ordered reports whether a message must see every park before it: one
// Parse may read as a control message (envelope.MayControl: a cancel, a
// group cancel, a tombstone), or a replacement from a broker without a log
// (AMQP), of which the one parked later is the newer (envelope.Origin):
// parked in read order, the later publish wins.
func ordered(it item) bool {
	if envelope.MayControl(it.in) {
		return true
	}
	_, replace := it.in.Headers.Get(envelope.HeaderReplace)
	return replace && it.in.Origin.Log == ""
}

// LogRecorder is implemented by a Store that records the first log of
// each name it read (store.Store): a message of a log created again (one
// whose creation time is not the recorded one, envelope.Incoming's
// LogCreated) is read under the log name "<name>@<its creation time, Unix
// ms in base 36>", so that the IDs derived from its positions, which
// start anew, are not those of the old log's messages (which the dedupe
// window remembers, or which are still parked: taken for re-reads of them
// and dropped). The first log of a name keeps it, as the previous release
// names it.
type LogRecorder interface {
	FirstLog(ctx context.Context, log string, created time.Time) (time.Time, error)
}

// nameLog renames the log of in when it is not the first of its name
// (LogRecorder). What it could not learn (Redis not answering) leaves the
// name as it is: the park that follows fails too, and the message comes
// back.
func (pl *Pipeline) nameLog(ctx context.Context, in *envelope.Incoming) {
	rec, ok := pl.p.Store.(LogRecorder)
	if !ok || in.Origin.Log == "" || in.LogCreated.IsZero() {
		return
	}
	pl.logsMu.Lock()
	first, known := pl.logs[in.Origin.Log]
	pl.logsMu.Unlock()
	if !known {
		var err error
		if first, err = rec.FirstLog(ctx, in.Origin.Log, in.LogCreated); err != nil {
			pl.log.Debug("cannot read the first log of this name; reading it under its name", "log", in.Origin.Log, "err", err)
			return
		}
		pl.logsMu.Lock()
		pl.logs[in.Origin.Log] = first
		pl.logsMu.Unlock()
	}
	if in.LogCreated.UnixMilli() != first.UnixMilli() {
		in.Origin.Log += "@" + strconv.FormatInt(in.LogCreated.UnixMilli(), 36)
	}
}

func (pl *Pipeline) read(ctx context.Context, items chan<- item) error {
	for {
		in, ack, err := pl.Source().Read(ctx)
		if err != nil {
			return err
		}
		pl.nameLog(ctx, in)
		select {
		case items <- item{in: in, ack: ack, at: pl.p.Now()}:
		case <-ctx.Done():
			actx, cancel := context.WithTimeout(context.Background(), ackTimeout)
			pl.acknowledge(actx, ack, ctx.Err())
			cancel()
			return ctx.Err()
		}
	}
}

// handle parks one batch and then acknowledges each of its messages. The
// batch is applied in order: a cancel sees every park before it, so parks
// pending when a cancel comes are flushed first.
func (pl *Pipeline) handle(ctx context.Context, batch []item) {
	if pl.cut.Load() {
		pl.nackAll(batch, errHandedBack) // handed back: another instance parks them
		return
	}
	var (
		parks   []*envelope.Message
		rejects []store.Rejected
		codes   []envelope.Code
	)
	rejected := func(m *envelope.Message, err error) {
		rejects = append(rejects, store.Rejected{Message: m, Reason: err.Error()})
		codes = append(codes, envelope.CodeOf(err))
	}
	var marked []*envelope.Message // parked: their re-read marks go once their acks are confirmed
	var markedAt []int             // the batch index of each of marked
	var parkAt []int               // the batch index of each of parks
	held := map[int]bool{}         // batch indexes that went to the waiting room
	// flush parks what is pending, so that a control message sees every
	// park before it in the batch; while the store is full, it puts them
	// in the waiting room instead (room.go).
	flush := func() error {
		if len(parks) == 0 {
			return nil
		}
		defer func() { parks, parkAt = parks[:0], parkAt[:0] }()
		take, done, why := pl.roomFor(ctx, len(parks))
		if take == 0 && why != nil && !errors.Is(why, store.ErrFull) {
			// The limits cannot be read: wait for them, as for any Redis
			// failure.
			marked, markedAt = append(marked, parks...), append(markedAt, parkAt...)
			refused, err := pl.park(ctx, parks)
			for _, r := range refused {
				rejected(r.m, r.err)
			}
			return err
		}
		if take > 0 {
			marked, markedAt = append(marked, parks[:take]...), append(markedAt, parkAt[:take]...)
			refused, err := pl.parkChecked(ctx, parks[:take])
			done()
			for _, r := range refused {
				rejected(r.m, r.err)
			}
			if err != nil {
				return err
			}
		}
		if take == len(parks) {
			return nil
		}
		ws := make([]waiting, 0, len(parks)-take)
		for j, m := range parks[take:] {
			ws = append(ws, waiting{m: m, it: batch[parkAt[take+j]], heard: time.Now()})
			held[parkAt[take+j]] = true
		}
		if !pl.room.add(ctx, ws, why) {
			return ctx.Err()
		}
		return nil
	}
	// nackAll gives back what the batch holds but for what waits in the
	// room (parked later, or cancelled there).
	nackAll := func(err error) {
		var rest []item
		for i, it := range batch {
			if !held[i] {
				rest = append(rest, it)
			}
		}
		pl.nackAll(rest, err)
	}
	for bi, it := range batch {
		d := envelope.Parse(it.in, pl.p.Route, pl.p.Limits, it.at, nil)
		switch d.Action {
		case envelope.Park:
			parks = append(parks, d.Message)
			parkAt = append(parkAt, bi)
		case envelope.Reject:
			rejected(d.Message, d.Err)
		case envelope.Cancel:
			if err := flush(); err != nil {
				nackAll(err)
				return
			}
			// Cancelled before it was parked, it never will be; a copy
			// may be parked all the same (the broker gave it again, to
			// another instance or to this one before), so the store is
			// asked too.
			waited := pl.room.takeID(d.CancelID)
			for _, w := range waited {
				pl.acknowledge(context.Background(), w.it.ack, nil)
			}
			found, late, err := pl.cancel(ctx, d.CancelID)
			if err != nil {
				nackAll(err)
				return
			}
			if found || (len(waited) > 0 && !late) {
				pl.p.Metrics.IngestMessages.WithLabelValues(pl.p.Name, "cancelled").Inc()
				pl.log.Debug("message cancelled", "id", d.CancelID, "by", d.Message.ID, "waited_for_room", len(waited))
				continue
			}
			if late {
				// Being published: a cancel cannot stop it (the contract's
				// "Cancel means never published"), and it is no mistake of
				// the publisher's to keep as dead.
				pl.p.Metrics.IngestMessages.WithLabelValues(pl.p.Name, "cancel_late").Inc()
				// Counted, logged at debug as a cancel is: no line per
				// message at info.
				pl.log.Debug("cancel came while the message was being published; it may be delivered", "id", d.CancelID, "by", d.Message.ID)
				continue
			}
			if d.Tombstone {
				// etf1's scheduler tombstones every schedule it fires, and a
				// compacted topic keeps tombstones: one for a key that is
				// not parked is normal, acknowledged and counted.
				pl.p.Metrics.IngestMessages.WithLabelValues(pl.p.Name, "tombstone_unknown").Inc()
				pl.log.Debug("tombstone for a key that is not parked, acknowledged", "id", d.CancelID)
				continue
			}
			// A cancel of an unknown ID is kept as dead: the ID may be wrong,
			// the message may have fired already, or the cancel raced ahead.
			rejected(d.Message, envelope.CancelUnknown(d.CancelID))
		case envelope.CancelGroup:
			if err := flush(); err != nil {
				nackAll(err)
				return
			}
			for _, w := range pl.room.takeGroup(d.Group) {
				pl.acknowledge(context.Background(), w.it.ack, nil) // cancelled before it was parked
			}
			var n, late int
			err := pl.retry(ctx, "cancel_group", func() (err error) {
				n, late, err = pl.p.Store.CancelGroup(ctx, d.Group)
				return err
			})
			if err != nil {
				nackAll(err)
				return
			}
			pl.p.Metrics.IngestMessages.WithLabelValues(pl.p.Name, "cancelled_group").Inc()
			pl.log.Debug("group cancelled", "group", d.Group, "messages", n, "in_flight_left", late, "by", d.Message.ID)
		}
	}
	if err := flush(); err != nil {
		nackAll(err)
		return
	}
	if err := pl.reject(ctx, rejects, codes); err != nil {
		nackAll(err)
		return
	}
	ackCtx, cancel := context.WithTimeout(context.Background(), ackTimeout)
	defer cancel()
	confirmer, confirms := pl.Source().(AckConfirmer)
	var mark uint64
	if confirms {
		mark = confirmer.AckMark()
	}
	acked := make([]bool, len(batch))
	for i, it := range batch {
		if !held[i] {
			acked[i] = pl.acknowledge(ackCtx, it.ack, nil)
		}
	}
	if confirms {
		// Only the messages whose acks went out: a failed ack (the channel
		// closed) leaves its message to be delivered again, a re-read.
		var sent []*envelope.Message
		for j, m := range marked {
			if acked[markedAt[j]] {
				sent = append(sent, m)
			}
		}
		pl.confirmAcks(ackCtx, confirmer, mark, sent)
	}
}

// confirmAcks, for a source whose acks the broker does not answer
// (AckConfirmer), waits until the broker processed the acks given since
// mark and has the store forget the re-read marks of msgs, the messages
// parked whose acks went out: a redelivery of the same content after that
// is a new message. When that cannot be known, the marks stay until the
// dedupe window ends.
func (pl *Pipeline) confirmAcks(ctx context.Context, c AckConfirmer, mark uint64, msgs []*envelope.Message) {
	if len(msgs) == 0 {
		return
	}
	if err := c.ConfirmAcks(ctx, mark); err != nil {
		pl.log.Debug("acks not confirmed: a redelivery of their messages within the dedupe window is taken for a re-read", "err", err)
		return
	}
	if err := pl.p.Store.AcksConfirmed(ctx, msgs); err != nil {
		pl.log.Debug("cannot forget the re-read marks of confirmed acks; they end with the dedupe window", "err", err)
	}
}

// refusal is a message the store refused to park, and why (a Rejection).
type refusal struct {
	m   *envelope.Message
	err error
}

// park parks msgs in one round trip (retrying while Redis is down) and tells
// the scheduler about the new ones. It returns what the store refused, to
// reject: new recurring series past limits.max_series, and messages whose
// ID is another source's.
func (pl *Pipeline) park(ctx context.Context, msgs []*envelope.Message) (refused []refusal, err error) {
	for len(msgs) > 0 {
		take, done := len(msgs), func() {}
		if pl.p.Capacity != nil {
			// Room comes back as messages fire: look again often.
			if err := pl.retryEvery(ctx, "capacity", 500*time.Millisecond, func() (err error) {
				if take, done, err = pl.p.Capacity(ctx, len(msgs)); take > 0 {
					return nil
				}
				return err
			}); err != nil {
				return refused, err
			}
		}
		r, err := pl.parkChecked(ctx, msgs[:take])
		done()
		refused = append(refused, r...)
		if err != nil {
			return refused, err
		}
		msgs = msgs[take:]
	}
	return refused, nil
}

// parkChecked is park once the capacity let msgs through.
func (pl *Pipeline) parkChecked(ctx context.Context, msgs []*envelope.Message) (refused []refusal, err error) {
	var spans []tracing.Span
	if pl.p.Tracer != nil {
		spans = make([]tracing.Span, len(msgs))
		for i, m := range msgs {
			spans[i] = pl.p.Tracer.StartPark(ctx, m)
		}
	}
	start := time.Now()
	var results []store.ParkResult
	err = pl.retry(ctx, "park", func() (err error) {
		results, err = pl.p.Store.Park(ctx, msgs)
		return err
	})
	for _, sp := range spans {
		sp.End(err)
	}
	if err != nil {
		return nil, err
	}
	pl.p.Metrics.ParkDuration.Observe(time.Since(start).Seconds())
	pl.p.Metrics.ParkBatchSize.Observe(float64(len(msgs)))
	var counts [4]int // parked, replaced, duplicate, stale
	for i, m := range msgs {
		switch r := results[i]; r {
		case store.Parked, store.Replaced:
			counts[min(int(r)-1, 1)]++
			if pl.p.Notify != nil {
				pl.p.Notify(m.ID, m.DueAt)
			}
		case store.Queued:
			if m.Replace {
				counts[1]++
			} else {
				counts[0]++ // a new message of an ID in flight, parked once that one is delivered
			}
		case store.NotNewer:
			counts[3]++
			pl.log.Debug("replacement not newer than the parked message, ignored", "id", m.ID)
		case store.OverSeries:
			refused = append(refused, refusal{m, envelope.ErrMaxSeries})
		case store.OverSourceSeries:
			refused = append(refused, refusal{m, envelope.ErrIngestMaxSeries})
		case store.IDTaken:
			refused = append(refused, refusal{m, envelope.ErrIDTaken})
		default: // Known, Duplicate
			counts[2]++
			pl.log.Debug("message already parked or delivered, ignored", "id", m.ID, "result", r)
		}
	}
	for i, result := range []string{"parked", "replaced", "duplicate", "stale"} {
		if counts[i] > 0 {
			pl.p.Metrics.IngestMessages.WithLabelValues(pl.p.Name, result).Add(float64(counts[i]))
		}
	}
	return refused, nil
}

// cancel cancels a parked message; found is false for an unknown ID, late
// true for one being published (not cancelled).
func (pl *Pipeline) cancel(ctx context.Context, id string) (found, late bool, err error) {
	err = pl.retry(ctx, "cancel", func() error {
		err := pl.p.Store.Cancel(ctx, id)
		found, late = err == nil, errors.Is(err, store.ErrInFlight)
		if errors.Is(err, store.ErrNotFound) || late {
			return nil
		}
		return err
	})
	return found, late, err
}

// reject keeps rejected messages as dead, and copies them to the dead-letter
// sink when one is configured.
func (pl *Pipeline) reject(ctx context.Context, rejects []store.Rejected, codes []envelope.Code) error {
	if len(rejects) == 0 {
		return nil
	}
	var ids []string
	err := pl.retry(ctx, "reject", func() (err error) {
		ids, err = pl.p.Store.Reject(ctx, rejects)
		return err
	})
	if err != nil {
		return err
	}
	letters := make([]sinks.Dead, len(rejects))
	for i, r := range rejects {
		pl.rejects.Warn(string(codes[i]), pl.p.Now(), "id", ids[i], "code", string(codes[i]), "reason", r.Reason)
		pl.p.Metrics.IngestRejected.WithLabelValues(pl.p.Name, string(codes[i])).Inc()
		pl.p.Metrics.IngestMessages.WithLabelValues(pl.p.Name, "rejected").Inc()
		letters[i] = sinks.Dead{Message: r.Message, Reason: r.Reason}
	}
	pl.p.Metrics.DeadTotal.WithLabelValues("ingest").Add(float64(len(rejects)))
	pl.p.DeadLetter.Publish(ctx, letters)
	return nil
}

// maxRejectKeys bounds the reason codes the rejections' limiter keeps apart
// (there are a few dozen): a publisher that sends a thousand bad messages a
// second makes a line per reason per log.repeat_interval.
const maxRejectKeys = 256

// retry runs op until it succeeds or ctx ends, backing off from 50 ms to 5 s.
// Meanwhile the pipeline reads nothing new (its channel fills up), which is
// the back-pressure that pauses the broker consumer, and Ready reports the
// error.
func (pl *Pipeline) retry(ctx context.Context, what string, op func() error) error {
	return pl.retryEvery(ctx, what, 5*time.Second, op)
}

// retryEvery is retry with another longest wait.
//
// While Redis is unreachable from this process (store.Unreachable) for
// HandBackAfter, it hands the work back (handBack) and returns
// errHandedBack: the caller returns its batch to the broker.
func (pl *Pipeline) retryEvery(ctx context.Context, what string, longest time.Duration, op func() error) error {
	bo := lifecycle.Backoff{Min: 50 * time.Millisecond, Max: longest}
	var cutSince time.Time
	for attempt := 1; ; attempt++ {
		if pl.cut.Load() {
			return errHandedBack // another batch handed the work back meanwhile
		}
		start := time.Now()
		err := op()
		if err == nil {
			if attempt > 1 {
				pl.log.Info("parking resumed", "op", what, "attempts", attempt)
			}
			pl.redisErr.Store(nil)
			return nil
		}
		pl.redisErr.Store(&err)
		// The cut is counted from the start of the first attempt that
		// failed: an attempt against an address that does not answer fails
		// only after the client's timeouts, which may exceed HandBackAfter.
		if !store.Unreachable(err) {
			cutSince = time.Time{}
		} else {
			if cutSince.IsZero() {
				cutSince = start
			}
			if time.Since(cutSince) >= pl.p.HandBackAfter && pl.handBack(ctx, err) {
				return errHandedBack
			}
		}
		if attempt == 1 || attempt%20 == 0 {
			pl.log.Warn("cannot park; retrying (ingest paused, nothing acknowledged)", "op", what, "attempt", attempt, "err", err)
		}
		if !bo.Wait(ctx, nil) {
			return fmt.Errorf("%s: %w (gave up at shutdown: %v)", what, err, ctx.Err())
		}
	}
}

// handBack gives this instance's ingest work to the others while it cannot
// reach Redis: the source is released (ingest.Releaser: it stops fetching
// and gives back what it fetched), every batch is returned to the broker
// unparked (handle), and a watcher resumes the source once Redis answers.
// It reports false for a source that cannot be released (core NATS: there
// is nobody to give a message to), which keeps retrying instead.
func (pl *Pipeline) handBack(ctx context.Context, err error) bool {
	rel, ok := pl.Source().(Releaser)
	if !ok {
		return false
	}
	if !pl.cut.CompareAndSwap(false, true) {
		return true // handed back already
	}
	pl.log.Warn("redis unreachable from this instance: handing the ingest's work back to the other instances until it answers",
		"after", pl.p.HandBackAfter, "err", err)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackTimeout)
	if rerr := rel.Release(rctx); rerr != nil {
		pl.log.Warn("cannot release the source; what it fetched comes back after the broker's redelivery time", "err", rerr)
	}
	cancel()
	go pl.watchRedis(ctx, rel)
	return true
}

// watchRedis pings Redis until it answers, then resumes the source (until
// ctx, the pipeline's work, ends).
func (pl *Pipeline) watchRedis(ctx context.Context, rel Releaser) {
	bo := lifecycle.Backoff{Min: 100 * time.Millisecond, Max: time.Second}
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := pl.p.Store.Ping(pctx)
		cancel()
		if err == nil {
			break
		}
		if !bo.Wait(ctx, nil) {
			return
		}
	}
	bo.Reset()
	for {
		err := rel.Resume(ctx)
		if err == nil {
			break
		}
		pl.log.Warn("cannot resume the source; retrying", "err", err)
		if !bo.Wait(ctx, nil) {
			return
		}
	}
	pl.redisErr.Store(nil)
	pl.cut.Store(false)
	pl.log.Info("redis answers again: the ingest takes its share of the work again")
}

// nackAll returns a batch to the broker for redelivery. Messages of the
// batch that were parked already are parked again on redelivery: a no-op.
func (pl *Pipeline) nackAll(batch []item, err error) {
	if errors.Is(err, errHandedBack) {
		pl.p.Metrics.IngestMessages.WithLabelValues(pl.p.Name, "handed_back").Add(float64(len(batch)))
		pl.log.Debug("returning messages to the broker unparked", "count", len(batch), "err", err)
	} else {
		pl.log.Warn("returning messages to the broker unparked", "count", len(batch), "err", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), ackTimeout)
	defer cancel()
	for _, it := range batch {
		pl.acknowledge(ctx, it.ack, err)
	}
}

// acknowledge tells the broker a message's fate through its AckFunc (err
// nil: done; else deliver it again). ctx is not the pipeline's: acks are
// still sent while shutting down.
func (pl *Pipeline) acknowledge(ctx context.Context, ack AckFunc, err error) bool {
	if aerr := ack(ctx, err); aerr != nil {
		pl.ackFails.Warn("ack", pl.p.Now(), "err", aerr)
		return false
	}
	return true
}
