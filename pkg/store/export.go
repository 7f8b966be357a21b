package store

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// The export format (delaybridge export | import) is JSON Lines: one Record
// per line, each a JSON object, in no particular order. It carries every
// field of a parked message and what Redis records about it, so that a
// message exported from one layout (shard count, key prefix, single Redis or
// Cluster) and imported into another is the same message:
//
//	{"v":1,"id":"order-42","state":"scheduled","due_at":"2026-05-01T10:00:00.000Z",
//	 "sink":"kafka-out","destination":"orders.due","ingest":"in",
//	 "ingested_at":"2026-04-30T10:00:00.000Z","priority":3,"group":"cart-7",
//	 "attempts":1,"last_error":"broker unavailable",
//	 "key_base64":"b3JkZXItNDI=","headers":[{"key":"trace","value":"abc"},
//	 {"key":"bin","value":{"base64":"AP8="}}],"body_base64":"aGVsbG8="}
//
// Rules of the format (version 1):
//   - "v" is 1. A reader refuses another version and a field it does not
//     know (written by a newer delaybridge?) instead of dropping it.
//   - Times are RFC 3339 in UTC with milliseconds (envelope.FormatTime);
//     stored times are whole milliseconds.
//   - Text fields (Text: the ID, names, header keys and values, errors) are
//     JSON strings when their bytes are valid UTF-8, else an object
//     {"base64": "..."} holding the exact bytes. Byte fields (key, body,
//     native header values) are base64 (standard, padded) in fields named
//     *_base64.
//   - "key_base64" is absent when the message has no key (nil) and "" when
//     it has an empty one.
//   - "headers" and "properties" keep broker order and duplicates.
//   - "state" is "scheduled" or "dead". A message in flight when exported is
//     written as scheduled at its due time, its attempt under way counted in
//     "attempts" (as a claim that finds an expired lease counts it). A
//     message held because its sink is down or paused is written as
//     scheduled: the sinks of the layout it is imported into decide.
//   - "next_at" is the time of the next attempt when it is not due_at (a
//     retry after a failed publish); the message is due then.
//   - "last_error" is the error of the last failed attempt of a scheduled
//     message; "reason" and "dead_at" say why and when a dead one died.
//   - "replacement" is a message with the same ID parked with
//     x-delay-replace while this one was in flight: it takes this one's
//     place once this one is published, retried or dead. It has no id,
//     state or attempts of its own. Imported, it waits beside the message
//     scheduled again, as after a crash of the message's claimer.

// ExportVersion is the "v" of every Record written.
const ExportVersion = 1

// Record is one line of the export format.
type Record struct {
	V           int               `json:"v,omitempty"`
	ID          Text              `json:"id,omitempty"`
	State       string            `json:"state,omitempty"` // StateScheduled or StateDead
	DueAt       string            `json:"due_at"`
	NextAt      string            `json:"next_at,omitempty"`
	Sink        Text              `json:"sink"`
	Destination Text              `json:"destination"`
	Ingest      Text              `json:"ingest,omitempty"`
	Source      Text              `json:"source,omitempty"` // of a message rejected at ingest
	IngestedAt  string            `json:"ingested_at,omitempty"`
	PublishedAt string            `json:"published_at,omitempty"` // to the nanosecond
	Origin      *RecordOrigin     `json:"origin,omitempty"`
	Priority    int               `json:"priority,omitempty"`
	Group       Text              `json:"group,omitempty"`
	Recurrence  *RecordRecurrence `json:"recurrence,omitempty"`
	Attempts    int               `json:"attempts,omitempty"`
	LastError   Text              `json:"last_error,omitempty"`
	DeadAt      string            `json:"dead_at,omitempty"`
	Reason      Text              `json:"reason,omitempty"`
	KeyBase64   *string           `json:"key_base64,omitempty"`
	Headers     []RecordHeader    `json:"headers,omitempty"`
	Properties  []RecordHeader    `json:"properties,omitempty"`
	BodyBase64  string            `json:"body_base64"`
	BodyNull    bool              `json:"body_null,omitempty"` // a Kafka null value, not an empty one
	Replacement *Record           `json:"replacement,omitempty"`
	// Follows, on a replacement, says it is not one: it is a new message of
	// the ID that came while the version in flight was, parked once that
	// one is delivered (Keys.Next).
	Follows bool `json:"follows,omitempty"`
}

// followsMark starts a follower's value in Keys.Next (FOLLOWS of the
// scripts).
const followsMark = "F"

// endsMark is the value in Keys.Next of a recurring message cancelled
// while an occurrence was in flight (ENDS of the scripts): the series ends
// with that occurrence, which no blob or follower value can be taken for.
const endsMark = "E"

// RecordHeader is a header or a property of a Record.
type RecordHeader struct {
	Key          Text   `json:"key"`
	Value        Text   `json:"value"`
	NativeBase64 string `json:"native_base64,omitempty"` // envelope.Header.Native, when set
	Null         bool   `json:"null,omitempty"`          // a Kafka null header value, not ""
}

// RecordOrigin is where a Record's message was read (envelope.Origin).
type RecordOrigin struct {
	Log   Text   `json:"log,omitempty"`
	Pos   uint64 `json:"pos,omitempty"`
	Print string `json:"print,omitempty"` // hexadecimal
}

// RecordRecurrence is a Record's recurring schedule (envelope.Recurrence).
type RecordRecurrence struct {
	Every    string `json:"every,omitempty"` // a Go duration, e.g. "1m30s"; or Cron
	Cron     Text   `json:"cron,omitempty"`
	TimeZone Text   `json:"timezone,omitempty"`
	Anchor   string `json:"anchor"`
	Until    string `json:"until,omitempty"`
	Count    int    `json:"count,omitempty"`
	N        int    `json:"n"`
	Missed   string `json:"missed"` // once, all or skip
	// MissedMax is the route.missed_max kept with the series when it was
	// parked, written under missed all, which it bounds; absent (another
	// policy, an export of an earlier release): the importing route's.
	MissedMax int `json:"missed_max,omitempty"`
}

// Text is a string of the export format that may hold any bytes: a JSON
// string when it is valid UTF-8, else {"base64": "..."}.
type Text string

// MarshalJSON implements json.Marshaler.
func (t Text) MarshalJSON() ([]byte, error) {
	if utf8.ValidString(string(t)) {
		return appendJSONString(nil, string(t)), nil
	}
	return []byte(`{"base64":"` + base64.StdEncoding.EncodeToString([]byte(t)) + `"}`), nil
}

// UnmarshalJSON implements json.Unmarshaler.
func (t *Text) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '{' {
		var o struct {
			Base64 *string `json:"base64"`
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&o); err != nil || o.Base64 == nil {
			return errors.New(`a text is a string or {"base64": "..."}`)
		}
		v, err := base64.StdEncoding.DecodeString(*o.Base64)
		if err != nil {
			return fmt.Errorf("base64: %v", err)
		}
		*t = Text(v)
		return nil
	}
	if n := len(b); n >= 2 && b[0] == '"' && b[n-1] == '"' && plainJSON(b[1:n-1]) {
		*t = Text(b[1 : n-1]) // no escapes: the bytes are the text
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return errors.New(`a text is a string or {"base64": "..."}`)
	}
	*t = Text(s)
	return nil
}

// plainJSON reports whether b, the inside of a JSON string, has no escape
// and no byte that JSON would change: it is then the text itself.
func plainJSON(b []byte) bool {
	for _, c := range b {
		if c < 0x20 || c == '\\' || c == '"' {
			return false
		}
	}
	return utf8.Valid(b)
}

// appendJSONString appends s, valid UTF-8, as a JSON string. Only '"', '\'
// and control characters are escaped (no HTML escaping).
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// NewRecord returns the Record of a message without its Redis state (ID,
// state, attempts, errors): the fields of the envelope.Message.
func NewRecord(m *envelope.Message) *Record {
	r := &Record{
		DueAt:       envelope.FormatTime(m.DueAt),
		Sink:        Text(m.Sink),
		Destination: Text(m.Destination),
		Ingest:      Text(m.Ingest),
		Source:      Text(m.Source),
		Priority:    int(m.Priority),
		Group:       Text(m.Group),
		Headers:     recordHeaders(m.Headers),
		Properties:  recordHeaders(m.Properties),
		BodyBase64:  base64.StdEncoding.EncodeToString(m.Body),
	}
	if !m.IngestedAt.IsZero() {
		r.IngestedAt = envelope.FormatTime(m.IngestedAt)
	}
	if !m.PublishedAt.IsZero() {
		r.PublishedAt = m.PublishedAt.UTC().Format(time.RFC3339Nano)
	}
	if o := m.Origin; o != (envelope.Origin{}) {
		r.Origin = &RecordOrigin{Log: Text(o.Log), Pos: o.Pos}
		if o.Print != 0 {
			r.Origin.Print = strconv.FormatUint(o.Print, 16)
		}
	}
	r.BodyNull = m.NullBody
	if m.Key != nil {
		k := base64.StdEncoding.EncodeToString(m.Key)
		r.KeyBase64 = &k
	}
	if c := m.Recur; c != nil {
		rr := &RecordRecurrence{Cron: Text(c.Cron), TimeZone: Text(c.TimeZone), Anchor: envelope.FormatTime(c.Anchor),
			Count: c.Count, N: c.N, Missed: c.Missed.String()}
		if c.Missed == envelope.MissedAll { // the bound of missed all alone: other lines stay the previous release's
			rr.MissedMax = c.MissedBound()
		}
		if c.Every != 0 {
			rr.Every = c.Every.String()
		}
		if !c.Until.IsZero() {
			rr.Until = envelope.FormatTime(c.Until)
		}
		r.Recurrence = rr
	}
	return r
}

func recordHeaders(hs envelope.Headers) []RecordHeader {
	if len(hs) == 0 {
		return nil
	}
	out := make([]RecordHeader, len(hs))
	for i, h := range hs {
		out[i] = RecordHeader{Key: Text(h.Key), Value: Text(h.Value), Null: h.Null}
		if h.Native != "" {
			out[i].NativeBase64 = base64.StdEncoding.EncodeToString([]byte(h.Native))
		}
	}
	return out
}

// ExportOptions configure Export.
type ExportOptions struct {
	// Dead includes dead messages (state "dead"); by default only parked
	// ones (scheduled, in flight, held) are written.
	Dead bool
	// Batch is about how many messages one script call reads per shard
	// (HSCAN COUNT); 0 means 256. Fewer are read when messages are large,
	// so that one round holds about 16 MiB at most.
	Batch int
	// Failed, when set, is called for each message that cannot be read (a
	// sealed message whose key is not configured, a corrupt one); it is
	// left out of the export.
	Failed func(id string, err error)
}

// ExportStats counts what Export did.
type ExportStats struct {
	Exported int // lines written, Dead of them dead messages
	Dead     int
	LeftOut  int // dead messages not written (no ExportOptions.Dead)
	Failed   int // could not be read: left out (ExportOptions.Failed)
	Vanished int // in the pool but in no set: being removed while read
}

// exportScript reads a batch of a shard's pool (HSCAN) with everything else
// Redis holds of each message, so that each message is read as one
// consistent view.
// (lua/export.lua has its KEYS, ARGV and reply.)
var exportScript = loadScript("export")

// exportRoundBytes bounds what one round of script calls (one per shard)
// returns, by adapting HSCAN's COUNT to the size of the messages seen.
const exportRoundBytes = 16 << 20

// Export writes every parked message (and with ExportOptions.Dead every
// dead one) to w in the export format, one line each, streaming: it scans
// all shards' pools together, one script call per shard and round in one
// pipeline, and holds at most three rounds in memory (one being read, one
// waiting, one being written).
//
// Each message is read atomically (its stored bytes, due or dead score,
// meta and replacement in one script), but the export is not a snapshot of
// the whole Redis: messages parked, fired or cancelled while it runs may or
// may not be in it. For a migration, stop the daemons (or pause the sinks
// and the ingests) first. HSCAN may return a message twice when its pool
// grows or shrinks during the export; importing it twice is harmless.
//
// Message bodies are written in clear, also when Redis holds them sealed:
// the Store needs the keys to read them, and the output needs protecting.
func (s *Store) Export(ctx context.Context, w io.Writer, o ExportOptions) (ExportStats, error) {
	var st ExportStats
	batch := o.Batch
	if batch <= 0 {
		batch = 256
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// One goroutine reads rounds while this one writes the previous round.
	rounds := make(chan exportRound, 1)
	go s.exportRounds(ctx, batch, rounds)
	defer func() {
		cancel()
		for range rounds { // let the reader end
		}
	}()
	bw := bufio.NewWriterSize(w, 1<<20)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	for r := range rounds {
		if r.err != nil {
			return st, r.err
		}
		for _, res := range r.replies {
			for j := 1; j < len(res); j += 6 {
				if err := s.exportOne(enc, &st, o, res[j:j+6]); err != nil {
					return st, err
				}
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return st, err
	}
	if err := bw.Flush(); err != nil {
		return st, fmt.Errorf("store.export: %w", err)
	}
	return st, nil
}

// exportRound is the exportScript replies of one round, one per shard
// still being scanned, or the error that ended the export.
type exportRound struct {
	replies [][]any
	err     error
}

// exportRounds scans every shard's pool, one exportScript call per shard
// and round in one pipeline, and sends each round's replies to out, which
// it closes when done, on an error (sent) or when ctx ends.
func (s *Store) exportRounds(ctx context.Context, batch int, out chan<- exportRound) {
	defer close(out)
	cursors := make([]string, s.shards)
	counts := make([]int, s.shards)
	active := make([]int, s.shards)
	for i := range cursors {
		cursors[i], counts[i], active[i] = "0", batch, i
	}
	for len(active) > 0 {
		if ctx.Err() != nil {
			return
		}
		calls := make([]shardCall, len(active))
		for i, sh := range active {
			calls[i] = shardCall{shard: sh, args: []any{cursors[sh], counts[sh]}}
		}
		var (
			r    exportRound
			next []int
		)
		for i, cmd := range s.runEach(ctx, "export", exportScript, calls) {
			sh := calls[i].shard
			res, err := cmd.Slice()
			if err == nil && (len(res) < 1 || (len(res)-1)%6 != 0) {
				err = fmt.Errorf("unexpected reply of %d items", len(res))
			}
			if err != nil {
				r.err = fmt.Errorf("store.export shard %d: %w", sh, err)
				break
			}
			r.replies = append(r.replies, res)
			size := 0
			for j := 1; j < len(res); j += 6 {
				blob, _ := toString(res[j+1])
				size += len(blob)
			}
			if n := (len(res) - 1) / 6; n > 0 {
				perShard := exportRoundBytes / len(active)
				counts[sh] = max(1, min(batch, perShard/max(1, size/n)))
			}
			cursors[sh], _ = toString(res[0])
			if cursors[sh] != "0" {
				next = append(next, sh)
			}
		}
		select {
		case out <- r:
		case <-ctx.Done():
			return
		}
		if r.err != nil {
			return
		}
		active = next
	}
}

// exportOne writes the record of one message of exportScript's reply (id,
// message, due score, dead score, meta, replacement), or counts why not.
func (s *Store) exportOne(enc *json.Encoder, st *ExportStats, o ExportOptions, v []any) error {
	id, _ := toString(v[0])
	blob, _ := toString(v[1])
	dueScore, inDue := toString(v[2])
	deadScore, inDead := toString(v[3])
	metaV, _ := toString(v[4])
	switch {
	case inDead && !o.Dead:
		st.LeftOut++
		return nil
	case !inDead && !inDue:
		st.Vanished++
		return nil
	}
	fail := func(err error) {
		st.Failed++
		if o.Failed != nil {
			o.Failed(id, err)
		}
	}
	m, err := s.decode(id, blob)
	if err != nil {
		fail(err)
		return nil
	}
	rec := NewRecord(m)
	rec.V, rec.ID = ExportVersion, Text(id)
	attempts, _, reason := s.meta(id, metaV)
	if inDead {
		dead, _ := strconv.ParseFloat(deadScore, 64)
		rec.State, rec.DeadAt, rec.Reason = StateDead, envelope.FormatTime(time.UnixMilli(int64(dead))), Text(reason)
	} else {
		rec.State, rec.LastError = StateScheduled, Text(reason)
		score, _ := strconv.ParseFloat(dueScore, 64)
		next := int64(math.Floor(score)) // a publish slot (.25) is the source's rate clock: dropped
		if held, due := Held(score); held {
			next = due.UnixMilli()
		} else if leased(score) {
			// In flight: due at its due time, the attempt under way counted.
			next = m.DueAt.UnixMilli()
			attempts++
		} else if claimedAhead(score) {
			next = m.DueAt.UnixMilli() // claimed ahead: not published yet
		}
		if next != m.DueAt.UnixMilli() {
			rec.NextAt = envelope.FormatTime(time.UnixMilli(next))
		}
	}
	rec.Attempts = attempts
	nb, waits := toString(v[5])
	if ends := strings.HasPrefix(nb, endsMark); waits && ends {
		// Its series was cancelled while this occurrence was in flight: it
		// is exported as the last occurrence, and what came after follows.
		rec.Recurrence = nil
		nb, waits = strings.CutPrefix(nb, endsMark)
		waits = waits && nb != ""
	}
	if waits {
		nb, follows := strings.CutPrefix(nb, followsMark)
		nm, err := s.decode(id, nb)
		if err != nil {
			fail(fmt.Errorf("its replacement waiting for the version in flight: %w", err))
			return nil
		}
		rec.Replacement = NewRecord(nm)
		rec.Replacement.Follows = follows
	}
	if err := enc.Encode(rec); err != nil {
		return fmt.Errorf("store.export: %w", err)
	}
	st.Exported++
	if inDead {
		st.Dead++
	}
	return nil
}
