package envelope

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf16"
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
	// LogCreated is when the log of Origin was created, where the broker
	// says (a JetStream stream), else zero. A log deleted and created
	// again under its name numbers its messages anew: the ingest pipeline
	// reads the messages of one that is not the first it recorded under a
	// log name of their own (ingest.LogRecorder), so that the IDs derived
	// from their positions are not the old log's.
	LogCreated time.Time
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
	// MinInterval is the shortest time between two occurrences of a
	// recurring message (limits.min_interval); 0: MinEvery.
	MinInterval time.Duration
	// Fits returns why the sink of a message that passed every other
	// rule would refuse it for its size (a Kafka sink's
	// max_message_bytes, a NATS server's max_payload: sinks.Sizer), or
	// nil; Parse then refuses it as CodePayloadTooLarge at once, not
	// after its delay. nil: no such check (tools without their sinks).
	Fits func(m *Message) error
}

// MaxDocumentBytes bounds a JSON document that carries one message within
// the limits (a POST /v1/messages body): twice the body and the headers,
// which may come base64-encoded or JSON-escaped, and 64 KiB for the fields
// around them; 64 MiB without a payload or header limit.
func (l Limits) MaxDocumentBytes() int64 {
	if l.MaxPayloadBytes <= 0 || l.MaxHeaderBytes <= 0 {
		return 64 << 20
	}
	return 2*int64(l.MaxPayloadBytes) + 2*int64(l.MaxHeaderBytes) + 64<<10
}

// MaxRecordBytes bounds a line of an export: a message and the version
// that waits behind it (a replacement or a new message of its ID that came
// while it was in flight), each a document of MaxDocumentBytes.
func (l Limits) MaxRecordBytes() int64 { return 2 * l.MaxDocumentBytes() }

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

	// Err is why a Reject is rejected: a *Rejection, whose reason the dead
	// message keeps (Err.Error()) and whose Code is the metric label
	// (CodeOf); errors.Is(d.Err, CodeInvalidRoute) matches one code. nil
	// for every other Action.
	Err error

	// Tombstone is set on a Cancel that is a kafka-scheduler tombstone: a
	// tombstone for a key that is not parked is acknowledged, not rejected
	// (etf1's scheduler writes one after every schedule it fires).
	Tombstone bool
}

// NewID returns a generated message ID: a UUIDv7 (time-ordered, unique).
func NewID() string { return uuid.Must(uuid.NewV7()).String() }

// Parse applies the contract's header rules to one ingested message. now is
// the moment of ingest. It never fails: a message that cannot be parked is a
// Reject decision carrying the rejection and the message, so that nothing is
// lost. newID generates an ID when the message and the broker offer none (nil
// means NewID).
//
// The message's dialect (Route.Dialects) has its own reader (a
// dialectReader: the ID, control messages, the due time, the destination
// header, what is published); Parse applies around it the rules every
// message meets, in the order dialectReader states.
func Parse(in *Incoming, r *Route, lim Limits, now time.Time, newID func() string) Decision {
	if newID == nil {
		newID = NewID
	}
	published := in.PublishedAt
	if published.After(now) {
		published = now // a producer's clock cannot place a message in the future
	}
	p := parser{in: in, r: r, lim: lim, now: CeilMillis(now), instant: now, published: published}

	rd, dialectErr := p.reader()
	id, idErr := rd.id(&p, newID)
	msg := &Message{
		ID:          id,
		DueAt:       p.now,
		Sink:        r.Sink,
		Destination: r.Destination,
		Key:         in.Key,
		Body:        in.Body,
		Ingest:      r.Ingest,
		IngestedAt:  p.now,
		PublishedAt: published,
		Origin:      in.Origin,
		Redelivered: in.Redelivered,
		NullBody:    in.Tombstone,
		Properties:  in.Properties,
	}
	reject := func(err error) Decision {
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
		return Decision{Action: Reject, Message: msg, Err: err}
	}
	if in.HeaderError != "" {
		return reject(rejectf(CodeUndecodableHeaders, "the message's headers could not be decoded: %s", printable(in.HeaderError)))
	}
	if dialectErr != nil {
		return reject(dialectErr)
	}
	if idErr != nil {
		return reject(idErr)
	}
	if err := lim.CheckSize(in.Body, in.Headers, in.Key); err != nil {
		kept := " (not kept)"
		if errors.Is(err, CodePayloadTooLarge) {
			kept = " (body not kept)"
		}
		return reject(&Rejection{Code: CodeOf(err), Reason: err.Error() + kept})
	}
	for _, h := range rd.unique() {
		if n := in.Headers.Count(h); n > 1 {
			return reject(rejectf(CodeDuplicateHeader, "header %s given %d times; give it once", h, n))
		}
	}

	c, err := rd.control(&p)
	if err != nil {
		return reject(err)
	}
	switch c.action {
	case Cancel:
		msg.Headers = in.Headers
		return Decision{Action: Cancel, Message: msg, CancelID: c.target, Tombstone: c.tombstone}
	case CancelGroup:
		msg.Headers = in.Headers
		return Decision{Action: CancelGroup, Message: msg, Group: c.target}
	}
	if err := rd.foreign(&p); err != nil {
		return reject(err)
	}

	due, err := rd.due(&p)
	if err != nil {
		return reject(err)
	}
	msg.DueAt = due
	if g, ok := in.Headers.Get(HeaderGroup); ok {
		if reason := checkID(HeaderGroup, g, lim.MaxIDBytes); reason != "" {
			return reject(rejectf(CodeInvalidGroup, "%s", reason))
		}
		msg.Group = g
	}
	if v, ok := in.Headers.Get(HeaderPriority); ok {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 0 || n > MaxPriority {
			return reject(rejectf(CodeInvalidPriority, "%s %q is not an integer from 0 to %d", HeaderPriority, printable(v), MaxPriority))
		}
		msg.Priority = uint8(n)
	}
	if v, ok := in.Headers.Get(HeaderReplace); ok {
		switch strings.ToLower(strings.TrimSpace(v)) {
		case "true":
			msg.Replace = true
		case "false":
		default:
			return reject(rejectf(CodeInvalidReplace, "%s %q is neither true nor false", HeaderReplace, printable(v)))
		}
	}
	if err := p.route(msg, rd); err != nil {
		return reject(err)
	}
	rd.finish(&p, msg)
	if lim.Fits != nil {
		if err := lim.Fits(msg); err != nil {
			return reject(rejectf(CodePayloadTooLarge, "too large for its sink: %v", err))
		}
	}
	return Decision{Action: Park, Message: msg}
}

// CheckSize returns the rejection of a message whose body, or headers and
// key together, are over the limits (max_payload_bytes, max_header_bytes:
// CodePayloadTooLarge, CodeHeadersTooLarge), or nil. Parse applies it to
// every message, and import to the dead ones it keeps as ingest kept them.
func (lim Limits) CheckSize(body []byte, h Headers, key []byte) error {
	if lim.MaxPayloadBytes > 0 && len(body) > lim.MaxPayloadBytes {
		return rejectf(CodePayloadTooLarge, "body is %d bytes, over limits.max_payload_bytes %d", len(body), lim.MaxPayloadBytes)
	}
	if size := h.Size() + len(key); lim.MaxHeaderBytes > 0 && size > lim.MaxHeaderBytes {
		return rejectf(CodeHeadersTooLarge, "headers and key are %d bytes, over limits.max_header_bytes %d", size, lim.MaxHeaderBytes)
	}
	return nil
}

type parser struct {
	in        *Incoming
	r         *Route
	lim       Limits
	now       time.Time // the moment of ingest rounded up to a whole millisecond: ingested at, max_delay's origin
	instant   time.Time // the moment of ingest as read: a delay or a schedule without a publish time counts from it
	published time.Time // the broker's publish time capped at the moment of ingest; zero when none
	recur     *Recurrence
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

// IsHidden reports whether r is written as an escape wherever delaybridge
// shows text to a person (DisplayID, the admin API's JSON, the
// dashboard): the characters IsDeceptive refuses in IDs, and the
// invisible ones an ID may hold, Unicode's default-ignorable code points
// (zero-width spaces and joiners, the byte-order mark, the soft hyphen,
// variation selectors...), so that "victim" followed by one of them is
// not shown as "victim".
func IsHidden(r rune) bool {
	return IsDeceptive(r) || unicode.Is(unicode.Cf, r) || unicode.Is(unicode.Other_Default_Ignorable_Code_Point, r) ||
		unicode.Is(unicode.Variation_Selector, r)
}

// DisplayID returns id for showing to a person: as it is when it has no
// character IsHidden names, else with each such character written as
// \uXXXX (a character beyond U+FFFF as its UTF-16 pair, as JSON writes
// it), so that an ID cannot pass for another one on a terminal or a page.
func DisplayID(id string) string {
	if !strings.ContainsFunc(id, IsHidden) {
		return id
	}
	var b []byte
	for _, r := range id {
		if IsHidden(r) {
			b = AppendEscape(b, r)
		} else {
			b = utf8.AppendRune(b, r)
		}
	}
	return string(b)
}

// AppendEscape appends r as a JSON escape: \uXXXX, or the two of its
// UTF-16 surrogate pair beyond U+FFFF.
func AppendEscape(b []byte, r rune) []byte {
	if r1, r2 := utf16.EncodeRune(r); r1 != utf8.RuneError {
		return fmt.Appendf(b, `\u%04x\u%04x`, r1, r2)
	}
	return fmt.Appendf(b, `\u%04x`, r)
}

// MaxDueMs bounds due times (Unix ms, exclusive): 2^42, in 2109. The store
// keeps a message held for its sink in a band above it (store.HoldBand).
const MaxDueMs = 1 << 42

// MaxPriority is the highest x-delay-priority; 0 is the default.
const MaxPriority = 9

// route applies x-delay-sink and the dialect's destination header
// (x-delay-destination, scheduler-target-topic) to msg, expands the
// destination template, then checks the sink and destination the message
// ends up with, whether they came from the route or from the headers
// (destination.Syntax.Check, the one check of every path). It returns the
// rejection, or nil.
func (p *parser) route(msg *Message, rd dialectReader) error {
	r := p.r
	sink, hasSink := p.in.Headers.Get(HeaderSink)
	destHeader, literal := rd.destination()
	dest, hasDest := p.in.Headers.Get(destHeader)
	if (hasSink || hasDest) && !r.AllowOverride {
		given := HeaderSink + "/" + destHeader
		return rejectf(CodeInvalidRoute, "%s given, but the route of ingest %q does not allow overrides (route.allow_override)", given, r.Ingest)
	}
	if hasSink {
		sink = strings.TrimSpace(sink)
		if sink == "" {
			return rejectf(CodeInvalidRoute, "%s is empty", HeaderSink)
		}
		if len(r.AllowedSinks) > 0 && !contains(r.AllowedSinks, sink) {
			return rejectf(CodeInvalidRoute, "%s %q is not in route.allowed_sinks", HeaderSink, printable(sink))
		}
		msg.Sink = sink
	}
	from, raw := "route.destination", r.Destination
	if hasDest {
		if strings.TrimSpace(dest) == "" {
			return rejectf(CodeInvalidRoute, "%s is empty", destHeader)
		}
		from, raw = destHeader, dest
	}
	final, templated := raw, false
	// A destination without braces is literal: no template to parse (the
	// common case, and a per-message cost at the maximum rate). So is a
	// header the dialect reads as a literal name.
	if (!literal || !hasDest) && strings.ContainsAny(raw, "{}") {
		t, err := ParseTemplate(raw)
		if err != nil {
			return rejectf(CodeInvalidDestination, "%s %q: %v", from, printable(raw), err)
		}
		var why string
		if final, why = t.Expand(p.in.Source, p.in.Headers); why != "" {
			return rejectf(CodeInvalidDestination, "%s %q: %s", from, printable(raw), why)
		}
		templated = !t.Literal()
	}
	msg.Destination = final
	if msg.Sink == "" {
		return rejectf(CodeInvalidRoute, "no sink: the route has none and no %s was given", HeaderSink)
	}
	syntax, ok := r.syntax(msg.Sink)
	if !ok {
		return rejectf(CodeInvalidRoute, "sink %q names no configured sink", printable(msg.Sink))
	}
	if !hasDest && !templated && strings.TrimSpace(final) == "" {
		return rejectf(CodeInvalidRoute, "no destination: the route has none and no %s was given", HeaderDestination)
	}
	if err := syntax.Check(final, r.AllowedDestinations, hasDest || templated); err != nil {
		switch {
		case errors.Is(err, destination.ErrNotAllowed):
			return rejectf(CodeInvalidRoute, "%s %q matches no pattern of route.allowed_destinations", from, printable(final))
		case errors.Is(err, destination.ErrReserved):
			return rejectf(CodeDestinationReserved, "%v", err)
		case templated:
			return rejectf(CodeInvalidDestination, "%s %q expands to an invalid destination: %v", from, printable(raw), err)
		case hasDest:
			return rejectf(CodeInvalidRoute, "%v", err)
		}
		return rejectf(CodeInvalidDestination, "%v", err)
	}
	return nil
}

// syntax is the destination syntax of the sink name; false when no sink of
// that name is configured. A route without Sinks knows every name, as
// destination.Generic.
func (r *Route) syntax(name string) (destination.Syntax, bool) {
	if r.Sinks == nil {
		return destination.Generic(), true
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
