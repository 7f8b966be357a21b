// Package envelope defines the message delaybridge parks and fires, the
// headers that control it, and the compact binary encoding it is stored in.
//
// The flow of one message is:
//
//	broker message --(ingest adapter)--> Incoming
//	Incoming --(Parse with the ingest's Route and the Limits)--> Decision
//	Decision.Message --(Encode)--> Redis pool --(Decode)--> sink adapter
//
// Nothing in this package does I/O.
package envelope

import (
	"strconv"
	"strings"
	"time"
)

// Header names of the contract (docs/reference.md, "Headers"). Lookups are
// case-insensitive.
const (
	HeaderDelay       = "x-delay"
	HeaderDeliverAt   = "x-deliver-at"
	HeaderMessageID   = "x-message-id"
	HeaderSink        = "x-delay-sink"
	HeaderDestination = "x-delay-destination"
	HeaderCancel      = "x-delay-cancel"
	HeaderPriority    = "x-delay-priority"

	// Replace, groups and recurring schedules.
	HeaderReplace     = "x-delay-replace"
	HeaderGroup       = "x-delay-group"
	HeaderCancelGroup = "x-delay-cancel-group"
	HeaderEvery       = "x-delay-every"
	HeaderCron        = "x-delay-cron"
	HeaderTimeZone    = "x-delay-timezone"
	HeaderUntil       = "x-delay-until"
	HeaderCount       = "x-delay-count"

	// Added by delaybridge on every published message.
	HeaderDueAt   = "x-delaybridge-due-at"
	HeaderAttempt = "x-delaybridge-attempt"
	// Added on every occurrence of a recurring message: its number, from 1.
	HeaderOccurrence = "x-delaybridge-occurrence"

	// NATS's own de-duplication header.
	HeaderNatsMsgID = "Nats-Msg-Id"
)

// controlHeaders are consumed by delaybridge and never forwarded, so that a
// destination that is itself an ingest does not loop: the due time, the
// route, the controls and every option (Options). x-message-id and the
// x-delaybridge-* headers are rewritten on publish.
var controlHeaders = append([]string{
	HeaderDelay, HeaderDeliverAt, HeaderSink, HeaderDestination, HeaderCancel,
	HeaderCancelGroup, HeaderDueAt, HeaderAttempt, HeaderOccurrence,
}, optionHeaders()...)

// IsControlHeader reports whether the header is consumed or rewritten by
// delaybridge rather than forwarded as it came.
func IsControlHeader(key string) bool {
	for _, h := range controlHeaders {
		if strings.EqualFold(h, key) {
			return true
		}
	}
	return false
}

// Header is one message header. Values are Go strings, which may hold any
// bytes (Kafka header values are binary).
type Header struct {
	Key   string
	Value string
	// Native is the broker's own encoding of a value that has a type its
	// string form loses (an AMQP integer, boolean, table...), written and
	// read by that broker's package; "" for a plain string value. A sink of
	// the same broker kind publishes the value back with its type; other
	// sinks publish Value.
	Native string
	// Null marks a header without a value (a Kafka null header value, which
	// is not ""). Value is then "". A Kafka sink publishes it as null.
	Null bool
}

// String shows the header as key=value (key=<null> for a null value), for
// logs and test failures.
func (h Header) String() string {
	if h.Null {
		return h.Key + "=<null>"
	}
	return h.Key + "=" + h.Value
}

// Headers keeps headers in broker order, duplicates included (Kafka allows
// them). Lookups are case-insensitive.
type Headers []Header

// Get returns the first value of key, compared case-insensitively.
func (h Headers) Get(key string) (string, bool) {
	for _, kv := range h {
		if strings.EqualFold(kv.Key, key) {
			return kv.Value, true
		}
	}
	return "", false
}

// Count returns how many headers are named key (case-insensitive).
func (h Headers) Count(key string) int {
	n := 0
	for _, kv := range h {
		if strings.EqualFold(kv.Key, key) {
			n++
		}
	}
	return n
}

// Size is the number of bytes of all keys and values.
func (h Headers) Size() int {
	n := 0
	for _, kv := range h {
		n += len(kv.Key) + len(kv.Value)
	}
	return n
}

// Message is a parked message: everything needed to publish it when due.
// The ID is not part of the encoding; it is the key it is stored under.
type Message struct {
	ID          string
	DueAt       time.Time // millisecond precision
	Sink        string    // name of a configured sink
	Destination string    // topic, routing key or subject in that sink
	Key         []byte    // Kafka record key; nil when the ingest had none
	Headers     Headers   // forwarded headers: control headers already removed
	Body        []byte
	Priority    uint8     // 0 (default) .. 9; higher fires first in a backlog
	Ingest      string    // name of the ingest it came from ("" for the admin API)
	IngestedAt  time.Time // when delaybridge took it in

	// NullBody marks a Kafka null value (a tombstone), which is not an
	// empty value: Body is then empty, and a Kafka sink publishes null, so
	// that a scheduled tombstone still deletes its key in a compacted topic.
	NullBody bool

	// PublishedAt is when the broker says the message was published
	// (Incoming.PublishedAt) at the broker's full resolution, capped at the
	// moment of ingest; zero when it records no precise time. Origin and
	// PublishedAt make a message's version (see Origin).
	PublishedAt time.Time
	// Origin is where the message was read in its broker's own order.
	Origin Origin
	// Source is Incoming.Source, kept with a message rejected at ingest so
	// that a retry applies its route again (a template expands from it);
	// "" on a parked message.
	Source string
	// Group files the message under a group key (x-delay-group), so that
	// the whole group can be listed and cancelled at once.
	Group string
	// Recur makes the message recurring: firing occurrence N parks
	// occurrence N+1 at the schedule's next time, in the same step.
	Recur *Recurrence
	// Properties are the fields of the ingest broker's message that are not
	// headers (AMQP content_type, correlation_id, ...), named and encoded by
	// that broker's package, so that a sink of the same kind publishes them
	// back.
	Properties Headers

	// Replace parks the message over a parked one of the same ID when this
	// one is the newer version (x-delay-replace, the kafka-scheduler
	// dialect; see Origin). An instruction to the store, not stored.
	Replace bool
	// Redelivered is Incoming.Redelivered, for the store's re-read check
	// (see Origin). Not stored.
	Redelivered bool
}

// Origin is where a message sits in its broker's own order: what tells a
// re-read from a new message, and a newer version from an older one
// (docs/reference.md, "The guarantee"). The rules are stated once,
// in the store's park script (pkg/store, reread and newer), which every
// path that parks goes through:
//
//   - a re-read of a delivered ID is a duplicate within the dedupe window:
//     a message of the same Log at the same or an earlier Pos (Kafka and
//     JetStream read a log in order, so an earlier position was read
//     before), or, without a Log, a broker redelivery (AMQP redelivered)
//     of the same content (Print); any other message with that ID is new.
//   - of two versions of an ID, the newer is the one later in the same Log;
//     else the one with the later PublishedAt (both known, and different);
//     else the one parked later.
type Origin struct {
	// Log is the ordered log the message was read from and Pos its place
	// in it: Kafka "topic/partition" and the offset, JetStream the stream
	// and the stream sequence. "" where the broker has none (AMQP, core
	// NATS, the admin API).
	Log string
	Pos uint64
	// Print is, for a message without a Log from a broker that redelivers
	// (AMQP), a fingerprint of the delivery's content (body, headers,
	// properties, routing key): a redelivery has the same, a new publish
	// that reuses the ID almost surely another. 0 when none.
	Print uint64
}

// PositionID is the ID derived from the broker position (Log "/" Pos:
// Kafka "topic/partition/offset", JetStream "stream/sequence"), so that a
// redelivery maps to the same ID; "" without a Log.
func (o Origin) PositionID() string {
	if o.Log == "" {
		return ""
	}
	return o.Log + "/" + strconv.FormatUint(o.Pos, 10)
}

// OutHeaders returns the headers a sink publishes: the forwarded headers plus
// x-message-id, x-delaybridge-due-at and x-delaybridge-attempt (and
// x-delaybridge-occurrence for a recurring message). (A
// Nats-Msg-Id from a NATS ingest is forwarded like any ingest header; the
// NATS sink replaces it with this message's ID, since it is NATS's ID field.)
func (m *Message) OutHeaders(attempt int) Headers {
	out := make(Headers, 0, len(m.Headers)+4)
	for _, h := range m.Headers {
		if !IsControlHeader(h.Key) {
			out = append(out, h)
		}
	}
	out = append(out,
		Header{Key: HeaderMessageID, Value: m.ID},
		Header{Key: HeaderDueAt, Value: FormatTime(m.DueAt)},
		Header{Key: HeaderAttempt, Value: strconv.Itoa(attempt)},
	)
	if m.Recur != nil {
		out = append(out, Header{Key: HeaderOccurrence, Value: strconv.Itoa(m.Recur.N)})
	}
	return out
}

// FormatTime formats t as RFC 3339 in UTC with milliseconds, the form of
// x-delaybridge-due-at and of due_at in the admin API.
func FormatTime(t time.Time) string {
	return t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

// CeilMillis rounds t up to a whole millisecond, the precision of stored
// times: a due time is never earlier than the instant its headers name, nor
// a delay's end earlier than the instant it counts from plus the delay.
func CeilMillis(t time.Time) time.Time {
	if r := t.Truncate(time.Millisecond); !r.Equal(t) {
		return r.Add(time.Millisecond)
	}
	return t
}
