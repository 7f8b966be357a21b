package ops

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/pkg/destination"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// Import parks the messages of an export (the JSON Lines of `delaybridge
// export`; store.Import reads them) under the rules of ingest: each
// record's message goes through admit, so that import refuses what an
// ingest refuses, with the same reason and the line's number, and writes
// what an ingest would have parked. It sets o.Admit, o.MaxIDBytes and
// o.MaxLineBytes (a line holds up to two messages, each bounded as POST
// /v1/messages' body is). It works on Redis only: the admin API has no
// import.
func (s *Service) Import(ctx context.Context, r io.Reader, o store.ImportOptions) (store.ImportStats, error) {
	o.MaxIDBytes = s.p.Limits.MaxIDBytes
	o.MaxLineBytes = int(s.p.Limits.MaxRecordBytes())
	o.Admit = s.admit
	return s.p.Store.Import(ctx, r, o)
}

// admit is a record's message as ingest would have parked it, or the rule
// it breaks (store.ImportOptions.Admit). So that import refuses exactly
// what ingest refuses, a scheduled message (or a dead one that had publish
// attempts) is read back as an ingest read it (incoming) and goes through
// envelope.Parse under its ingest's route (importRoute). A control header
// among the record's headers is refused: ingest never forwards one. What
// ingest does not decide (the due time, the ingest and publish times, the
// series' anchor, occurrence and missed policy) stays the record's.
//
// A dead message is not parked: a retry checks its sink, destination and
// due time (RetryDead), so those are not refused here. One that died at
// ingest (no attempt) is kept as ingest kept it, refused only for a body or
// headers over the limits.
func (s *Service) admit(m *envelope.Message, meta *store.RecordMeta) (*envelope.Message, error) {
	dead := meta.State == store.StateDead
	if s.p.Routes != nil && m.Ingest != "" {
		// Its rules could not be applied, now or at a retry of a dead one.
		if _, ok := s.p.Routes(m.Ingest); !ok {
			return nil, refused(`no ingest %q is configured, whose rules the message would meet: give the record the "ingest" of one that is, `+
				`or "" for the admin API's`, destination.Printable(m.Ingest))
		}
	}
	if dead && meta.Attempts == 0 {
		if err := s.p.Limits.CheckSize(m.Body, m.Headers, m.Key); err != nil {
			return nil, refused("%s (ingest keeps a rejected message without it)", recordFields.Replace(err.Error()))
		}
		return m, nil
	}
	for i, h := range m.Headers {
		if envelope.IsControlHeader(h.Key) {
			return nil, refused(`"headers"[%d] %q is a control header, which ingest reads and never forwards `+
				`(an exported message has none; the record's fields say what it controls): remove it`, i, destination.Printable(h.Key))
		}
	}
	due := meta.NextAt
	if dead {
		due = m.DueAt
	}
	in := incoming(m, due)
	route := s.importRoute(m, in)
	lim := s.p.Limits
	if dead {
		lim.Fits = nil // its sink's size too is checked at a retry; many died of it
	}
	d := envelope.Parse(in, route, lim, s.now(), nil)
	switch {
	case d.Action == envelope.Reject && dead && retryChecks(d.Err):
		return m, nil
	case d.Action == envelope.Reject:
		return nil, refused("%s", recordFields.Replace(d.Err.Error()))
	case d.Action != envelope.Park: // a control header, refused above
		return nil, refused("ingest reads it as a %s, not a message to park", d.Action)
	}
	p := d.Message
	p.DueAt, p.IngestedAt = m.DueAt, m.IngestedAt
	if p.Recur != nil {
		p.Recur.Anchor, p.Recur.N, p.Recur.Missed, p.Recur.Parked = m.Recur.Anchor, m.Recur.N, m.Recur.Missed, p.IngestedAt
		if m.Recur.MissedMax > 0 { // kept with the series; absent in an earlier release's export: the route's
			p.Recur.MissedMax = m.Recur.MissedMax
		}
	}
	return p, nil
}

// retryChecks reports whether a retry of a dead message checks again what
// this rejection is about (RetryDead: its sink and destination; its due
// time is the retry's).
func retryChecks(err error) bool {
	switch envelope.CodeOf(err) {
	case envelope.CodeInvalidRoute, envelope.CodeInvalidDestination, envelope.CodeDestinationReserved, envelope.CodeOverMaxDelay:
		return true
	}
	return false
}

func refused(format string, args ...any) error {
	return fmt.Errorf("%w: %s", store.ErrRefused, fmt.Sprintf(format, args...))
}

// incoming is a record's message as an ingest would have read it, due at
// due.
func incoming(m *envelope.Message, due time.Time) *envelope.Incoming {
	hs := make(envelope.Headers, 0, len(m.Headers)+9)
	hs = append(hs, m.Headers...)
	add := func(k, v string) { hs = append(hs, envelope.Header{Key: k, Value: v}) }
	add(envelope.HeaderMessageID, m.ID)
	add(envelope.HeaderDeliverAt, envelope.FormatTime(due))
	if m.Priority != 0 {
		add(envelope.HeaderPriority, strconv.Itoa(int(m.Priority)))
	}
	if m.Group != "" {
		add(envelope.HeaderGroup, m.Group)
	}
	if r := m.Recur; r != nil {
		if r.Cron != "" || r.Every == 0 {
			add(envelope.HeaderCron, r.Cron)
		} else {
			add(envelope.HeaderEvery, r.Every.String())
		}
		if r.TimeZone != "" {
			add(envelope.HeaderTimeZone, r.TimeZone)
		}
		if !r.Until.IsZero() {
			add(envelope.HeaderUntil, envelope.FormatTime(r.Until))
		}
		if r.Count != 0 {
			add(envelope.HeaderCount, strconv.Itoa(r.Count))
		}
	}
	return &envelope.Incoming{Headers: hs, Body: m.Body, Key: m.Key, PublishedAt: m.PublishedAt,
		Properties: m.Properties, Origin: m.Origin, Source: m.Source, Tombstone: m.NullBody}
}

// importRoute is the route a record's message is admitted by, in for the
// message as its ingest read it. Under its ingest's route, what the
// publisher chose is said as they would have said it, so that the route's
// rules decide as they did at ingest: a sink other than the route's is an
// x-delay-sink (allow_override, allowed_sinks), a destination other than
// the route's literal one an x-delay-destination (allow_override,
// allowed_destinations); one that the route's template gave (the
// message's own name is not kept, so the template cannot be expanded
// again) is taken as that template's, a destination chosen by the
// publisher held to allowed_destinations. Without a route (the admin
// API's, or no Routes), a route of its own with the record's sink and
// destination; a record of an ingest not configured is refused (admit).
func (s *Service) importRoute(m *envelope.Message, in *envelope.Incoming) *envelope.Route {
	if s.p.Routes != nil {
		if ir, ok := s.p.Routes(m.Ingest); ok {
			r := *ir
			r.Dialects = nil // the record's fields come as the delaybridge dialect's headers (incoming)
			if m.Sink != r.Sink {
				in.Headers = append(in.Headers, envelope.Header{Key: envelope.HeaderSink, Value: m.Sink})
			}
			switch t, err := envelope.ParseTemplate(r.Destination); {
			case err == nil && !t.Literal():
				r.Destination, in.Source = "{source.1:}", m.Destination
			case m.Destination != r.Destination:
				in.Headers = append(in.Headers, envelope.Header{Key: envelope.HeaderDestination, Value: literal.Replace(m.Destination)})
			}
			return &r
		}
	}
	return &envelope.Route{Ingest: m.Ingest, Sinks: s.p.Destinations, Sink: m.Sink, Destination: literal.Replace(m.Destination)}
}

// literal writes a destination as a template that expands to itself.
var literal = strings.NewReplacer("{", "{{", "}", "}}")

// recordFields renames the control headers in a reason of envelope.Parse
// to the fields of an export record that stand for them (incoming), and
// drops what the reason says of keeping a rejected message.
var recordFields = strings.NewReplacer(
	"no destination: the route has none and no "+envelope.HeaderDestination+" was given", `"destination" is empty`,
	" (body not kept)", "", " (not kept)", "",
	envelope.HeaderEvery, `"recurrence.every"`,
	envelope.HeaderCron, `"recurrence.cron"`,
	envelope.HeaderTimeZone, `"recurrence.timezone"`,
	envelope.HeaderUntil, `"recurrence.until"`,
	envelope.HeaderCount, `"recurrence.count"`,
	envelope.HeaderPriority, `"priority"`,
	envelope.HeaderGroup, `"group"`,
	envelope.HeaderDestination, `"destination"`,
	envelope.HeaderSink, `"sink"`,
	envelope.HeaderDeliverAt, `"due_at"`,
	envelope.HeaderMessageID, `"id"`,
	"route.destination", `"destination"`,
)
