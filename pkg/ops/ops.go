// Package ops is the one place every operation on parked and dead messages,
// groups and sinks is written: inspect, cancel, list, schedule (post),
// reschedule, fire, stats, the dead messages (list, retry, delete, purge),
// groups (show, cancel) and sinks (list, pause, resume). It is delaybridge's
// counterpart of asynq's Inspector: the front ends call it instead of
// restating an operation.
//
//	admin API (pkg/admin) ──decode──> Service ──> pkg/store (Redis)
//	command line, -c FILE ──────────> Service
//	command line, --admin URL ──> admin.Client ──HTTP──> admin API
//	dashboard (pkg/admin/ui) ───────HTTP──> admin API
//
// Operations is the interface both Service and the admin API's Client
// implement, so that the command line runs the same code against Redis and
// through a daemon, and the tests run the same cases through both
// (pkg/ops/opstest).
//
// Every refusal is an *Error whose Kind callers match with errors.Is
// (ErrNotFound, ErrConflict, ErrInvalid) and whose sentence says what to do;
// it is written here once, and each front end only maps the kind to its own
// terms (a status, an exit code). Any other error is a failure to reach
// Redis.
//
// What a request may be is checked here too, and where a rule of ingest
// applies (a new message, a retried dead one), the request is turned into
// what an ingest would have read (an envelope.Incoming with the same control
// headers) and goes through envelope.Parse, so that the API, the command
// line and the brokers follow one set of rules.
package ops

import (
	"context"
	"log/slog"
	"time"

	"github.com/delaybridge/delaybridge/pkg/destination"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// Operations is every operation, as Service runs it against Redis and the
// admin API's Client runs it through a daemon. Methods may be called
// concurrently. Refusals are *Error values (see the package comment).
type Operations interface {
	// Inspect returns a parked or dead message; its key, headers and body
	// only with content.
	Inspect(ctx context.Context, id string, content bool) (*MessageView, error)
	// Cancel deletes a parked or dead message. One already in flight may
	// still be published once: the publish was under way.
	Cancel(ctx context.Context, id string) error
	// Post schedules a new message as if a publisher had put it on an
	// ingest (the same rules apply).
	Post(ctx context.Context, req *PostRequest) (*PostedView, error)
	// List returns a page of messages in the order they fire.
	List(ctx context.Context, q ListQuery) (*ListView, error)
	// Reschedule gives a scheduled message a new due time.
	Reschedule(ctx context.Context, id string, req RescheduleRequest) (*RescheduleView, error)
	// Fire makes a scheduled message due now. A message held for its sink
	// stays held, due now: it fires when the sink takes messages again.
	Fire(ctx context.Context, id string) error
	// Stats counts parked, due and dead messages, per shard and by when
	// they come due.
	Stats(ctx context.Context) (*StatsView, error)

	// InspectDead returns a dead message (ErrNotFound for one that is not
	// dead).
	InspectDead(ctx context.Context, id string, content bool) (*MessageView, error)
	// ListDead returns the newest dead messages the query selects, newest
	// first.
	ListDead(ctx context.Context, q DeadQuery) ([]DeadView, error)
	// RetryDead schedules a dead message again, due now, through the rules
	// a message meets at ingest.
	RetryDead(ctx context.Context, id string, req RetryRequest) error
	// DeleteDead deletes a dead message; a parked one is left alone.
	DeleteDead(ctx context.Context, id string) error
	// PurgeDead deletes every dead message the filter selects.
	PurgeDead(ctx context.Context, f DeadFilter) (*PurgedView, error)

	// Group returns a group's size and a page of its messages.
	Group(ctx context.Context, key string, q ListQuery) (*GroupView, error)
	// CancelGroup cancels every message filed under a group.
	CancelGroup(ctx context.Context, key string) (*CancelGroupView, error)

	// Sinks lists the configured sinks, by name.
	Sinks(ctx context.Context) ([]SinkView, error)
	// Sink returns one configured sink.
	Sink(ctx context.Context, name string) (*SinkView, error)
	// SetPaused pauses or resumes a sink for every instance, kept across
	// restarts.
	SetPaused(ctx context.Context, name string, paused bool) (*SinkView, error)
}

var _ Operations = (*Service)(nil)

// Params configure a Service.
type Params struct {
	Store *store.Store

	// Limits bound what a new message may be, as they bound ingested ones
	// (limits:), and how far a reschedule may go (max_delay); a zero field
	// sets no bound.
	Limits envelope.Limits

	// Destinations returns the destination syntax of the configured sink
	// name, false when there is none; nil knows every non-empty name
	// (envelope.Route.Sinks).
	Destinations func(name string) (destination.Syntax, bool)

	// Routes returns the route of the configured ingest of that name
	// (daemon.Route), false when none is configured: a dead message that
	// died at ingest is retried through its ingest's route. nil knows no
	// ingest.
	Routes func(ingest string) (*envelope.Route, bool)

	// Sinks returns the configured sinks as this instance sees them; nil
	// means none is configured. It is called concurrently.
	Sinks func() []SinkStatus

	// Refresh makes this instance apply a pause or resume at once (the
	// scheduler's Refresh); nil leaves it to the next refresh, within
	// scheduler.max_sleep.
	Refresh func(ctx context.Context) error

	// Notify wakes the scheduler for a message parked, rescheduled, fired
	// or retried, due at due; nil does nothing (the scheduler sees it
	// within scheduler.max_sleep). It is called concurrently.
	Notify func(id string, due time.Time)

	// Settled waits, until ctx ends, for this instance's publishes of the
	// shard of message id to end and their acks to be written (the
	// scheduler's Settled): a message met in
	// flight is then read again, and one its publish delivered is unknown
	// (afterPublish). nil: the message is read again at once. It is called
	// concurrently.
	Settled func(ctx context.Context, id string)

	// Persistence returns what Redis keeps on disk, for Stats
	// (StatsView.RedisPersistence); nil leaves it out. The daemon's returns
	// what it read last; the command line's reads it.
	Persistence func(ctx context.Context) *PersistenceView

	// Capacity is the gate of limits.max_parked_messages and
	// max_redis_memory (store.NewCapacity) that POST /v1/messages meets as
	// ingest does: while it answers store.ErrFull, Post refuses
	// (ErrUnavailable, with RetryAfter). nil: no limit.
	Capacity store.Gate

	// Now is the clock new messages count their delay from and retries
	// are due at: the daemon's reads Redis's clock. Default time.Now.
	Now func() time.Time

	Logger *slog.Logger // nil discards
}

// Service runs the operations against Redis. It is safe for concurrent
// use.
type Service struct {
	p   Params
	log *slog.Logger
}

// New returns a Service.
func New(p Params) *Service {
	if p.Now == nil {
		p.Now = time.Now
	}
	if p.Logger == nil {
		p.Logger = slog.New(slog.DiscardHandler)
	}
	return &Service{p: p, log: p.Logger}
}

// Limits returns the limits the Service applies.
func (s *Service) Limits() envelope.Limits { return s.p.Limits }

// notify wakes the scheduler for a message now due at due.
func (s *Service) notify(id string, due time.Time) {
	if s.p.Notify != nil {
		s.p.Notify(id, due)
	}
}

// settleWait bounds how long a request that met a message in flight
// waits for this instance's publish of it to be settled (Params.Settled):
// a confirmed publish's acks are written in a round trip; past it the
// message stays in flight, and the answer says so.
const settleWait = time.Second

// afterPublish reads message id again after a store call met it in flight,
// once this instance's publishes of its shard are written (Params.Settled,
// within settleWait). ErrNotFound means the publish delivered it: the
// answer is then that of a delivered message. Anything else (the message
// back in its state after a failed publish, or another version of the ID:
// a series' next occurrence, a replacement or a message of the ID that
// waited) is not acted on, since the request did not name it: the 409
// stands, and the caller tries again.
func (s *Service) afterPublish(ctx context.Context, id string) (*store.Info, error) {
	if s.p.Settled != nil {
		wctx, cancel := context.WithTimeout(ctx, settleWait)
		s.p.Settled(wctx, id)
		cancel()
	}
	return s.p.Store.Inspect(ctx, id)
}

// now is the Service's clock rounded up to a whole millisecond, the
// precision of due times: a delay counted from it never ends before the
// request's arrival plus the delay.
func (s *Service) now() time.Time { return envelope.CeilMillis(s.p.Now()) }

// syntax returns the destination syntax of a sink name; false when no sink
// of that name is configured.
func (s *Service) syntax(name string) (destination.Syntax, bool) {
	if s.p.Destinations == nil {
		return destination.Generic(), name != ""
	}
	return s.p.Destinations(name)
}
