package envelope

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// delaybridgeReader reads the contract's own headers (DialectDelaybridge):
// x-message-id, x-delay or x-deliver-at, x-delay-every or x-delay-cron,
// x-delay-destination, and the control headers x-delay-cancel and
// x-delay-cancel-group.
type delaybridgeReader struct{}

// controls are the control headers of the delaybridge dialect: each names
// the target of its Action, and is refused with its Code when that is not a
// valid ID. The first one given wins.
var controls = []struct {
	header string
	action Action
	code   Code
}{
	{HeaderCancel, Cancel, CodeInvalidCancel},
	{HeaderCancelGroup, CancelGroup, CodeInvalidGroup},
}

// id resolves the message ID in the contract's order: x-message-id, the
// broker's message ID property, Nats-Msg-Id, the broker position, a new ID.
// When the chosen ID is invalid it returns a usable fallback ID (the next
// source) together with the rejection.
func (delaybridgeReader) id(p *parser, newID func() string) (string, error) {
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
	var err error
	for i, c := range candidates {
		r := checkID(c.name, c.value, p.lim.MaxIDBytes)
		if r == "" {
			return c.value, err
		}
		if i == 0 {
			err = rejectf(CodeInvalidID, "%s", r) // the chosen ID is invalid: reject, under the next usable one
		}
	}
	// The broker position is ours, bounded by the broker's own limits (a
	// Kafka topic name has at most 249 bytes): no max_id_bytes for it, so
	// that a redelivery always maps to the same ID.
	if pos := p.in.Origin.PositionID(); pos != "" && checkID("", pos, 0) == "" {
		return pos, err
	}
	return newID(), err
}

func (delaybridgeReader) unique() []string { return controlHeaders }

func (delaybridgeReader) control(p *parser) (control, error) {
	for _, c := range controls {
		if target, ok := p.in.Headers.Get(c.header); ok {
			if reason := checkID(c.header, target, p.lim.MaxIDBytes); reason != "" {
				return control{}, rejectf(c.code, "%s", reason)
			}
			return control{action: c.action, target: target}, nil
		}
	}
	return control{}, nil
}

func (delaybridgeReader) foreign(*parser) error { return nil }

func (delaybridgeReader) destination() (string, bool) { return HeaderDestination, false }

// finish forwards every header but the control headers, and sets the
// schedule due read.
func (delaybridgeReader) finish(p *parser, m *Message) {
	m.Headers = forwarded(p.in.Headers)
	m.Recur = p.recur
}

// due computes the due time from x-delay, x-deliver-at or the route's
// default delay, and for a recurring message its schedule (p.recur), whose
// first occurrence needs no delay header. A due time is never earlier than
// the instant the headers name: sub-millisecond digits round up.
func (delaybridgeReader) due(p *parser) (due time.Time, err error) {
	delay, hasDelay := p.in.Headers.Get(HeaderDelay)
	at, hasAt := p.in.Headers.Get(HeaderDeliverAt)
	// The broker's publish time counts to the nanosecond (a JetStream time
	// has them), and so does the moment of ingest; a due time rounds up.
	base := p.instant
	if !p.published.IsZero() {
		base = p.published
	}
	switch {
	case hasDelay && hasAt:
		return due, rejectf(CodeBothDelays, "both x-delay and x-deliver-at given; give one")
	case hasDelay:
		d, reason := ParseDelay(delay)
		if reason != "" {
			return due, rejectf(CodeInvalidDelay, "%s", reason)
		}
		if d > p.lim.MaxDelay && p.lim.MaxDelay > 0 {
			return due, rejectf(CodeOverMaxDelay, "x-delay %s is over limits.max_delay %s", d, p.lim.MaxDelay)
		}
		due = CeilMillis(base.Add(d))
	case hasAt:
		t, reason := ParseDeliverAt(at)
		if reason != "" {
			return due, rejectf(CodeInvalidDeliverAt, "%s", reason)
		}
		due = t
	}
	r, first, reason := recurrence(p.in.Headers, base, due, hasDelay || hasAt, p.r, p.now, p.lim.MinInterval)
	switch {
	case reason != "":
		return time.Time{}, rejectf(CodeInvalidSchedule, "%s", reason)
	case r != nil:
		p.recur, due = r, first
	case hasDelay || hasAt:
	case p.r.HasDefaultDelay:
		due = CeilMillis(base.Add(p.r.DefaultDelay))
	default:
		return due, rejectf(CodeNoDelay, "no x-delay or x-deliver-at header, and the route has no default_delay")
	}
	if p.lim.MaxDelay > 0 && due.Sub(p.now) > p.lim.MaxDelay {
		return time.Time{}, rejectf(CodeOverMaxDelay, "due time %s is more than limits.max_delay %s from now", FormatTime(due), p.lim.MaxDelay)
	}
	if due.UnixMilli() >= MaxDueMs {
		return time.Time{}, rejectf(CodeOverMaxDelay, "due time %s is after %s, the latest delaybridge keeps", FormatTime(due), FormatTime(time.UnixMilli(MaxDueMs-1)))
	}
	return due, nil
}

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
	return CeilMillis(t), ""
}
