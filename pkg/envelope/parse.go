package envelope

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/delaybridge/delaybridge/pkg/destination"
)

// Incoming is a message as an ingest adapter received it, before delaybridge
// looked at its headers.
type Incoming struct {
	Headers Headers
	Body    []byte
	Key     []byte // Kafka record key; nil when none

	// PublishedAt is the broker's precise publish time (Kafka record
	// timestamp, JetStream message time), at its full resolution; zero when
	// the broker records none or only whole seconds (AMQP). The delay
	// counts from it when set, capped at the moment of ingest (a
	// producer's clock cannot place a message in the future).
	PublishedAt time.Time

	// Properties are the broker message's fields that are not headers,
	// named and encoded by the ingest broker's package; Parse copies them
	// to Message.Properties.
	Properties Headers

	// NativeID is the broker's own message ID property (AMQP message_id);
	// NATS's Nats-Msg-Id is read from Headers.
	NativeID string

	// Origin is where the message was read in the broker's own order (a
	// Kafka partition and offset, a JetStream stream and sequence, an AMQP
	// delivery's content print); see envelope.Origin.
	Origin Origin
	// Redelivered is the broker's word that it delivered this message
	// before (AMQP redelivered). Kafka and JetStream need none: a position
	// read again says so itself.
	Redelivered bool

	// HeaderError, when set, says why the broker's header block could not
	// be decoded (Headers is then empty or partial). Parse rejects such a
	// message with this reason before looking at any header, so that the
	// dead message says what was wrong instead of "no x-delay header".
	HeaderError string

	// Source is the message's own name in its broker: the NATS subject, the
	// AMQP routing key it was published with, the Kafka topic. Destination
	// templates expand {source} from it.
	Source string

	// Tombstone marks a Kafka record with a null value (not an empty one).
	// The kafka-scheduler dialect reads it as a cancel of the parked
	// message of that key; otherwise a null value is parked as it is
	// (Message.NullBody) and published as null.
	Tombstone bool
}

// Route is what an ingest does with the messages it reads.
type Route struct {
	Ingest      string
	Sink        string
	Destination string

	// AllowOverride lets x-delay-sink and x-delay-destination choose another
	// sink or destination, restricted to AllowedSinks (sink names) and
	// AllowedDestinations when those are non-empty. AllowedDestinations
	// are patterns in the sink broker's own wildcards (destination.Syntax);
	// they also restrict what a template's placeholders expand to, and
	// only they open a broker's control plane (destination.Reserved).
	AllowOverride       bool
	AllowedSinks        []string
	AllowedDestinations []string

	// DefaultDelay applies to messages without a delay header; without it
	// (HasDefaultDelay false) such messages are rejected.
	DefaultDelay    time.Duration
	HasDefaultDelay bool

	// Sinks returns the destination syntax of the configured sink name,
	// false when there is none of that name; nil knows every name, as
	// destination.Generic.
	Sinks func(name string) (destination.Syntax, bool)

	// Missed is what a recurring message does with the occurrences missed
	// while nothing fired (route.missed), MissedMax how many of them all
	// publishes at most (route.missed_max; 0: DefaultMissedMax).
	Missed    Missed
	MissedMax int
	// NoRecurring refuses recurring messages (route.recurring: false).
	NoRecurring bool

	// Dialects are the header dialects the ingest reads; empty means
	// DialectDelaybridge alone.
	Dialects []Dialect
}

// Limits bound what one message may be; a zero field sets no bound. The
// configured ones come from config.Limits (limits: in the YAML file), whose
// defaults pkg/config names.
type Limits struct {
	MaxDelay        time.Duration // due time at most this far after now
	MaxPayloadBytes int           // body size
	MaxHeaderBytes  int           // sum of header key and value sizes
	MaxIDBytes      int           // message ID size
}

// Action is what to do with an ingested message.
type Action int

const (
	// Park the Message until its due time.
	Park Action = iota
	// Cancel the parked message CancelID; the control message itself is
	// not parked.
	Cancel
	// Reject the message: keep Message as a dead message with Reason.
	Reject
	// CancelGroup cancels every parked message of the group CancelGroup;
	// the control message itself is not parked.
	CancelGroup
)

func (a Action) String() string {
	switch a {
	case Park:
		return "park"
	case Cancel:
		return "cancel"
	case Reject:
		return "reject"
	case CancelGroup:
		return "cancel_group"
	}
	return "unknown"
}

// Decision is the outcome of Parse.
type Decision struct {
	Action   Action
	Message  *Message // Park: the message to park; Cancel, Reject: the message as received, to keep as dead
	CancelID string   // Cancel: the ID to cancel
	Group    string   // CancelGroup: the group to cancel
	Reason   string   // Reject: why, in words an operator can act on
	Code     string   // Reject: a short fixed name of the reason, for metrics (RejectCodes)

	// Tombstone is set on a Cancel that is a kafka-scheduler tombstone: a
	// tombstone for a key that is not parked is acknowledged, not rejected
	// (etf1's scheduler writes one after every schedule it fires).
	Tombstone bool
}

// RejectCodes lists every Decision.Code.
var RejectCodes = []string{
	CodeUndecodableHeaders, CodeInvalidID, CodePayloadTooLarge, CodeHeadersTooLarge, CodeDuplicateHeader,
	CodeInvalidCancel, CodeBothDelays, CodeInvalidDelay, CodeInvalidDeliverAt,
	CodeNoDelay, CodeOverMaxDelay, CodeInvalidPriority, CodeInvalidRoute, CodeCancelUnknown,
	CodeInvalidSchedule, CodeInvalidGroup,
	CodeInvalidDestination, CodeReservedDestination, CodeInvalidReplace, CodeInvalidEpoch, CodeInvalidScheduler,
	CodeMaxSeries,
}

// ReasonMaxSeries is the reason of a new recurring series refused for
// limits.max_series.
const ReasonMaxSeries = "the store holds as many live recurring series as limits.max_series allows: end or cancel series (x-delay-cancel, DELETE /v1/messages/{id}), or raise the limit"

// Reject codes.
const (
	CodeUndecodableHeaders = "undecodable_headers"
	CodeInvalidID          = "invalid_id"
	CodePayloadTooLarge    = "payload_too_large"
	CodeHeadersTooLarge    = "headers_too_large"
	CodeDuplicateHeader    = "duplicate_header"
	CodeInvalidCancel      = "invalid_cancel"
	CodeBothDelays         = "both_delay_headers"
	CodeInvalidDelay       = "invalid_delay"
	CodeInvalidDeliverAt   = "invalid_deliver_at"
	CodeNoDelay            = "no_delay"
	CodeOverMaxDelay       = "over_max_delay"
	CodeInvalidPriority    = "invalid_priority"
	CodeInvalidRoute       = "invalid_route"
	CodeCancelUnknown      = "cancel_unknown_id" // set by the ingest pipeline, not by Parse
	CodeInvalidSchedule    = "invalid_schedule"
	CodeInvalidGroup       = "invalid_group"

	CodeInvalidDestination  = "invalid_destination"      // a template that does not expand to a valid destination
	CodeReservedDestination = "reserved_destination"     // a broker's control plane (destination.ErrReserved)
	CodeMaxSeries           = "max_series"               // set by the ingest pipeline: a new series past limits.max_series
	CodeInvalidReplace      = "invalid_replace"          // x-delay-replace neither true nor false
	CodeInvalidEpoch        = "invalid_scheduler_epoch"  // kafka-scheduler: scheduler-epoch missing or not Unix seconds
	CodeInvalidScheduler    = "invalid_scheduler_record" // kafka-scheduler: no key, mixed dialects, a header of the other dialect
)

// NewID returns a generated message ID: a UUIDv7 (time-ordered, unique).
func NewID() string { return uuid.Must(uuid.NewV7()).String() }

// Parse applies the contract's header rules to one ingested message. now is
// the moment of ingest. It never fails: a message that cannot be parked is a
// Reject decision carrying the reason and the message, so that nothing is
// lost. newID generates an ID when the message and the broker offer none (nil
// means NewID).
func Parse(in *Incoming, r *Route, lim Limits, now time.Time, newID func() string) Decision {
	if newID == nil {
		newID = NewID
	}
	published := in.PublishedAt
	if published.After(now) {
		published = now // a producer's clock cannot place a message in the future
	}
	now = now.Truncate(time.Millisecond)
	p := parser{in: in, r: r, lim: lim, now: now, published: published}

	dialect, dialectErr := p.dialect()
	sched := dialect == DialectKafkaScheduler
	id, idErr := p.id(newID)
	if sched {
		// The record key is the ID; the usual sources only name a dead
		// record that has no usable key.
		if key, reason := p.schedulerID(); reason == "" {
			id, idErr = key, ""
		} else {
			idErr = reason
		}
	}
	msg := &Message{
		ID:          id,
		DueAt:       now,
		Sink:        r.Sink,
		Destination: r.Destination,
		Key:         in.Key,
		Body:        in.Body,
		Ingest:      r.Ingest,
		IngestedAt:  now,
		PublishedAt: published,
		Origin:      in.Origin,
		Redelivered: in.Redelivered,
		NullBody:    in.Tombstone,
		Properties:  in.Properties,
	}
	reject := func(code, format string, args ...any) Decision {
		// A rejected message keeps every header, control headers included,
		// so that an operator sees what was wrong; oversized parts are
		// dropped so that a limit still protects Redis.
		msg.Headers = in.Headers
		msg.Replace = false
		msg.Source = in.Source
		if lim.MaxHeaderBytes > 0 && in.Headers.Size()+len(in.Key) > lim.MaxHeaderBytes {
			msg.Headers, msg.Key = nil, nil
		}
		if lim.MaxPayloadBytes > 0 && len(in.Body) > lim.MaxPayloadBytes {
			msg.Body = nil
		}
		return Decision{Action: Reject, Message: msg, Reason: fmt.Sprintf(format, args...), Code: code}
	}
	if in.HeaderError != "" {
		return reject(CodeUndecodableHeaders, "the message's headers could not be decoded: %s", printable(in.HeaderError))
	}
	if dialectErr != "" {
		return reject(CodeInvalidScheduler, "%s", dialectErr)
	}
	if idErr != "" {
		if sched {
			return reject(CodeInvalidScheduler, "%s", idErr)
		}
		return reject(CodeInvalidID, "%s", idErr)
	}
	if code, reason := lim.CheckSize(in.Body, in.Headers, in.Key); code == CodePayloadTooLarge {
		return reject(code, "%s (body not kept)", reason)
	} else if code != "" {
		return reject(code, "%s (not kept)", reason)
	}
	unique := controlHeaders
	if sched {
		unique = append(slices.Clip(controlHeaders), schedulerControl...)
	}
	for _, h := range unique {
		if n := in.Headers.Count(h); n > 1 {
			return reject(CodeDuplicateHeader, "header %s given %d times; give it once", h, n)
		}
	}

	if sched && in.Tombstone {
		msg.Headers = in.Headers
		return Decision{Action: Cancel, Message: msg, CancelID: id, Tombstone: true}
	}
	if target, ok := in.Headers.Get(HeaderCancel); ok {
		if reason := checkID(HeaderCancel, target, lim.MaxIDBytes); reason != "" {
			return reject(CodeInvalidCancel, "%s", reason)
		}
		msg.Headers = in.Headers
		return Decision{Action: Cancel, Message: msg, CancelID: target}
	}
	if sched {
		for _, h := range []string{HeaderMessageID, HeaderDestination, HeaderReplace} {
			if _, ok := in.Headers.Get(h); ok {
				return reject(CodeInvalidScheduler, "%s given on a kafka-scheduler record: its ID is the record key, its destination %s, and a newer record always replaces", h, HeaderSchedulerTargetTopic)
			}
		}
	}

	if target, ok := in.Headers.Get(HeaderCancelGroup); ok {
		if reason := checkID(HeaderCancelGroup, target, lim.MaxIDBytes); reason != "" {
			return reject(CodeInvalidGroup, "%s", reason)
		}
		msg.Headers = in.Headers
		return Decision{Action: CancelGroup, Message: msg, Group: target}
	}

	var due time.Time
	var code, reason string
	if sched {
		due, code, reason = p.schedulerDue()
	} else {
		due, code, reason = p.due()
	}
	if reason != "" {
		return reject(code, "%s", reason)
	}
	msg.DueAt = due
	if g, ok := in.Headers.Get(HeaderGroup); ok {
		if reason := checkID(HeaderGroup, g, lim.MaxIDBytes); reason != "" {
			return reject(CodeInvalidGroup, "%s", reason)
		}
		msg.Group = g
	}
	if v, ok := in.Headers.Get(HeaderPriority); ok {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 0 || n > MaxPriority {
			return reject(CodeInvalidPriority, "%s %q is not an integer from 0 to %d", HeaderPriority, printable(v), MaxPriority)
		}
		msg.Priority = uint8(n)
	}
	if v, ok := in.Headers.Get(HeaderReplace); ok {
		switch strings.ToLower(strings.TrimSpace(v)) {
		case "true":
			msg.Replace = true
		case "false":
		default:
			return reject(CodeInvalidReplace, "%s %q is neither true nor false", HeaderReplace, printable(v))
		}
	}
	if code, reason := p.route(msg, sched); reason != "" {
		return reject(code, "%s", reason)
	}
	if sched {
		msg.Replace = true
		msg.Key = nil
		if k, _ := in.Headers.Get(HeaderSchedulerTargetKey); k != "" {
			msg.Key = []byte(k)
		}
		at := published
		if at.IsZero() {
			at = now
		}
		msg.Headers = schedulerHeaders(in.Headers, id, in.Source, at)
		return Decision{Action: Park, Message: msg}
	}
	msg.Headers = forwarded(in.Headers)
	msg.Recur = p.recur
	return Decision{Action: Park, Message: msg}
}

// CheckSize returns the reject code and reason of a message whose body, or
// headers and key together, are over the limits (max_payload_bytes,
// max_header_bytes), or "" "". Parse applies it to every message, and import
// to the dead ones it keeps as ingest kept them.
func (lim Limits) CheckSize(body []byte, h Headers, key []byte) (code, reason string) {
	if lim.MaxPayloadBytes > 0 && len(body) > lim.MaxPayloadBytes {
		return CodePayloadTooLarge, fmt.Sprintf("body is %d bytes, over limits.max_payload_bytes %d", len(body), lim.MaxPayloadBytes)
	}
	if size := h.Size() + len(key); lim.MaxHeaderBytes > 0 && size > lim.MaxHeaderBytes {
		return CodeHeadersTooLarge, fmt.Sprintf("headers and key are %d bytes, over limits.max_header_bytes %d", size, lim.MaxHeaderBytes)
	}
	return "", ""
}

type parser struct {
	in        *Incoming
	r         *Route
	lim       Limits
	now       time.Time // the moment of ingest, in whole milliseconds
	published time.Time // the broker's publish time capped at the moment of ingest; zero when none
	recur     *Recurrence
}

// id resolves the message ID in the contract's order: x-message-id, the
// broker's message ID property, Nats-Msg-Id, the broker position, a new ID.
// When the chosen ID is invalid it returns a usable fallback ID (the next
// source) together with the reason to reject.
func (p *parser) id(newID func() string) (id, reason string) {
	type candidate struct{ name, value string }
	var candidates []candidate
	if v, ok := p.in.Headers.Get(HeaderMessageID); ok {
		candidates = append(candidates, candidate{HeaderMessageID, v})
	}
	if p.in.NativeID != "" {
		candidates = append(candidates, candidate{"message_id", p.in.NativeID})
	}
	if v, ok := p.in.Headers.Get(HeaderNatsMsgID); ok && v != "" {
		candidates = append(candidates, candidate{HeaderNatsMsgID, v})
	}
	for i, c := range candidates {
		r := checkID(c.name, c.value, p.lim.MaxIDBytes)
		if r == "" {
			return c.value, reason
		}
		if i == 0 {
			reason = r // the chosen ID is invalid: reject, under the next usable one
		}
	}
	// The broker position is ours, bounded by the broker's own limits (a
	// Kafka topic name has at most 249 bytes): no max_id_bytes for it, so
	// that a redelivery always maps to the same ID.
	if pos := p.in.Origin.PositionID(); pos != "" && checkID("", pos, 0) == "" {
		return pos, reason
	}
	return newID(), reason
}

// CheckID validates a message ID: non-empty, valid UTF-8, at most max bytes
// (0: no limit), and without a character that changes how the ID is shown
// (IsDeceptive): so that one ID cannot be made to look like another in the
// JSON, the dashboard or the CLI. It returns "" or the reason, naming the ID
// as name. Every place that accepts an ID uses it: ingest headers, the
// admin API (body and path) and the command line.
func CheckID(name, v string, max int) string { return checkID(name, v, max) }

func checkID(name, v string, max int) string {
	if name == "" {
		name = "message ID"
	}
	switch {
	case v == "":
		return name + " is empty"
	case max > 0 && len(v) > max:
		return fmt.Sprintf("%s is %d bytes, over limits.max_id_bytes %d", name, len(v), max)
	case !utf8.ValidString(v):
		return name + " is not valid UTF-8"
	}
	for _, c := range v {
		if IsDeceptive(c) {
			return fmt.Sprintf("%s contains the control character %U (C0 and C1 controls, DEL and bidirectional overrides and isolates are refused in IDs)", name, c)
		}
	}
	return ""
}

// IsDeceptive reports whether r is refused in a message ID because it is
// invisible or changes the display of what follows: C0 controls, DEL, C1
// controls (U+0080-U+009F), and the bidirectional embeddings, overrides
// (U+202A-U+202E) and isolates (U+2066-U+2069).
func IsDeceptive(r rune) bool {
	return r < 0x20 || (r >= 0x7f && r <= 0x9f) || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069)
}

// DisplayID returns id for showing to a person: as it is when it has no
// character IsDeceptive refuses (every ID accepted since they are refused),
// else with each such character written as \uXXXX, so that an ID stored
// by an older version cannot pass for another one on a terminal or a page.
func DisplayID(id string) string {
	if !strings.ContainsFunc(id, IsDeceptive) {
		return id
	}
	var b strings.Builder
	for _, r := range id {
		if IsDeceptive(r) {
			fmt.Fprintf(&b, "\\u%04x", r)
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// due computes the due time from x-delay, x-deliver-at or the route's
// default delay, and for a recurring message its schedule (p.recur), whose
// first occurrence needs no delay header. A due time is never earlier than
// the instant the headers name: sub-millisecond digits round up.
func (p *parser) due() (due time.Time, code, reason string) {
	delay, hasDelay := p.in.Headers.Get(HeaderDelay)
	at, hasAt := p.in.Headers.Get(HeaderDeliverAt)
	// The broker's publish time counts to the nanosecond (a JetStream time
	// has them); the moment of ingest counts in whole milliseconds.
	base := p.now
	if !p.published.IsZero() {
		base = p.published
	}
	switch {
	case hasDelay && hasAt:
		return due, CodeBothDelays, "both x-delay and x-deliver-at given; give one"
	case hasDelay:
		d, reason := ParseDelay(delay)
		if reason != "" {
			return due, CodeInvalidDelay, reason
		}
		if d > p.lim.MaxDelay && p.lim.MaxDelay > 0 {
			return due, CodeOverMaxDelay, fmt.Sprintf("x-delay %s is over limits.max_delay %s", d, p.lim.MaxDelay)
		}
		due = ceilMillis(base.Add(d))
	case hasAt:
		t, reason := ParseDeliverAt(at)
		if reason != "" {
			return due, CodeInvalidDeliverAt, reason
		}
		due = t
	}
	r, first, reason := recurrence(p.in.Headers, base, due, hasDelay || hasAt, p.r, p.now)
	switch {
	case reason != "":
		return time.Time{}, CodeInvalidSchedule, reason
	case r != nil:
		p.recur, due = r, first
	case hasDelay || hasAt:
	case p.r.HasDefaultDelay:
		due = ceilMillis(base.Add(p.r.DefaultDelay))
	default:
		return due, CodeNoDelay, "no x-delay or x-deliver-at header, and the route has no default_delay"
	}
	if p.lim.MaxDelay > 0 && due.Sub(p.now) > p.lim.MaxDelay {
		return time.Time{}, CodeOverMaxDelay, fmt.Sprintf("due time %s is more than limits.max_delay %s from now", FormatTime(due), p.lim.MaxDelay)
	}
	if due.UnixMilli() >= MaxDueMs {
		return time.Time{}, CodeOverMaxDelay, fmt.Sprintf("due time %s is after %s, the latest delaybridge keeps", FormatTime(due), FormatTime(time.UnixMilli(MaxDueMs-1)))
	}
	return due, "", ""
}

// MaxDueMs bounds due times (Unix ms, exclusive): 2^42, in 2109. The store
// keeps a message held for its sink in a band above it (store.HoldBand).
const MaxDueMs = 1 << 42

// MaxPriority is the highest x-delay-priority; 0 is the default.
const MaxPriority = 9

// ParseDelay parses an x-delay value: integer milliseconds ("5000"),
// decimal milliseconds ("1500.5", as JavaScript and Python publishers and
// AMQP float and double headers give them), rounded up to the next whole
// millisecond (never early), or a Go duration ("1500ms", "5m", "1h30m"). It
// returns a reason when the value is empty, unparsable, negative or out of
// range.
func ParseDelay(v string) (time.Duration, string) {
	s := strings.TrimSpace(v)
	if s == "" {
		return 0, "x-delay is empty; give milliseconds (5000) or a duration (5s)"
	}
	if whole, frac, ok := decimalMillis(s); ok {
		if whole[0] == '-' && strings.Trim(whole[1:]+frac, "0") != "" {
			return 0, fmt.Sprintf("x-delay %q is negative", printable(v))
		}
		ms, err := strconv.ParseInt(whole, 10, 64)
		if err == nil && strings.Trim(frac, "0") != "" {
			ms++ // a fraction of a millisecond rounds up: never early
		}
		if err != nil || ms > int64(maxDuration/time.Millisecond) {
			return 0, fmt.Sprintf("x-delay %q is out of range (at most %d ms, about 292 years)", printable(v), int64(maxDuration/time.Millisecond))
		}
		return time.Duration(max(ms, 0)) * time.Millisecond, ""
	}
	d, err := time.ParseDuration(s)
	switch {
	case err != nil && durationShape.MatchString(s):
		return 0, fmt.Sprintf("x-delay %q is out of range (at most %s, about 292 years)", printable(v), maxDuration.Truncate(time.Hour))
	case err != nil:
		return 0, fmt.Sprintf("x-delay %q is neither milliseconds (5000, 1500.5) nor a duration (5s, 1h30m)", printable(v))
	case d < 0:
		return 0, fmt.Sprintf("x-delay %q is negative", printable(v))
	}
	return d, ""
}

// decimalMillis splits s, a decimal number of milliseconds with an
// optional sign and fraction ("5000", "-3", "1500.5", ".5"), into its whole
// part (with the sign) and its fraction digits; ok is false for anything
// else.
func decimalMillis(s string) (whole, frac string, ok bool) {
	whole, frac, dot := strings.Cut(s, ".")
	digits := strings.TrimLeft(whole, "+-")
	if len(whole)-len(digits) > 1 || (!dot && digits == "") || (dot && digits == "" && frac == "") {
		return "", "", false
	}
	for _, part := range []string{digits, frac} {
		for i := 0; i < len(part); i++ {
			if part[i] < '0' || part[i] > '9' {
				return "", "", false
			}
		}
	}
	if digits == "" {
		whole = whole + "0"
	}
	return whole, frac, true
}

// durationShape is the syntax of a Go duration, whatever its size: a value
// of this shape that time.ParseDuration refuses is out of range.
var durationShape = regexp.MustCompile(`^[-+]?(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+$`)

const maxDuration = time.Duration(1<<63 - 1)

// ParseDeliverAt parses an x-deliver-at value: RFC 3339 (fractions allowed)
// or integer Unix epoch milliseconds.
func ParseDeliverAt(v string) (time.Time, string) {
	s := strings.TrimSpace(v)
	if s == "" {
		return time.Time{}, "x-deliver-at is empty; give RFC 3339 (2026-12-01T10:00:00Z) or Unix milliseconds"
	}
	if isInteger(s) {
		ms, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return time.Time{}, fmt.Sprintf("x-deliver-at %q is out of range", printable(v))
		}
		if ms < 0 {
			return time.Time{}, fmt.Sprintf("x-deliver-at %q is before 1970", printable(v))
		}
		return time.UnixMilli(ms), ""
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Sprintf("x-deliver-at %q is neither RFC 3339 (2026-12-01T10:00:00Z) nor Unix milliseconds", printable(v))
	}
	if t.Before(time.Unix(0, 0)) {
		return time.Time{}, fmt.Sprintf("x-deliver-at %q is before 1970", printable(v))
	}
	return ceilMillis(t), ""
}

// route applies x-delay-sink and x-delay-destination (on a kafka-scheduler
// record scheduler-target-topic) to msg, expands the destination template,
// then checks the sink and destination the message ends up with, whether
// they came from the route or from the headers (destination.Syntax.Check,
// the one check of every path). It returns the reject code and reason, or
// "".
func (p *parser) route(msg *Message, sched bool) (code, reason string) {
	r := p.r
	sink, hasSink := p.in.Headers.Get(HeaderSink)
	destHeader := HeaderDestination
	if sched {
		destHeader = HeaderSchedulerTargetTopic
	}
	dest, hasDest := p.in.Headers.Get(destHeader)
	if (hasSink || hasDest) && !r.AllowOverride {
		given := HeaderSink + "/" + destHeader
		return CodeInvalidRoute, fmt.Sprintf("%s given, but the route of ingest %q does not allow overrides (route.allow_override)", given, r.Ingest)
	}
	if hasSink {
		sink = strings.TrimSpace(sink)
		if sink == "" {
			return CodeInvalidRoute, HeaderSink + " is empty"
		}
		if len(r.AllowedSinks) > 0 && !contains(r.AllowedSinks, sink) {
			return CodeInvalidRoute, fmt.Sprintf("%s %q is not in route.allowed_sinks", HeaderSink, printable(sink))
		}
		msg.Sink = sink
	}
	from, raw := "route.destination", r.Destination
	if hasDest {
		if strings.TrimSpace(dest) == "" {
			return CodeInvalidRoute, destHeader + " is empty"
		}
		from, raw = destHeader, dest
	}
	final, templated := raw, false
	// A destination without braces is literal: no template to parse (the
	// common case, and a per-message cost at the maximum rate).
	// scheduler-target-topic is a topic name, as etf1 reads it.
	if (!sched || !hasDest) && strings.ContainsAny(raw, "{}") {
		t, err := ParseTemplate(raw)
		if err != nil {
			return CodeInvalidDestination, fmt.Sprintf("%s %q: %v", from, printable(raw), err)
		}
		var why string
		if final, why = t.Expand(p.in.Source, p.in.Headers); why != "" {
			return CodeInvalidDestination, fmt.Sprintf("%s %q: %s", from, printable(raw), why)
		}
		templated = !t.Literal()
	}
	msg.Destination = final
	if msg.Sink == "" {
		return CodeInvalidRoute, "no sink: the route has none and no x-delay-sink was given"
	}
	syntax, ok := r.syntax(msg.Sink)
	if !ok {
		return CodeInvalidRoute, fmt.Sprintf("sink %q names no configured sink", printable(msg.Sink))
	}
	if !hasDest && !templated && strings.TrimSpace(final) == "" {
		return CodeInvalidRoute, "no destination: the route has none and no x-delay-destination was given"
	}
	if err := syntax.Check(final, r.AllowedDestinations, hasDest || templated); err != nil {
		switch {
		case errors.Is(err, destination.ErrNotAllowed):
			return CodeInvalidRoute, fmt.Sprintf("%s %q matches no pattern of route.allowed_destinations", from, printable(final))
		case errors.Is(err, destination.ErrReserved):
			return CodeReservedDestination, err.Error()
		case templated:
			return CodeInvalidDestination, fmt.Sprintf("%s %q expands to an invalid destination: %v", from, printable(raw), err)
		case hasDest:
			return CodeInvalidRoute, err.Error()
		}
		return CodeInvalidDestination, err.Error()
	}
	return "", ""
}

// syntax is the destination syntax of the sink name; false when no sink of
// that name is configured. A route without Sinks knows every name, as
// destination.Generic.
func (r *Route) syntax(name string) (destination.Syntax, bool) {
	if r.Sinks == nil {
		return destination.Generic, true
	}
	return r.Sinks(name)
}

// forwarded returns the headers without the control headers.
func forwarded(h Headers) Headers {
	n := 0
	for _, kv := range h {
		if !IsControlHeader(kv.Key) {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	out := make(Headers, 0, n)
	for _, kv := range h {
		if !IsControlHeader(kv.Key) {
			out = append(out, kv)
		}
	}
	return out
}

func isInteger(s string) bool {
	if s[0] == '+' || s[0] == '-' {
		s = s[1:]
	}
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// printable quotes at most 64 bytes of a header value for a reason.
var printable = destination.Printable
