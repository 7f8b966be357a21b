package ops

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/jsonlimit"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// Scalar is a request field that is a JSON number or string, kept as it
// came (the JSON text): a delay of integer milliseconds or a duration, a
// time of RFC 3339 or epoch milliseconds. Null and absent are "not given".
type Scalar []byte

// Text returns the Scalar of a string value, as a JSON string.
func Text(v string) Scalar {
	b, _ := json.Marshal(v)
	return b
}

// MarshalJSON implements json.Marshaler.
func (s Scalar) MarshalJSON() ([]byte, error) {
	if len(s) == 0 {
		return []byte("null"), nil
	}
	return s, nil
}

// UnmarshalJSON implements json.Unmarshaler.
func (s *Scalar) UnmarshalJSON(b []byte) error {
	*s = append((*s)[:0], b...)
	return nil
}

// text reads the value as text: a JSON string's content or a number's
// digits. given is false for null and absent.
func (s Scalar) text(field string) (text string, given bool, err *Error) {
	raw := bytes.TrimSpace(s)
	if len(raw) == 0 || string(raw) == "null" {
		return "", false, nil
	}
	switch c := raw[0]; {
	case c == '"':
		if json.Unmarshal(raw, &text) != nil {
			return "", false, invalid(field, "%s is not a valid JSON string", field)
		}
		return text, true, nil
	case c == '-' || (c >= '0' && c <= '9'):
		return string(raw), true, nil
	}
	return "", false, invalid(field, "%s must be an integer or a string, not %s", field, jsonKind(raw[0]))
}

// jsonKind names the kind of JSON value that starts with c, for a reason
// that must not quote the value.
func jsonKind(c byte) string {
	switch c {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	}
	return "that"
}

// PostRequest is a new message (POST /v1/messages): delay and deliver_at
// are what x-delay and x-deliver-at say on an ingest, sink and destination
// the route, key, headers and body the message, and the options
// (envelope.Options: id, priority, group, replace, every, cron, timezone,
// until, count) what their headers say.
type PostRequest struct {
	Delay       Scalar            `json:"delay,omitempty" doc:"delay as integer milliseconds (5000) or a Go duration (\"1500ms\", \"5m\"); give this or deliver_at (or a recurrence)"`
	DeliverAt   Scalar            `json:"deliver_at,omitempty" doc:"due time: RFC 3339 (\"2026-12-01T10:00:00Z\") or integer epoch milliseconds"`
	Sink        string            `json:"sink" doc:"the name of a configured sink"`
	Destination string            `json:"destination" doc:"a topic, subject or routing key of the sink; may be a template ({header.NAME})"`
	Key         *string           `json:"key,omitempty" nullable:"true" doc:"the Kafka record key"`
	Headers     map[string]string `json:"headers,omitempty" doc:"headers forwarded to the sink (not control headers)"`
	Body        *string           `json:"body,omitempty" nullable:"true" doc:"the body as text; give this or body_base64 (\"\" for an empty body)"`
	BodyBase64  *string           `json:"body_base64,omitempty" nullable:"true" doc:"the body, standard base64"`
	envelope.Options
}

// RescheduleRequest is a new due time (PATCH /v1/messages/{id}): a delay
// from now or a time, read as x-delay and x-deliver-at are; and optionally
// the due time the caller read, so that the change is made only if nobody
// changed it meanwhile (compare and set).
type RescheduleRequest struct {
	Delay     Scalar `json:"delay,omitempty" doc:"integer milliseconds or a Go duration from now"`
	DeliverAt Scalar `json:"deliver_at,omitempty" doc:"RFC 3339 or epoch milliseconds; a time that has passed fires now"`
	IfDueAt   Scalar `json:"if_due_at,omitempty" doc:"change it only if the message is due at this time now"`
}

// RetryRequest is a retry of a dead message (POST /v1/dead/{id}/retry): a
// sink or destination to give it instead of its own, which a message that
// died for its sink or destination needs.
type RetryRequest struct {
	Sink        string `json:"sink,omitempty" doc:"the sink to publish to instead of the message's"`
	Destination string `json:"destination,omitempty" doc:"the destination to publish to instead of the message's"`
}

// UnmarshalJSON reads the request and refuses a field given empty, which
// would otherwise read as not given (the message's own sink or
// destination): `dead retry --destination ""` is refused alike.
func (r *RetryRequest) UnmarshalJSON(b []byte) error {
	var given struct {
		Sink        *string `json:"sink"`
		Destination *string `json:"destination"`
	}
	if err := json.Unmarshal(b, &given); err != nil {
		return err
	}
	for name, v := range map[string]*string{"sink": given.Sink, "destination": given.Destination} {
		if v != nil && *v == "" {
			return fmt.Errorf("%q is empty: give a %s, or leave the field out to keep the message's", name, name)
		}
	}
	*r = RetryRequest{}
	if given.Sink != nil {
		r.Sink = *given.Sink
	}
	if given.Destination != nil {
		r.Destination = *given.Destination
	}
	return nil
}

// ListQuery selects a page of messages (GET /v1/messages, `delaybridge
// list`). Times are RFC 3339 or epoch milliseconds, as given.
type ListQuery struct {
	State       string // "" (scheduled, held and in flight), scheduled, held, inflight or dead
	DueAfter    string // at or after; for dead messages the time of death
	DueBefore   string // strictly before
	Sink        string
	Destination string
	Ingest      string
	Group       string
	Recurring   bool
	Limit       *int   // 1 to store.MaxBrowseLimit; nil: store.DefaultBrowseLimit
	Cursor      string // a page's next_cursor
	Content     bool   // with each message's key, headers and body
}

// browse checks q and returns the store's query.
func (s *Service) listBrowse(q ListQuery) (store.BrowseQuery, *Error) {
	bq := store.BrowseQuery{Sink: q.Sink, Destination: q.Destination, Ingest: q.Ingest, Group: q.Group,
		Recurring: q.Recurring, Cursor: q.Cursor}
	if err := s.checkFilters(q.Sink, q.Destination, q.Ingest, q.Group); err != nil {
		return bq, err
	}
	switch q.State {
	case "", store.StateScheduled, store.StateHeld, store.StateInflight, store.StateDead:
		bq.State = q.State
	default:
		return bq, invalid("state", "state %s: give scheduled, held, inflight or dead (none: scheduled, held and inflight)", quote(q.State))
	}
	var err *Error
	if bq.DueAfter, err = timeField("due_after", q.DueAfter); err != nil {
		return bq, err
	}
	if bq.DueBefore, err = timeField("due_before", q.DueBefore); err != nil {
		return bq, err
	}
	if q.Limit != nil {
		if *q.Limit < 1 || *q.Limit > store.MaxBrowseLimit {
			return bq, invalid("limit", "limit %d: give an integer from 1 to %d", *q.Limit, store.MaxBrowseLimit)
		}
		bq.Limit = *q.Limit
	}
	return bq, nil
}

// Bounds of a dead list's limit.
const (
	DefaultDeadLimit = 100
	MaxDeadLimit     = 10_000
)

// DeadFilter selects dead messages (GET and DELETE /v1/dead, `delaybridge
// dead list` and `dead purge`): a field that is not empty must equal the
// message's; DeadAfter and DeadBefore bound the time of death (RFC 3339 or
// epoch milliseconds; at or after, strictly before). An empty field is no
// filter: a front end that can tell a filter given empty from one left
// out refuses the former (EmptyFilter), so that it never selects every
// dead message.
type DeadFilter struct {
	Sink, Destination, Ingest, Group string
	DeadAfter, DeadBefore            string
}

// any reports whether the filter selects fewer than every dead message.
func (f DeadFilter) any() bool { return f != DeadFilter{} }

// deadBrowse checks f and returns the store's query of the dead messages
// it selects.
func (s *Service) deadBrowse(f DeadFilter) (store.BrowseQuery, *Error) {
	bq := store.BrowseQuery{State: store.StateDead, Sink: f.Sink, Destination: f.Destination, Ingest: f.Ingest,
		Group: f.Group, Limit: store.MaxBrowseLimit}
	if err := s.checkFilters(f.Sink, f.Destination, f.Ingest, f.Group); err != nil {
		return bq, err
	}
	var err *Error
	if bq.DueAfter, err = timeField("dead_after", f.DeadAfter); err != nil {
		return bq, err
	}
	if bq.DueBefore, err = timeField("dead_before", f.DeadBefore); err != nil {
		return bq, err
	}
	return bq, nil
}

// DeadQuery selects a list of dead messages.
type DeadQuery struct {
	DeadFilter
	Limit *int // 1 to MaxDeadLimit; nil: DefaultDeadLimit
}

// timeField reads a time given as RFC 3339 or epoch milliseconds, as
// x-deliver-at is read; "" is the zero time.
func timeField(field, v string) (time.Time, *Error) {
	if v == "" {
		return time.Time{}, nil
	}
	t, reason := envelope.ParseDeliverAt(v)
	if reason != "" {
		return time.Time{}, invalid(field, "%s", strings.ReplaceAll(reason, envelope.HeaderDeliverAt, field))
	}
	return t, nil
}

// EmptyFilter is the refusal of a filter (or another parameter) given with
// an empty value, name as the front end spells it ("group", "--group"):
// read as no filter it would select every message, which an empty value
// never means. The admin API refuses every query parameter given empty,
// the command line every filter flag.
func EmptyFilter(name string) error {
	return invalid(strings.TrimLeft(name, "-"), "%s is given empty: give it a value, or leave it out (an empty filter is never read as \"every message\")", name)
}

// checkFilters refuses a filter value that no message can have: a sink,
// destination or ingest that is blank, not UTF-8 or holds a control
// character, and a group that checkID refuses. An empty one is no filter.
func (s *Service) checkFilters(sink, dest, ingest, group string) *Error {
	for _, f := range []struct{ field, v string }{{"sink", sink}, {"destination", dest}, {"ingest", ingest}} {
		switch {
		case f.v == "":
		case strings.TrimSpace(f.v) == "":
			return invalid(f.field, "%s %s is blank: give a name, or leave %s out to select every message", f.field, quote(f.v), f.field)
		case !utf8.ValidString(f.v) || strings.ContainsFunc(f.v, envelope.IsDeceptive):
			return invalid(f.field, "%s %s is not UTF-8 or holds a control character: no message has it", f.field, quote(f.v))
		}
	}
	if group != "" {
		return s.checkID("group", "the group", group)
	}
	return nil
}

// checkID refuses an ID (or a group key: what) that no message can have:
// empty, not UTF-8, with a deceptive character, or longer than
// limits.max_id_bytes. The reason quotes at most quoteMax bytes of it.
func (s *Service) checkID(field, what, v string) *Error {
	name := what + " " + strconv.QuoteToASCII(jsonlimit.Clip(v, quoteMax))
	if reason := envelope.CheckID(name, v, s.p.Limits.MaxIDBytes); reason != "" {
		return invalid(field, "%s", reason)
	}
	return nil
}

// fieldOf maps the control headers to the request fields that stand for
// them, for Parse's reasons (a request field is named as the request
// names it): the message's own and every option's (envelope.Options),
// the longer names first (x-delay is a prefix of most).
var fieldOf = func() []struct{ header, field string } {
	out := []struct{ header, field string }{
		{envelope.HeaderDestination, "destination"},
		{envelope.HeaderSink, "sink"},
		{envelope.HeaderDeliverAt, "deliver_at"},
		{envelope.HeaderDelay, "delay"},
	}
	for _, o := range envelope.OptionTable() {
		out = append(out, struct{ header, field string }{o.Header, o.Field})
	}
	slices.SortStableFunc(out, func(a, b struct{ header, field string }) int { return len(b.header) - len(a.header) })
	return out
}()

// fieldNames renames the control headers in a reason of envelope.Parse to
// the request fields they came from.
var fieldNames = func() *strings.Replacer {
	var pairs []string
	for _, f := range fieldOf {
		pairs = append(pairs, f.header, f.field)
	}
	return strings.NewReplacer(pairs...)
}()

// FieldNames renames the control headers in a reason of envelope.Parse to
// the request fields of PostRequest they stand for (x-delay -> delay).
func FieldNames(reason string) string { return fieldNames.Replace(reason) }

// fieldOfCode is the request field a reject code of envelope.Parse is
// about; "" when it depends (see rejectField).
var fieldOfCode = map[envelope.Code]string{
	envelope.CodeInvalidID:           "id",
	envelope.CodePayloadTooLarge:     "body",
	envelope.CodeHeadersTooLarge:     "headers",
	envelope.CodeDuplicateHeader:     "headers",
	envelope.CodeBothDelays:          "delay",
	envelope.CodeInvalidDelay:        "delay",
	envelope.CodeInvalidDeliverAt:    "deliver_at",
	envelope.CodeNoDelay:             "delay",
	envelope.CodeInvalidPriority:     "priority",
	envelope.CodeInvalidGroup:        "group",
	envelope.CodeInvalidReplace:      "replace",
	envelope.CodeInvalidDestination:  "destination",
	envelope.CodeDestinationReserved: "destination",
}

// rejectField names the request field a rejection of Parse (Decision.Err)
// is about.
func rejectField(err error, hasAt bool) string {
	code, reason := envelope.CodeOf(err), err.Error()
	switch code {
	case envelope.CodeOverMaxDelay:
		if hasAt {
			return "deliver_at"
		}
		return "delay"
	case envelope.CodeInvalidRoute:
		if strings.Contains(reason, "sink") && !strings.Contains(reason, "destination") {
			return "sink"
		}
		return "destination"
	case envelope.CodeInvalidSchedule:
		// The first option the reason names in the table's order: of a
		// schedule's, every, cron, timezone, until, count.
		for _, o := range envelope.OptionTable() {
			if strings.Contains(reason, o.Header) {
				return o.Field
			}
		}
		return "every"
	}
	if f := fieldOfCode[code]; f != "" {
		return f
	}
	return "body"
}

// errorf wraps a failure to reach Redis with the operation.
func errorf(op string, err error) error { return fmt.Errorf("%s: %w", op, err) }
