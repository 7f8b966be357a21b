package ops

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// ListDead returns the newest dead messages the query selects, newest
// first.
func (s *Service) ListDead(ctx context.Context, q DeadQuery) ([]DeadView, error) {
	limit := DefaultDeadLimit
	if q.Limit != nil {
		if limit = *q.Limit; limit < 1 || limit > MaxDeadLimit {
			return nil, invalid("limit", "limit %d: give an integer from 1 to %d", limit, MaxDeadLimit)
		}
	}
	if _, verr := s.deadBrowse(q.DeadFilter); verr != nil {
		return nil, verr
	}
	var infos []*store.Info
	if !q.any() {
		var err error
		if infos, err = s.p.Store.ListDead(ctx, limit); err != nil {
			return nil, err
		}
	} else {
		// The listing of dead messages runs by time of death, oldest
		// first: read every match, keep the newest.
		err := s.eachDead(ctx, q.DeadFilter, func(page []*store.Info) error {
			infos = append(infos, page...)
			return nil
		})
		if err != nil {
			return nil, err
		}
		slices.Reverse(infos)
		if len(infos) > limit {
			infos = infos[:limit]
		}
	}
	out := make([]DeadView, 0, len(infos))
	for _, info := range infos {
		out = append(out, NewDeadView(info))
	}
	return out, nil
}

// eachDead calls f with each page of the dead messages f selects, oldest
// first.
func (s *Service) eachDead(ctx context.Context, f DeadFilter, each func(page []*store.Info) error) error {
	bq, verr := s.deadBrowse(f)
	if verr != nil {
		return verr
	}
	for {
		p, err := s.p.Store.Browse(ctx, bq)
		if err != nil {
			return err
		}
		if err := each(p.Messages); err != nil {
			return err
		}
		if p.Next == "" {
			return nil
		}
		bq.Cursor = p.Next
	}
}

// DeleteDead deletes a dead message; a message that is not dead is left
// alone.
func (s *Service) DeleteDead(ctx context.Context, id string) error {
	if err := s.checkID("id", "the message ID", id); err != nil {
		return err
	}
	err := s.p.Store.DeleteDead(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return noDeadMessage(id)
	}
	return err
}

// PurgeDead deletes every dead message the filter selects.
func (s *Service) PurgeDead(ctx context.Context, f DeadFilter) (*PurgedView, error) {
	if _, verr := s.deadBrowse(f); verr != nil {
		return nil, verr
	}
	if !f.any() {
		n, err := s.p.Store.PurgeDead(ctx)
		if err != nil {
			return nil, err
		}
		return &PurgedView{Deleted: n}, nil
	}
	deleted := 0
	err := s.eachDead(ctx, f, func(page []*store.Info) error {
		ids := make([]string, len(page))
		for i, info := range page {
			ids[i] = info.ID
		}
		n, err := s.p.Store.DeleteDeadMany(ctx, ids) // those retried or deleted meanwhile stay as they are
		deleted += n
		return err
	})
	if err != nil {
		return nil, err
	}
	return &PurgedView{Deleted: deleted}, nil
}

// RetryDead schedules a dead message again, due now: the message it
// stores is due at the retry's time (its x-delaybridge-due-at says so), and
// it goes through the rules it met when it came in.
//
// A message that died at ingest (rejected, no publish attempt) is read again
// as its ingest read it (its headers with the control headers, body, key,
// source, publish time and origin, as an envelope.Incoming) and goes
// through envelope.Parse with the route of its ingest: templates expand,
// limits and destination checks apply. The retry names its ID and its due
// time (now): they replace x-message-id and x-delay or x-deliver-at
// (scheduler-epoch for a kafka-scheduler record), so that a message that
// died for its delay can be retried, and every other rule still refuses
// what it refused (ErrConflict with the reason).
//
// A message that died at the sink keeps its sink and destination unless
// req gives others; one that died for them (its sink is not configured,
// its destination is not valid for its sink under its route, or the broker
// refused it) is retried only with req naming the ones to use. A sink or
// destination given is checked as a publisher's would be (ErrInvalid).
//
// A recurring message retried is a live series again: past
// limits.max_series it is refused as a new series posted is (ErrConflict
// with envelope.ReasonMaxSeries) and stays dead.
func (s *Service) RetryDead(ctx context.Context, id string, req RetryRequest) error {
	if err := s.checkID("id", "the message ID", id); err != nil {
		return err
	}
	info, err := s.p.Store.Inspect(ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound), err == nil && info.State != store.StateDead:
		return noDeadMessage(id)
	case err != nil:
		return err
	case info.Message == nil && errors.Is(info.Err, envelope.ErrSealed):
		// Its key is not this instance's (or encryption is off here): the
		// message is whole, and an instance that has the key retries it.
		return conflict("dead message %s cannot be opened here (%v): configure its key in encryption.keys (or retry it from an instance that has it), then retry; reencrypt seals it again under the active key", quote(id), info.Err)
	case info.Message == nil:
		return conflict("dead message %s cannot be read (%v), so it cannot be retried; delete it", quote(id), info.Err)
	}
	now := s.now()
	var m *envelope.Message
	if info.Attempts == 0 {
		m, err = s.reingest(info, req, now)
	} else {
		m, err = s.resend(info, req)
	}
	if err != nil {
		return err
	}
	m.ID, m.DueAt = id, now
	switch err := s.p.Store.RetryDeadAs(ctx, m); {
	case errors.Is(err, store.ErrNotFound):
		return noDeadMessage(id) // retried, deleted or cancelled meanwhile
	case errors.Is(err, store.ErrOverSeries):
		return conflict("%s", envelope.ReasonMaxSeries)
	case errors.Is(err, store.ErrOverSourceSeries):
		return conflict("%s", envelope.ReasonIngestMaxSeries)
	case err != nil:
		return err
	}
	s.notify(id, now)
	return nil
}

// route returns the route a dead message came in by: its ingest's; for a
// message whose ingest is not configured (any more), one of its own sink
// and destination, as POST /v1/messages builds it.
func (s *Service) route(m *envelope.Message) *envelope.Route {
	if s.p.Routes != nil {
		if r, ok := s.p.Routes(m.Ingest); ok {
			return r
		}
	}
	return &envelope.Route{Ingest: m.Ingest, Sink: m.Sink, Destination: m.Destination, Sinks: s.p.Destinations}
}

// reingest is a message that died at ingest as its ingest reads it again,
// retried now.
func (s *Service) reingest(info *store.Info, req RetryRequest, now time.Time) (*envelope.Message, error) {
	m := info.Message
	route := s.route(m)
	in := &envelope.Incoming{Body: m.Body, Key: m.Key, PublishedAt: m.PublishedAt, Properties: m.Properties,
		Origin: m.Origin, Source: m.Source, Tombstone: m.NullBody}
	sched := kafkaScheduler(m.Headers, route)
	given := req != RetryRequest{}
	named := func(key string, names ...string) bool {
		return slices.ContainsFunc(names, func(n string) bool { return strings.EqualFold(key, n) })
	}
	for _, h := range m.Headers {
		switch {
		case sched && named(h.Key, envelope.HeaderSchedulerEpoch),
			!sched && named(h.Key, envelope.HeaderDelay, envelope.HeaderDeliverAt, envelope.HeaderMessageID),
			given && named(h.Key, envelope.HeaderSink, envelope.HeaderDestination):
			continue // what the retry names instead
		}
		in.Headers = append(in.Headers, h)
	}
	if sched {
		in.Headers = append(in.Headers, envelope.Header{Key: envelope.HeaderSchedulerEpoch, Value: strconv.FormatInt(now.Unix(), 10)})
	} else {
		in.Headers = append(in.Headers, envelope.Header{Key: envelope.HeaderDeliverAt, Value: envelope.FormatTime(now)},
			envelope.Header{Key: envelope.HeaderMessageID, Value: info.ID})
	}
	if given {
		// The operator's sink and destination are the route's now, in place
		// of what the message named (x-delay-sink, x-delay-destination,
		// kept where the route allowed them).
		r := *route
		if req.Sink != "" {
			r.Sink = req.Sink
		} else if v, ok := m.Headers.Get(envelope.HeaderSink); ok && route.AllowOverride {
			r.Sink = strings.TrimSpace(v)
		}
		if req.Destination != "" {
			r.Destination = req.Destination
		} else if v, ok := m.Headers.Get(envelope.HeaderDestination); ok && route.AllowOverride {
			r.Destination = v
		}
		if err := s.checkGiven(req, r.Sink, r.Destination, route); err != nil {
			return nil, err
		}
		route = &r
	}
	d := envelope.Parse(in, route, s.p.Limits, now, nil)
	switch d.Action {
	case envelope.Park:
		return d.Message, nil
	case envelope.Reject:
		if req == (RetryRequest{}) && (errors.Is(d.Err, envelope.CodeInvalidRoute) || errors.Is(d.Err, envelope.CodeInvalidDestination) || errors.Is(d.Err, envelope.CodeDestinationReserved)) {
			return nil, conflict("dead message %s is still refused by the rules of ingest %q: %v; retry it with a valid sink or destination (%s)",
				quote(info.ID), route.Ingest, d.Err, retryWith)
		}
		return nil, conflict("dead message %s is still refused by the rules of ingest %q: %v", quote(info.ID), route.Ingest, d.Err)
	}
	return nil, conflict("dead message %s is a control message (%s): it is not parked; delete it", quote(info.ID), d.Action)
}

// retryWith says how to give a retry a sink or destination.
const retryWith = `{"sink", "destination"} in the body of POST /v1/dead/{id}/retry, --sink or --destination of delaybridge dead retry`

// kafkaScheduler reports whether the headers of a message of route are a
// kafka-scheduler record's, as envelope.Parse reads its dialect.
func kafkaScheduler(h envelope.Headers, route *envelope.Route) bool {
	reads := func(d envelope.Dialect) bool {
		return slices.Contains(route.Dialects, d) || (len(route.Dialects) == 0 && d == envelope.DialectDelaybridge)
	}
	if !reads(envelope.DialectKafkaScheduler) {
		return false
	}
	for _, k := range []string{envelope.HeaderSchedulerEpoch, envelope.HeaderSchedulerTargetTopic, envelope.HeaderSchedulerTargetKey} {
		if _, ok := h.Get(k); ok {
			return true
		}
	}
	return !reads(envelope.DialectDelaybridge)
}

// resend is a message that died at the sink as it is retried: as it was,
// with the sink or destination req gives.
func (s *Service) resend(info *store.Info, req RetryRequest) (*envelope.Message, error) {
	m := *info.Message
	route := s.route(&m)
	if req.Sink != "" || req.Destination != "" {
		if req.Sink != "" {
			m.Sink = req.Sink
		}
		if req.Destination != "" {
			m.Destination = req.Destination
		}
		return &m, s.checkGiven(req, m.Sink, m.Destination, route)
	}
	syntax, ok := s.syntax(m.Sink)
	switch {
	case !ok:
		return nil, conflict("dead message %s died for its sink %s, which is not configured: retry it with a sink (%s)", quote(info.ID), quote(m.Sink), retryWith)
	case syntax.Check(m.Destination, route.AllowedDestinations, false) != nil:
		return nil, conflict("dead message %s died for its destination: %v; retry it with a valid one (%s)",
			quote(info.ID), syntax.Check(m.Destination, route.AllowedDestinations, false), retryWith)
	case brokerRefused(info.Reason):
		return nil, conflict("dead message %s died because the broker refused its destination (%s): retry it with a sink or destination "+
			"(%s; the same one again once the broker takes it)", quote(info.ID), info.Reason, retryWith)
	}
	return &m, nil
}

// checkGiven checks the sink and destination a retry gives (req), which
// make the message's sink and destination: the sink must be configured,
// and the destination valid for it under the message's route, as if a
// publisher had chosen it (route.allowed_destinations apply).
func (s *Service) checkGiven(req RetryRequest, sink, dest string, route *envelope.Route) error {
	syntax, ok := s.syntax(sink)
	if !ok {
		field := "sink"
		if req.Sink == "" {
			field = "destination" // the message's own sink, which only a new one can replace
		}
		return invalid(field, "sink %s names no configured sink", quote(sink))
	}
	chosen := req.Destination != "" && req.Destination != route.Destination
	if err := syntax.Check(dest, route.AllowedDestinations, chosen); err != nil {
		return invalid("destination", "destination %s: %v", quote(dest), err)
	}
	return nil
}

// brokerRefusals are what the sinks' errors say when a broker refused a
// message for its destination (pkg/brokers: sinks.Rejected and
// sinks.Permanent), and the scheduler when its sink is not configured: a
// dead message whose reason says one of them died for its destination.
var brokerRefusals = []string{
	`" is not configured`,                             // the scheduler: sink "name" is not configured
	"does not exist",                                  // Kafka: no such topic
	"not authorized",                                  // Kafka, NATS: not for that destination
	"no stream stores this subject",                   // JetStream
	"has no queue bound",                              // RabbitMQ: unroutable
	"NO_ROUTE",                                        // RabbitMQ: a returned message
	"is not a NATS subject",                           // NATS: not a subject to publish to
	"is longer than 255 bytes",                        // RabbitMQ: a routing key it cannot take
	"route.allowed_destinations",                      // a destination check (destination.Syntax.Check)
	"did not answer within scheduler.publish_timeout", // the scheduler: a destination that never answers
	"the broker closed the channel when the message was published", // RabbitMQ: a close for that routing key (pkg/brokers/rabbitbroker)
}

func brokerRefused(reason string) bool {
	if strings.Contains(reason, "cannot decode the stored message") {
		return false // a key or a build that could not read it, whatever its words (a key "which is not configured")
	}
	return slices.ContainsFunc(brokerRefusals, func(r string) bool { return strings.Contains(reason, r) })
}
