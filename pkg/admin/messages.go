package admin

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

const messagesPrefix = "/v1/messages/"

// MessageView is GET /v1/messages/{id} (and GET /v1/dead/{id}, `delaybridge inspect`).
type MessageView struct {
	ID          string `json:"id"`
	State       string `json:"state"` // scheduled, inflight, dead
	DueAt       string `json:"due_at"`
	Sink        string `json:"sink"`
	Destination string `json:"destination"`
	Attempts    int    `json:"attempts"`

	Ingest     string `json:"ingest"` // "" for messages scheduled through this API
	IngestedAt string `json:"ingested_at,omitempty"`
	Priority   uint8  `json:"priority"`
	// NextAttemptAt is set when the message will be tried at another time
	// than its due time: scheduled again after a failed attempt or a
	// retry of a dead message, or in flight (then the lease expiry, when
	// it is retried if the publish is not confirmed).
	NextAttemptAt string `json:"next_attempt_at,omitempty"`
	LastError     string `json:"last_error,omitempty"` // the error of the last failed attempt
	Reason        string `json:"reason,omitempty"`     // dead: why
	DeadAt        string `json:"dead_at,omitempty"`
	Size          int    `json:"size"`                   // encoded bytes in Redis
	DecodeError   string `json:"decode_error,omitempty"` // the stored message cannot be decoded

	// Group is the message's x-delay-group ("" for none).
	Group string `json:"group,omitempty"`
	// Held is set while a scheduled message waits for its sink, which is
	// paused or down: it fires at its due time once the sink takes
	// messages again, or at once when that time has passed.
	Held bool `json:"held,omitempty"`
	// Recurrence is the schedule of a recurring message; due_at is the
	// time of the occurrence parked now.
	Recurrence *RecurrenceView `json:"recurrence,omitempty"`

	// The content: only when asked for (?body=true, inspect --body) and,
	// through the API, only when a token is configured. Headers may carry
	// credentials meant for the consumer, so they are treated like the body.
	Key        *string           `json:"key,omitempty"`
	KeyBase64  *string           `json:"key_base64,omitempty"`
	Headers    map[string]string `json:"headers,omitempty"` // forwarded headers; the first value of a repeated header
	Body       *string           `json:"body,omitempty"`
	BodyBase64 *string           `json:"body_base64,omitempty"`
}

// NewMessageView converts what the store knows of a message; its content
// (key, headers and body) only when withContent.
func NewMessageView(info *store.Info, withContent bool) MessageView {
	v := MessageView{ID: info.ID, State: info.State, Attempts: info.Attempts, Size: info.EncodedSize}
	switch info.State {
	case store.StateDead:
		v.Reason = info.Reason
		v.DeadAt = formatTime(info.DeadAt)
	default:
		v.LastError = info.Reason
	}
	m := info.Message
	if m == nil {
		if info.Err != nil {
			v.DecodeError = info.Err.Error()
		}
		if info.State != store.StateDead {
			v.NextAttemptAt = formatTime(info.NextAt)
		}
		return v
	}
	v.DueAt = envelope.FormatTime(m.DueAt)
	v.Sink, v.Destination = m.Sink, m.Destination
	v.Ingest, v.IngestedAt, v.Priority = m.Ingest, formatTime(m.IngestedAt), m.Priority
	v.Group, v.Held = m.Group, info.Held
	if m.Recur != nil {
		v.Recurrence = NewRecurrenceView(m.Recur, m.DueAt)
	}
	if info.State == store.StateInflight || (info.State == store.StateScheduled && !info.NextAt.Equal(m.DueAt)) {
		v.NextAttemptAt = formatTime(info.NextAt)
	}
	if !withContent {
		return v
	}
	if m.Key != nil {
		v.Key, v.KeyBase64 = textOrBase64(m.Key)
	}
	v.Headers = map[string]string{}
	for _, h := range m.Headers {
		if _, seen := v.Headers[h.Key]; !seen && !envelope.IsControlHeader(h.Key) {
			v.Headers[h.Key] = h.Value
		}
	}
	v.Body, v.BodyBase64 = textOrBase64(m.Body)
	return v
}

// RecurrenceView is the schedule of a recurring message, as GET
// /v1/messages/{id} and `delaybridge inspect` show it.
type RecurrenceView struct {
	// Schedule is the whole schedule in words: "every 1h0m0s",
	// "cron 0 9 * * MON in Europe/Berlin until 2026-12-31T00:00:00.000Z, 10 times".
	Schedule string `json:"schedule"`
	Every    string `json:"every,omitempty"`    // x-delay-every, a Go duration
	Cron     string `json:"cron,omitempty"`     // x-delay-cron
	TimeZone string `json:"timezone,omitempty"` // x-delay-timezone of the cron
	Until    string `json:"until,omitempty"`    // no occurrence after it
	Count    int    `json:"count,omitempty"`    // at most this many occurrences
	// Occurrence is the number of the occurrence parked now, from 1: the
	// ones before it were published (or, under route.missed, passed over).
	Occurrence int `json:"occurrence"`
	// NextAt is when the parked occurrence fires: the message's due_at.
	NextAt string `json:"next_at"`
	// FollowingAt is when the occurrence after it is due, by the schedule
	// as it stands; absent when the parked one is the last.
	FollowingAt string `json:"following_at,omitempty"`
	Missed      string `json:"missed"` // route.missed: once, all or skip
}

// NewRecurrenceView describes r, whose parked occurrence is due at due.
func NewRecurrenceView(r *envelope.Recurrence, due time.Time) *RecurrenceView {
	v := &RecurrenceView{Schedule: r.String(), Cron: r.Cron, TimeZone: r.TimeZone, Count: r.Count, Occurrence: r.N,
		NextAt: envelope.FormatTime(due), Missed: missedName(r.Missed)}
	if r.Every > 0 {
		v.Every = r.Every.String()
	}
	if !r.Until.IsZero() {
		v.Until = envelope.FormatTime(r.Until)
	}
	if next, _, ok := r.Next(due, due); ok {
		v.FollowingAt = envelope.FormatTime(next)
	}
	return v
}

func missedName(m envelope.Missed) string {
	switch m {
	case envelope.MissedAll:
		return "all"
	case envelope.MissedSkip:
		return "skip"
	}
	return "once"
}

// textOrBase64 returns b as text when it is valid UTF-8, else base64.
func textOrBase64(b []byte) (text, b64 *string) {
	if utf8.Valid(b) {
		s := string(b)
		return &s, nil
	}
	s := base64.StdEncoding.EncodeToString(b)
	return nil, &s
}

// formatTime is envelope.FormatTime, "" for the zero time.
func formatTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return envelope.FormatTime(t)
}

// pathID unescapes the ID part of a path and answers 400 or 404 when there
// is no usable ID: one that envelope.CheckID refuses is never parked, and
// is refused here as everywhere else.
func pathID(w http.ResponseWriter, escaped, usage string) (string, bool) {
	id, err := url.PathUnescape(escaped)
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("the message ID in the path is not validly URL-encoded: %v", err))
		return "", false
	}
	if id == "" {
		writeError(w, http.StatusNotFound, "no message ID in the path: use "+usage+" with the ID URL-encoded")
		return "", false
	}
	if reason := envelope.CheckID("the message ID in the path", id, 0); reason != "" {
		writeError(w, http.StatusBadRequest, reason)
		return "", false
	}
	return id, true
}

// contentParams are the query parameters of GET /v1/messages/{id} and GET
// /v1/dead/{id}.
var contentParams = []string{"body"}

// getMessage answers GET /v1/messages/{id}.
func (s *Server) getMessage(w http.ResponseWriter, r *http.Request) {
	s.inspect(w, r, r.PathValue("id"), false)
}

// inspect answers the state of a message; deadOnly answers 404 for a
// message that is not dead (GET /v1/dead/{id}). The content (key, headers,
// body) is served with ?body=true, and only when a token is configured.
func (s *Server) inspect(w http.ResponseWriter, r *http.Request, id string, deadOnly bool) {
	withContent, ok := s.wantContent(w, r)
	if !ok {
		return
	}
	info, err := s.p.Store.Inspect(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && deadOnly && info.State != store.StateDead) {
		writeError(w, http.StatusNotFound, notFound(id, deadOnly))
		return
	}
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, NewMessageView(info, withContent))
}

// wantContent reads ?body=: whether the answer is to carry the messages'
// key, headers and body. It answers 400 for a value that is not a boolean
// and 403 when no token is configured, and then returns ok false.
func (s *Server) wantContent(w http.ResponseWriter, r *http.Request) (withContent, ok bool) {
	if v := r.URL.Query().Get("body"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("query parameter body=%q is not a boolean; use body=true", v))
			return false, false
		}
		withContent = b
	}
	if withContent && s.p.Token == "" {
		writeError(w, http.StatusForbidden, "a message's key, headers and body are only served when admin.token is set; set it and send \"Authorization: Bearer <admin.token>\"")
		return false, false
	}
	return withContent, true
}

func notFound(id string, dead bool) string {
	if dead {
		return fmt.Sprintf("no dead message with ID %q", id)
	}
	return fmt.Sprintf("no message with ID %q (never parked, already delivered, or cancelled)", id)
}

func (s *Server) deleteMessage(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	answerAction(w, s.p.Store.Cancel(r.Context(), id), notFound(id, false))
}

// answerAction answers an action on one message: 204 when done, 404 with
// missing for store.ErrNotFound, 500 otherwise.
func answerAction(w http.ResponseWriter, err error, missing string) {
	switch {
	case errors.Is(err, store.ErrNotFound):
		writeError(w, http.StatusNotFound, missing)
	case err != nil:
		writeError(w, http.StatusInternalServerError, err.Error())
	default:
		noContent(w)
	}
}

// postRequest is POST /v1/messages.
type postRequest struct {
	Delay       json.RawMessage   `json:"delay"`      // integer ms or a Go duration string
	DeliverAt   json.RawMessage   `json:"deliver_at"` // RFC 3339 string or integer epoch ms
	Sink        string            `json:"sink"`
	Destination string            `json:"destination"`
	ID          *string           `json:"id"`
	Key         *string           `json:"key"`
	Headers     map[string]string `json:"headers"`
	Body        *string           `json:"body"`
	BodyBase64  *string           `json:"body_base64"`
	Priority    *int              `json:"priority"` // 0..9, like x-delay-priority
}

// postResponse is the answer to POST /v1/messages.
type postResponse struct {
	ID        string `json:"id"`
	DueAt     string `json:"due_at"`
	Duplicate bool   `json:"duplicate,omitempty"`
}

// maxRequestBytes caps a POST body: the body may come base64-encoded or
// JSON-escaped, and so may the headers. Without limits it is 64 MiB.
func (s *Server) maxRequestBytes() int64 {
	lim := s.p.Limits
	if lim.MaxPayloadBytes <= 0 || lim.MaxHeaderBytes <= 0 {
		return 64 << 20
	}
	return 2*int64(lim.MaxPayloadBytes) + 2*int64(lim.MaxHeaderBytes) + 64<<10
}

func (s *Server) postMessage(w http.ResponseWriter, r *http.Request) {
	var req postRequest
	if status, reason := readJSON(w, r, s.maxRequestBytes(), &req); reason != "" {
		writeError(w, status, reason)
		return
	}
	now := s.p.Now().Truncate(time.Millisecond)
	m, reason := s.buildMessage(&req, now)
	if reason != "" {
		writeError(w, http.StatusBadRequest, reason)
		return
	}
	parked, err := s.park(r.Context(), m)
	if err != nil {
		writeError(w, http.StatusInternalServerError, fmt.Sprintf("park %q: %v", m.ID, err))
		return
	}
	w.Header().Set("Location", messagesPrefix+url.PathEscape(m.ID))
	if !parked {
		// Parking is idempotent (the contract): the same 201, flagged, with
		// the due time of the message already known under this ID, not the
		// one of the request, which was not applied.
		due := m.DueAt
		if info, err := s.p.Store.Inspect(r.Context(), m.ID); err == nil && info.Message != nil {
			due = info.Message.DueAt
		}
		writeJSON(w, http.StatusCreated, postResponse{ID: m.ID, DueAt: envelope.FormatTime(due), Duplicate: true})
		return
	}
	writeJSON(w, http.StatusCreated, postResponse{ID: m.ID, DueAt: envelope.FormatTime(m.DueAt)})
}

func (s *Server) park(ctx context.Context, m *envelope.Message) (bool, error) {
	if s.p.Park != nil {
		return s.p.Park(ctx, m)
	}
	res, err := s.p.Store.Park(ctx, []*envelope.Message{m})
	if err != nil {
		return false, err
	}
	return res[0].Accepted(), nil
}

// decodeError turns a JSON decoding error into a status and a reason.
func decodeError(err error) (int, string) {
	var tooLarge *http.MaxBytesError
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &tooLarge):
		return http.StatusRequestEntityTooLarge, fmt.Sprintf("request body over %d bytes; the message body may be at most limits.max_payload_bytes", tooLarge.Limit)
	case errors.Is(err, io.EOF):
		return http.StatusBadRequest, "empty request body: send a JSON object"
	case errors.As(err, &syntax), errors.Is(err, io.ErrUnexpectedEOF):
		return http.StatusBadRequest, fmt.Sprintf("the request body is not valid JSON: %v", err)
	case errors.As(err, &typ):
		if typ.Field == "" {
			return http.StatusBadRequest, "the request body must be a JSON object"
		}
		return http.StatusBadRequest, fmt.Sprintf("field %q must be %s, not %s", typ.Field, jsonKind(typ.Type.String()), typ.Value)
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return http.StatusBadRequest, fmt.Sprintf("unknown field %s; known: delay, deliver_at, sink, destination, id, key, headers, body, body_base64, priority", f)
	}
	return http.StatusBadRequest, fmt.Sprintf("the request body cannot be read: %v", err)
}

func jsonKind(goType string) string {
	switch {
	case strings.Contains(goType, "map"):
		return "an object of strings"
	case strings.Contains(goType, "int"):
		return "an integer"
	default:
		return "a string"
	}
}

// buildMessage turns a request into the message to park, or returns the
// reason it is invalid. The request becomes an incoming message, as if a
// publisher had put it on an ingest: its fields become the control headers
// (delay -> x-delay, deliver_at -> x-deliver-at, id -> x-message-id,
// priority -> x-delay-priority) and its sink and destination the route, and
// envelope.Parse applies the same rules to it as to every ingested message.
// Only what is particular to the API is checked here: the JSON shapes,
// which fields are required, and header names and values.
func (s *Server) buildMessage(req *postRequest, now time.Time) (*envelope.Message, string) {
	in, reason := req.incoming()
	if reason != "" {
		return nil, reason
	}
	route := &envelope.Route{Sink: strings.TrimSpace(req.Sink), Destination: req.Destination, Sinks: s.p.SinkDestinations}
	d := envelope.Parse(in, route, s.p.Limits, now, nil)
	if d.Action != envelope.Park {
		return nil, apiNames.Replace(d.Reason)
	}
	return d.Message, ""
}

// apiNames renames the control headers in Parse's reasons to the request
// fields they came from.
var apiNames = strings.NewReplacer(
	envelope.HeaderDeliverAt, "deliver_at",
	envelope.HeaderPriority, "priority",
	envelope.HeaderMessageID, "id",
	envelope.HeaderDelay, "delay",
)

// incoming is the request as an ingested message.
func (req *postRequest) incoming() (*envelope.Incoming, string) {
	in := &envelope.Incoming{}
	delay, hasDelay, reason := scalar("delay", req.Delay)
	if reason != "" {
		return nil, reason
	}
	at, hasAt, reason := scalar("deliver_at", req.DeliverAt)
	if reason != "" {
		return nil, reason
	}
	switch {
	case hasDelay && hasAt:
		return nil, "give either delay or deliver_at, not both"
	case hasDelay:
		in.Headers = append(in.Headers, envelope.Header{Key: envelope.HeaderDelay, Value: delay})
	case hasAt:
		in.Headers = append(in.Headers, envelope.Header{Key: envelope.HeaderDeliverAt, Value: at})
	default:
		return nil, `delay or deliver_at is required: "delay": 5000 (ms) or "5m", or "deliver_at": "2026-12-01T10:00:00Z" or epoch ms`
	}
	if strings.TrimSpace(req.Sink) == "" {
		return nil, "sink is required: the name of a configured sink"
	}
	if req.Destination == "" {
		return nil, "destination is required: a topic, subject or routing key of the sink"
	}
	if req.ID != nil {
		if *req.ID == "" {
			return nil, "id is empty; leave it out to get a generated ID"
		}
		in.Headers = append(in.Headers, envelope.Header{Key: envelope.HeaderMessageID, Value: *req.ID})
	}
	if req.Priority != nil {
		in.Headers = append(in.Headers, envelope.Header{Key: envelope.HeaderPriority, Value: strconv.Itoa(*req.Priority)})
	}
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
		if reason := checkHeader(k, v); reason != "" {
			return nil, reason
		}
		// Header lookups are case-insensitive: two spellings of one name
		// would let a filter read one and a consumer the other.
		if prev, ok := spelled[strings.ToLower(k)]; ok {
			return nil, fmt.Sprintf("headers: %q and %q name the same header (names are case-insensitive); give it once", prev, k)
		}
		spelled[strings.ToLower(k)] = k
		in.Headers = append(in.Headers, envelope.Header{Key: k, Value: v})
	}
	switch {
	case req.Body != nil && req.BodyBase64 != nil:
		return nil, "give either body or body_base64, not both"
	case req.Body != nil:
		in.Body = []byte(*req.Body)
	case req.BodyBase64 != nil:
		b, err := base64.StdEncoding.DecodeString(*req.BodyBase64)
		if err != nil {
			return nil, fmt.Sprintf("body_base64 is not standard base64: %v", err)
		}
		in.Body = b
	default:
		return nil, `body is required: give "body" (text) or "body_base64" (binary); "" for an empty body`
	}
	return in, ""
}

// scalar reads a JSON string or number as text; null and absent are
// "not given".
func scalar(field string, raw json.RawMessage) (text string, given bool, reason string) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", false, ""
	}
	switch c := raw[0]; {
	case c == '"':
		if err := json.Unmarshal(raw, &text); err != nil {
			return "", false, fmt.Sprintf("%s is not a valid JSON string", field)
		}
		return text, true, ""
	case c == '-' || (c >= '0' && c <= '9'):
		return string(raw), true, ""
	}
	return "", false, fmt.Sprintf("%s must be an integer or a string, not %s", field, raw)
}

// checkHeader validates one header of a request.
func checkHeader(k, v string) string {
	switch {
	case k == "":
		return "headers: a header name is empty"
	case envelope.IsControlHeader(k):
		return fmt.Sprintf("headers: %q is a control header and cannot be forwarded; use the request's fields (delay, deliver_at, sink, destination, id, priority)", k)
	case strings.ContainsFunc(k, func(c rune) bool { return c <= ' ' || c == ':' || c == 0x7f }):
		return fmt.Sprintf("headers: name %q contains a space, colon or control character", k)
	case strings.ContainsAny(v, "\x00\r\n"):
		return fmt.Sprintf("headers: the value of %q contains a NUL, CR or LF character", k)
	}
	return ""
}
