package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/metrics"
	"github.com/delaybridge/delaybridge/pkg/sinks"
	"github.com/delaybridge/delaybridge/pkg/store"
	"github.com/delaybridge/delaybridge/pkg/tracing"
)

// Store is the part of the store a Pipeline needs (*store.Store).
type Store interface {
	Park(ctx context.Context, msgs []*envelope.Message) ([]bool, error)
	Reject(ctx context.Context, rs []store.Rejected) ([]string, error)
	Cancel(ctx context.Context, id string) error
}

// PipelineParams configure a Pipeline.
type PipelineParams struct {
	Name   string
	Source Source
	Route  *envelope.Route
	Limits envelope.Limits
	Store  Store

	// Notify is told of every newly parked message, so that the scheduler
	// wakes early for a message due sooner than it planned. May be nil.
	Notify func(id string, due time.Time)

	// MaxInFlight caps messages read but not yet acknowledged (default 1000).
	MaxInFlight int
	// MaxBatch caps messages parked per Redis round trip (default 256).
	MaxBatch int
	// DrainTimeout bounds the work done after Run's context ends: messages
	// already read are parked and acknowledged within it, or nacked
	// (default 10s).
	DrainTimeout time.Duration

	// DeadLetter, when set, gets a copy of every rejected message.
	DeadLetter *sinks.DeadLetter

	Metrics *metrics.Metrics
	Tracer  *tracing.Tracer // nil: no spans
	Logger  *slog.Logger
	Now     func() time.Time // default time.Now
}

// Pipeline reads one Source and parks what it reads.
type Pipeline struct {
	p        PipelineParams
	log      *slog.Logger
	redisErr atomic.Pointer[error] // last Redis failure while parking; nil when fine
}

// NewPipeline returns a Pipeline; Run starts it.
func NewPipeline(p PipelineParams) *Pipeline {
	if p.MaxInFlight <= 0 {
		p.MaxInFlight = 1000
	}
	if p.MaxBatch <= 0 {
		p.MaxBatch = 256
	}
	if p.MaxBatch > p.MaxInFlight {
		p.MaxBatch = p.MaxInFlight
	}
	if p.DrainTimeout <= 0 {
		p.DrainTimeout = 10 * time.Second
	}
	if p.Now == nil {
		p.Now = time.Now
	}
	if p.Logger == nil {
		p.Logger = slog.Default()
	}
	return &Pipeline{p: p, log: p.Logger.With("ingest", p.Name)}
}

// Ready returns nil when the source is connected and parking works.
func (pl *Pipeline) Ready() error {
	if r, ok := pl.p.Source.(Ready); ok {
		if err := r.Ready(); err != nil {
			return fmt.Errorf("ingest %s: %w", pl.p.Name, err)
		}
	}
	if e := pl.redisErr.Load(); e != nil {
		return fmt.Errorf("ingest %s: parking fails: %w", pl.p.Name, *e)
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
	items := make(chan item, pl.p.MaxInFlight-pl.p.MaxBatch+1)
	readErr := make(chan error, 1)
	go func() {
		defer close(items)
		readErr <- pl.read(ctx, items)
	}()

	// Work on messages already read survives ctx, bounded by DrainTimeout.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stop := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(pl.p.DrainTimeout, cancelWork)
		context.AfterFunc(work, func() { t.Stop() })
	})
	defer stop()

	batch := make([]item, 0, pl.p.MaxBatch)
	for it := range items {
		batch = append(batch[:0], it)
	more:
		for len(batch) < pl.p.MaxBatch {
			select {
			case it, ok := <-items:
				if !ok {
					break more
				}
				batch = append(batch, it)
			default:
				break more
			}
		}
		pl.handle(work, batch)
	}
	err := <-readErr
	if ctx.Err() != nil && (errors.Is(err, ctx.Err()) || errors.Is(err, ErrClosed)) {
		return nil
	}
	return err
}

func (pl *Pipeline) read(ctx context.Context, items chan<- item) error {
	for {
		in, ack, err := pl.p.Source.Read(ctx)
		if err != nil {
			return err
		}
		select {
		case items <- item{in: in, ack: ack, at: pl.p.Now()}:
		case <-ctx.Done():
			pl.settle(ack, ctx.Err())
			return ctx.Err()
		}
	}
}

// handle parks one batch and then acknowledges each of its messages.
func (pl *Pipeline) handle(ctx context.Context, batch []item) {
	var (
		parks    []*envelope.Message
		rejects  []store.Rejected
		rejCodes []string
		cancels  []envelope.Decision
	)
	for _, it := range batch {
		d := envelope.Parse(it.in, pl.p.Route, pl.p.Limits, it.at, nil)
		switch d.Action {
		case envelope.Park:
			parks = append(parks, d.Message)
		case envelope.Cancel:
			cancels = append(cancels, d)
		case envelope.Reject:
			rejects = append(rejects, store.Rejected{Message: d.Message, Reason: d.Reason})
			rejCodes = append(rejCodes, d.Code)
		}
	}

	for _, c := range cancels {
		var found bool
		err := pl.retry(ctx, "cancel", func() error {
			err := pl.p.Store.Cancel(ctx, c.CancelID)
			found = err == nil
			if errors.Is(err, store.ErrNotFound) {
				return nil
			}
			return err
		})
		if err != nil {
			pl.nackAll(batch, err)
			return
		}
		if found {
			pl.p.Metrics.IngestMessages.WithLabelValues(pl.p.Name, "cancelled").Inc()
			pl.log.Debug("message cancelled", "id", c.CancelID, "by", c.Message.ID)
			continue
		}
		// A cancel of an unknown ID is kept as dead: the ID may be wrong, the
		// message may have fired already, or the cancel raced ahead of it.
		rejects = append(rejects, store.Rejected{Message: c.Message,
			Reason: fmt.Sprintf("%s: no message with ID %q is parked (unknown, already delivered, or not parked yet)", envelope.HeaderCancel, c.CancelID)})
		rejCodes = append(rejCodes, envelope.CodeCancelUnknown)
	}

	var parked []bool
	if len(parks) > 0 {
		spans := make([]tracing.Span, len(parks))
		for i, m := range parks {
			spans[i] = pl.p.Tracer.StartPark(ctx, m)
		}
		start := time.Now()
		err := pl.retry(ctx, "park", func() (err error) {
			parked, err = pl.p.Store.Park(ctx, parks)
			return err
		})
		for _, sp := range spans {
			sp.End(err)
		}
		if err != nil {
			pl.nackAll(batch, err)
			return
		}
		pl.p.Metrics.ParkDuration.Observe(time.Since(start).Seconds())
		pl.p.Metrics.ParkBatchSize.Observe(float64(len(parks)))
	}
	if len(rejects) > 0 {
		var ids []string
		err := pl.retry(ctx, "reject", func() (err error) {
			ids, err = pl.p.Store.Reject(ctx, rejects)
			return err
		})
		if err != nil {
			pl.nackAll(batch, err)
			return
		}
		letters := make([]sinks.Dead, len(rejects))
		for i, r := range rejects {
			pl.log.Warn("message rejected, kept as dead", "id", ids[i], "reason", r.Reason)
			pl.p.Metrics.IngestRejected.WithLabelValues(pl.p.Name, rejCodes[i]).Inc()
			pl.p.Metrics.IngestMessages.WithLabelValues(pl.p.Name, "rejected").Inc()
			letters[i] = sinks.Dead{Message: r.Message, Reason: r.Reason}
		}
		pl.p.Metrics.DeadTotal.WithLabelValues("ingest").Add(float64(len(rejects)))
		pl.p.DeadLetter.Publish(ctx, letters)
	}

	for i, m := range parks {
		if parked[i] {
			pl.p.Metrics.IngestMessages.WithLabelValues(pl.p.Name, "parked").Inc()
			if pl.p.Notify != nil {
				pl.p.Notify(m.ID, m.DueAt)
			}
		} else {
			pl.p.Metrics.IngestMessages.WithLabelValues(pl.p.Name, "duplicate").Inc()
			pl.log.Debug("message already parked, ignored", "id", m.ID)
		}
	}
	for _, it := range batch {
		pl.settle(it.ack, nil)
	}
}

// retry runs op until it succeeds or ctx ends, backing off from 50 ms to 5 s.
// Meanwhile the pipeline reads nothing new (its channel fills up), which is
// the back-pressure that pauses the broker consumer, and Ready reports the
// error.
func (pl *Pipeline) retry(ctx context.Context, what string, op func() error) error {
	wait := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := op()
		if err == nil {
			if attempt > 1 {
				pl.log.Info("redis is back; parking resumed", "op", what, "attempts", attempt)
			}
			pl.redisErr.Store(nil)
			return nil
		}
		pl.redisErr.Store(&err)
		if attempt == 1 || attempt%20 == 0 {
			pl.log.Warn("cannot reach redis; retrying (ingest paused, nothing acknowledged)", "op", what, "attempt", attempt, "err", err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s: %w (gave up at shutdown: %v)", what, err, ctx.Err())
		case <-t.C:
		}
		wait = min(wait*2, 5*time.Second)
	}
}

// nackAll returns a batch to the broker for redelivery.
func (pl *Pipeline) nackAll(batch []item, err error) {
	pl.log.Warn("returning messages to the broker unparked", "count", len(batch), "err", err)
	for _, it := range batch {
		pl.settle(it.ack, err)
	}
}

// settle calls an AckFunc with a short deadline of its own, so that acks are
// still sent while shutting down.
func (pl *Pipeline) settle(ack AckFunc, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if aerr := ack(ctx, err); aerr != nil {
		pl.log.Warn("cannot settle message with the broker; it may be delivered again", "err", aerr)
	}
}
