package ops

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// Inspect returns a parked or dead message.
func (s *Service) Inspect(ctx context.Context, id string, content bool) (*MessageView, error) {
	return s.inspect(ctx, id, content, false)
}

// InspectDead returns a dead message.
func (s *Service) InspectDead(ctx context.Context, id string, content bool) (*MessageView, error) {
	return s.inspect(ctx, id, content, true)
}

func (s *Service) inspect(ctx context.Context, id string, content, deadOnly bool) (*MessageView, error) {
	if err := s.checkID("id", "the message ID", id); err != nil {
		return nil, err
	}
	info, err := s.p.Store.Inspect(ctx, id)
	if err == nil && info.State == store.StateInflight {
		info, err = s.afterPublish(ctx, id) // delivered (unknown), or as it is now
	}
	switch {
	case errors.Is(err, store.ErrNotFound) && deadOnly, err == nil && deadOnly && info.State != store.StateDead:
		return nil, noDeadMessage(id)
	case errors.Is(err, store.ErrNotFound):
		return nil, noMessage(id)
	case err != nil:
		return nil, err
	}
	v := NewMessageView(info, content)
	return &v, nil
}

// Cancel deletes a parked or dead message, so that it is never published;
// a message being published is refused (ErrConflict, with RetryAfter),
// after waiting for this instance's publish of it (Params.Settled): a
// message that publish delivered is then unknown, and a series whose
// occurrence it was has ended with it (store.ErrSeriesEnds): cancelled.
func (s *Service) Cancel(ctx context.Context, id string) error {
	if err := s.checkID("id", "the message ID", id); err != nil {
		return err
	}
	err := s.p.Store.Cancel(ctx, id)
	if errors.Is(err, store.ErrInFlight) {
		if _, ierr := s.afterPublish(ctx, id); errors.Is(ierr, store.ErrNotFound) {
			if errors.Is(err, store.ErrSeriesEnds) {
				return nil // the occurrence in flight was its series' last: nothing more of it is published
			}
			return noMessage(id) // delivered
		}
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		return noMessage(id)
	case errors.Is(err, store.ErrSeriesEnds):
		e := conflict("message %s is an occurrence of a series being published now, which cannot be stopped; "+
			"its series ends with it: nothing after it is published", quote(id))
		e.RetryAfter = inFlightRetry
		return e
	case errors.Is(err, store.ErrInFlight):
		return inFlight(id, "cancelled")
	}
	return err
}

// fullRetry is when to try a POST again that met a store at its limits:
// the gate measures again every quarter second, and room comes back as
// messages fire.
const fullRetry = time.Second

// Stats counts the messages.
// A shard that does not answer (a master down) is left out and said
// (store.Store.StatsAnswering).
func (s *Service) Stats(ctx context.Context) (*StatsView, error) {
	st, err := s.p.Store.StatsAnswering(ctx)
	if err != nil {
		return nil, err
	}
	v := NewStatsView(st)
	if s.p.Persistence != nil {
		v.RedisPersistence = s.p.Persistence(ctx)
	}
	return &v, nil
}

// List returns a page of messages in the order they fire.
func (s *Service) List(ctx context.Context, q ListQuery) (*ListView, error) {
	bq, verr := s.listBrowse(q)
	if verr != nil {
		return nil, verr
	}
	return s.browse(ctx, bq, q.Content)
}

func (s *Service) browse(ctx context.Context, bq store.BrowseQuery, content bool) (*ListView, error) {
	p, err := s.p.Store.Browse(ctx, bq)
	switch {
	case errors.Is(err, store.ErrBadCursor):
		return nil, invalid("cursor", "cursor: %s", strings.TrimPrefix(err.Error(), store.ErrBadCursor.Error()+": "))
	case err != nil:
		return nil, err
	}
	v := NewListView(p, content)
	return &v, nil
}

// Post schedules a new message. The request becomes an incoming message,
// as if a publisher had put it on an ingest: its fields become the control
// headers and its sink and destination the route, and envelope.Parse
// applies to it the rules of every ingested message. Only what is
// particular to a request is checked here: which fields are required,
// their JSON shapes, and header names and values.
func (s *Service) Post(ctx context.Context, req *PostRequest) (*PostedView, error) {
	in, hasAt, verr := req.incoming()
	if verr != nil {
		return nil, verr
	}
	route := &envelope.Route{Sink: strings.TrimSpace(req.Sink), Destination: req.Destination, Sinks: s.p.Destinations}
	d := envelope.Parse(in, route, s.p.Limits, s.now(), nil)
	if d.Action != envelope.Park {
		err := d.Err
		if err == nil { // a control message: a request makes none
			err = fmt.Errorf("ingest reads it as a %s, not a message to park", d.Action)
		}
		return nil, invalid(rejectField(err, hasAt), "%s", FieldNames(err.Error()))
	}
	m := d.Message
	if s.p.Capacity != nil {
		_, done, err := s.p.Capacity(ctx, 1)
		if errors.Is(err, store.ErrFull) {
			return nil, &Error{Kind: ErrUnavailable, Reason: strings.TrimPrefix(err.Error(), store.ErrFull.Error()+": "), RetryAfter: fullRetry}
		} else if err != nil {
			return nil, fmt.Errorf("park %q: %w", m.ID, err)
		}
		defer done()
	}
	res, err := s.p.Store.Park(ctx, []*envelope.Message{m})
	switch {
	case store.IsOutOfMemory(err):
		return nil, &Error{Kind: ErrUnavailable, RetryAfter: fullRetry,
			Reason: "Redis is at its maxmemory and takes no new message until some fire; set limits.max_redis_memory below maxmemory so that delaybridge pauses before Redis refuses"}
	case err != nil:
		return nil, fmt.Errorf("park %q: %w", m.ID, err)
	}
	switch res[0] {
	case store.OverSeries:
		return nil, conflict("%s", envelope.ReasonMaxSeries)
	case store.IDTaken:
		return nil, conflict("%s", envelope.ReasonIDTaken)
	}
	if res[0].Accepted() {
		s.notify(m.ID, m.DueAt)
		return &PostedView{ID: m.ID, DueAt: envelope.FormatTime(m.DueAt)}, nil
	}
	// Parking is idempotent (the contract): flagged, with the due time of
	// the message already known under this ID, not the one of the request,
	// which was not applied.
	due := m.DueAt
	if info, err := s.p.Store.Inspect(ctx, m.ID); err == nil && info.Message != nil {
		due = info.Message.DueAt
	}
	return &PostedView{ID: m.ID, DueAt: envelope.FormatTime(due), Duplicate: true}, nil
}

// incoming is the request as an ingested message; hasAt says deliver_at
// was given (for naming the field of a due time over max_delay).
func (req *PostRequest) incoming() (in *envelope.Incoming, hasAt bool, _ *Error) {
	in = &envelope.Incoming{}
	add := func(key, value string) { in.Headers = append(in.Headers, envelope.Header{Key: key, Value: value}) }
	delay, hasDelay, err := req.Delay.text("delay")
	if err != nil {
		return nil, false, err
	}
	at, hasAt, err := req.DeliverAt.text("deliver_at")
	if err != nil {
		return nil, false, err
	}
	recurring := req.Every != "" || req.Cron != ""
	switch {
	case hasDelay && hasAt:
		return nil, false, invalid("delay", "give either delay or deliver_at, not both")
	case hasDelay:
		add(envelope.HeaderDelay, delay)
	case hasAt:
		add(envelope.HeaderDeliverAt, at)
	case !recurring:
		return nil, false, invalid("delay", `delay or deliver_at is required: "delay": 5000 (ms) or "5m", or "deliver_at": "2026-12-01T10:00:00Z" or epoch ms (or a recurrence: every or cron)`)
	}
	if strings.TrimSpace(req.Sink) == "" {
		return nil, false, invalid("sink", "sink is required: the name of a configured sink")
	}
	if req.Destination == "" {
		return nil, false, invalid("destination", "destination is required: a topic, subject or routing key of the sink")
	}
	if req.ID != nil && *req.ID == "" {
		return nil, false, invalid("id", "id is empty; leave it out to get a generated ID")
	}
	in.Headers = append(in.Headers, req.Options.Headers()...)
	if req.Key != nil {
		in.Key = []byte(*req.Key)
	}
	keys := make([]string, 0, len(req.Headers))
	for k := range req.Headers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	spelled := make(map[string]string, len(keys)) // lower case -> as given
	for _, k := range keys {
		v := req.Headers[k]
		if err := checkHeader(k, v); err != nil {
			return nil, false, err
		}
		// Header lookups are case-insensitive: two spellings of one name
		// would let a filter read one and a consumer the other.
		if prev, ok := spelled[strings.ToLower(k)]; ok {
			return nil, false, invalid("headers", "headers: %s and %s name the same header (names are case-insensitive); give it once", quote(prev), quote(k))
		}
		spelled[strings.ToLower(k)] = k
		add(k, v)
	}
	switch {
	case req.Body != nil && req.BodyBase64 != nil:
		return nil, false, invalid("body", "give either body or body_base64, not both")
	case req.Body != nil:
		in.Body = []byte(*req.Body)
	case req.BodyBase64 != nil:
		b, err := base64.StdEncoding.DecodeString(*req.BodyBase64)
		if err != nil {
			return nil, false, invalid("body_base64", "body_base64 is not standard base64: %v", err)
		}
		in.Body = b
	default:
		return nil, false, invalid("body", `body is required: give "body" (text) or "body_base64" (binary); "" for an empty body`)
	}
	return in, hasAt, nil
}

// checkHeader validates one header of a request.
func checkHeader(k, v string) *Error {
	switch {
	case k == "":
		return invalid("headers", "headers: a header name is empty")
	case envelope.IsControlHeader(k):
		return invalid("headers", "headers: %s is a control header and cannot be forwarded; use the request's fields "+
			"(delay, deliver_at, sink, destination, %s)", quote(k), strings.Join(envelope.OptionFields(), ", "))
	case strings.ContainsFunc(k, func(c rune) bool { return c <= ' ' || c == ':' || c == 0x7f }):
		return invalid("headers", "headers: name %s contains a space, colon or control character", quote(k))
	case strings.ContainsAny(v, "\x00\r\n"):
		return invalid("headers", "headers: the value of %s contains a NUL, CR or LF character", quote(k))
	}
	return nil
}

// Reschedule gives a scheduled message a new due time: 404 unknown; 409
// in flight, dead, or if_due_at not the message's due time.
func (s *Service) Reschedule(ctx context.Context, id string, req RescheduleRequest) (*RescheduleView, error) {
	if err := s.checkID("id", "the message ID", id); err != nil {
		return nil, err
	}
	delay, hasDelay, verr := req.Delay.text("delay")
	if verr != nil {
		return nil, verr
	}
	at, hasAt, verr := req.DeliverAt.text("deliver_at")
	if verr != nil {
		return nil, verr
	}
	ifDue, hasIf, verr := req.IfDueAt.text("if_due_at")
	if verr != nil {
		return nil, verr
	}
	var ifDueAt time.Time
	if hasIf {
		if ifDueAt, verr = timeField("if_due_at", ifDue); verr != nil {
			return nil, verr
		}
	}
	now := s.p.Now()
	due, verr := newDueTime(delay, at, hasDelay, hasAt, now, s.p.Limits)
	if verr != nil {
		return nil, verr
	}
	if !due.IsZero() {
		// An occurrence of a series is not moved past the series' end.
		if info, err := s.p.Store.Inspect(ctx, id); err == nil && info.Message != nil && info.Message.Recur != nil {
			if until := info.Message.Recur.Until; !until.IsZero() && due.After(until) {
				field := "delay"
				if hasAt {
					field = "deliver_at"
				}
				return nil, invalid(field, "message %s is an occurrence of a series that has no occurrence after %s (until): "+
					"move it to that time or before, or cancel it", quote(id), envelope.FormatTime(until))
			}
		}
	}
	set, err := s.p.Store.Reschedule(ctx, id, due, ifDueAt)
	if errors.Is(err, store.ErrDueAtMismatch) {
		e := conflict("the message's due time is %s, not if_due_at %s: it was changed meanwhile; read it again",
			envelope.FormatTime(set), envelope.FormatTime(ifDueAt))
		e.DueAt = envelope.FormatTime(set)
		return nil, e
	}
	if err != nil {
		return nil, s.changeError(ctx, id, "rescheduled", err)
	}
	s.notify(id, set)
	return &RescheduleView{ID: id, DueAt: envelope.FormatTime(set), Now: !due.After(now)}, nil
}

// newDueTime reads a reschedule's delay or deliver_at as ingest reads
// x-delay and x-deliver-at (envelope.ParseDelay, ParseDeliverAt; a due time
// with sub-millisecond digits rounds up) and checks it against
// limits.max_delay from now. It returns the zero time for a due time that
// has passed (fire now).
func newDueTime(delay, deliverAt string, hasDelay, hasAt bool, now time.Time, lim envelope.Limits) (time.Time, *Error) {
	var due time.Time
	field := "delay"
	switch {
	case hasDelay && hasAt:
		return due, invalid("delay", "give either delay or deliver_at, not both")
	case hasDelay:
		d, reason := envelope.ParseDelay(delay)
		if reason != "" {
			return due, invalid("delay", "%s", FieldNames(reason))
		}
		if lim.MaxDelay > 0 && d > lim.MaxDelay {
			return due, invalid("delay", "delay %s is over limits.max_delay %s", d, lim.MaxDelay)
		}
		due = envelope.CeilMillis(now.Add(d))
	case hasAt:
		field = "deliver_at"
		t, reason := envelope.ParseDeliverAt(deliverAt)
		if reason != "" {
			return due, invalid("deliver_at", "%s", FieldNames(reason))
		}
		due = t
	default:
		return due, invalid("delay", `delay or deliver_at is required: "delay": 5000 (ms) or "5m", or "deliver_at": "2026-12-01T10:00:00Z" or epoch ms; a time that has passed fires now`)
	}
	switch {
	case lim.MaxDelay > 0 && due.Sub(now) > lim.MaxDelay:
		return time.Time{}, invalid(field, "due time %s is more than limits.max_delay %s from now", envelope.FormatTime(due), lim.MaxDelay)
	case due.UnixMilli() >= envelope.MaxDueMs:
		return time.Time{}, invalid(field, "due time %s is after %s, the latest delaybridge keeps", envelope.FormatTime(due), envelope.FormatTime(time.UnixMilli(envelope.MaxDueMs-1)))
	case hasAt && due.After(now.Add(-clockLead)):
		// Passed by our clock, maybe not by Redis's, which it may lead:
		// kept, the store scores it then, never before.
		return due, nil
	case !due.After(now):
		return time.Time{}, nil // passed: due now
	}
	return due, nil
}

// clockLead bounds how far the clock ops reads (Params.Now: the daemon's,
// never behind Redis's, ahead by up to a round trip of its measure) may
// lead Redis's: a deliver_at passed by less than that is not taken for
// passed, which would fire it at Redis's now, before it.
const clockLead = time.Second

// Fire makes a scheduled message due now.
func (s *Service) Fire(ctx context.Context, id string) error {
	if err := s.checkID("id", "the message ID", id); err != nil {
		return err
	}
	if err := s.p.Store.Fire(ctx, id); err != nil {
		return s.changeError(ctx, id, "fired", err)
	}
	s.notify(id, s.p.Now())
	return nil
}

// changeError says why a change (what: "rescheduled", "fired") to a
// scheduled message failed: in flight or dead (conflicts), or unknown.
func (s *Service) changeError(ctx context.Context, id, what string, err error) error {
	switch {
	case errors.Is(err, store.ErrInFlight):
		if _, ierr := s.afterPublish(ctx, id); errors.Is(ierr, store.ErrNotFound) {
			return noMessage(id) // delivered
		}
		return inFlight(id, what)
	case errors.Is(err, store.ErrNotFound):
		if info, ierr := s.p.Store.Inspect(ctx, id); ierr == nil && info.State == store.StateDead {
			return isDead(id, what)
		}
		return noMessage(id)
	case errors.Is(err, envelope.ErrSealed):
		// The message's state is fine; this instance cannot open it. Not
		// echoed: the error holds the whole ID.
		return conflict("message %s cannot be %s here: this instance cannot open what is stored (sealed with a key it does not have, "+
			"or with other bytes under that key's ID, or in clear while encryption.require_sealed is on: GET it for the reason); "+
			"a daemon with its key can change it (reencrypt seals one in clear), or cancel it", quote(id), what)
	case errors.Is(err, envelope.ErrCorrupt):
		return conflict("message %s cannot be %s here: what is stored cannot be read (damaged, or written by a newer delaybridge: GET it for the reason); "+
			"cancel it, or change it with the build that wrote it", quote(id), what)
	}
	return err
}
