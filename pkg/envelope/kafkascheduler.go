package envelope

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Headers of the kafka-scheduler dialect, as etf1's scheduler writes them.
// The first three are read and not forwarded; the last three are added to
// what is published, as etf1's scheduler adds them to the records it
// triggers.
const (
	HeaderSchedulerEpoch       = "scheduler-epoch"
	HeaderSchedulerTargetTopic = "scheduler-target-topic"
	HeaderSchedulerTargetKey   = "scheduler-target-key"

	HeaderSchedulerTimestamp = "scheduler-timestamp" // the record's timestamp, Unix seconds
	HeaderSchedulerKey       = "scheduler-key"       // the record's key: the ID
	HeaderSchedulerTopic     = "scheduler-topic"     // the topic the record came from
)

var schedulerControl = []string{HeaderSchedulerEpoch, HeaderSchedulerTargetTopic, HeaderSchedulerTargetKey}
var schedulerAdded = []string{HeaderSchedulerTimestamp, HeaderSchedulerKey, HeaderSchedulerTopic}

// schedulerUnique are the headers a kafka-scheduler record gives at most
// once: the control headers of both dialects.
var schedulerUnique = append(slices.Clip(controlHeaders), schedulerControl...)

// schedulerForeign are the delaybridge headers a kafka-scheduler record
// says otherwise: its ID is the record key, its destination
// scheduler-target-topic, and it always replaces.
var schedulerForeign = []string{HeaderMessageID, HeaderDestination, HeaderReplace}

// maxEpochSeconds is 9999-12-31T23:59:59Z: a due time beyond it is out of
// range whatever limits.max_delay says.
const maxEpochSeconds = 253402300799

// millisecondsEpoch is where a scheduler-epoch stops looking like seconds:
// 1e11 seconds is the year 5138, 1e11 milliseconds is 1973.
const millisecondsEpoch = 100_000_000_000

// schedulerReader reads etf1's kafka-message-scheduler records
// (DialectKafkaScheduler): the record key is the ID, scheduler-epoch the
// due time, scheduler-target-topic the destination and
// scheduler-target-key the key to publish with; a newer record replaces, a
// tombstone cancels.
type schedulerReader struct{}

// id is the record key. The usual sources (delaybridgeReader.id) only name
// a dead record that has no usable key.
func (schedulerReader) id(p *parser, newID func() string) (string, error) {
	key := string(p.in.Key)
	reason := "a kafka-scheduler record needs a key: the key is the schedule's ID"
	if key != "" {
		reason = checkID("record key (the schedule ID)", key, p.lim.MaxIDBytes)
	}
	if reason == "" {
		return key, nil
	}
	id, _ := delaybridgeReader{}.id(p, newID)
	return id, rejectf(CodeInvalidScheduler, "%s", reason)
}

func (schedulerReader) unique() []string { return schedulerUnique }

// control reads a tombstone (a record with a null value) as a cancel of
// its key.
func (schedulerReader) control(p *parser) (control, error) {
	if p.in.Tombstone {
		return control{action: Cancel, target: string(p.in.Key), tombstone: true}, nil
	}
	return control{}, nil
}

func (schedulerReader) foreign(p *parser) error {
	for _, h := range schedulerForeign {
		if _, ok := p.in.Headers.Get(h); ok {
			return rejectf(CodeInvalidScheduler, "%s given on a kafka-scheduler record: its ID is the record key, its destination %s, and a newer record always replaces", h, HeaderSchedulerTargetTopic)
		}
	}
	return nil
}

// due reads scheduler-epoch: Unix seconds as a decimal integer, what
// etf1's clientlib writes (strconv.FormatInt(t.Unix(), 10)).
func (schedulerReader) due(p *parser) (time.Time, error) {
	v, ok := p.in.Headers.Get(HeaderSchedulerEpoch)
	if !ok {
		return time.Time{}, rejectf(CodeInvalidEpoch, "no %s header: a kafka-scheduler record gives its due time in Unix seconds", HeaderSchedulerEpoch)
	}
	sec, err := strconv.ParseInt(v, 10, 64)
	switch {
	case err != nil && v != "" && isInteger(v):
		return time.Time{}, rejectf(CodeOverMaxDelay, "%s %q is out of range (it should be Unix seconds)", HeaderSchedulerEpoch, printable(v))
	case err != nil:
		return time.Time{}, rejectf(CodeInvalidEpoch, "%s %q is not Unix seconds as a decimal integer (1893456000)", HeaderSchedulerEpoch, printable(v))
	case sec < 0:
		return time.Time{}, rejectf(CodeInvalidEpoch, "%s %q is before 1970", HeaderSchedulerEpoch, printable(v))
	}
	hint := ""
	if sec >= millisecondsEpoch {
		hint = fmt.Sprintf("; it looks like Unix milliseconds (%s), but %s is in seconds", FormatTime(time.UnixMilli(min(sec, maxEpochSeconds*1000))), HeaderSchedulerEpoch)
	}
	if sec > maxEpochSeconds {
		limit := ""
		if p.lim.MaxDelay > 0 {
			limit = fmt.Sprintf(" more than limits.max_delay %s from now:", p.lim.MaxDelay)
		}
		return time.Time{}, rejectf(CodeOverMaxDelay, "%s %q is%s after the year 9999%s", HeaderSchedulerEpoch, printable(v), limit, hint)
	}
	due := time.Unix(sec, 0).UTC()
	if p.lim.MaxDelay > 0 && due.Sub(p.now) > p.lim.MaxDelay {
		return time.Time{}, rejectf(CodeOverMaxDelay, "%s %s (%s) is more than limits.max_delay %s from now%s", HeaderSchedulerEpoch, printable(v), FormatTime(due), p.lim.MaxDelay, hint)
	}
	return due, nil
}

// destination is scheduler-target-topic, a topic name as etf1 reads it
// (no template).
func (schedulerReader) destination() (string, bool) { return HeaderSchedulerTargetTopic, true }

// finish makes the record replace, publish with scheduler-target-key, and
// forward schedulerHeaders.
func (schedulerReader) finish(p *parser, m *Message) {
	m.Replace = true
	m.Key = nil
	for _, h := range p.in.Headers {
		if strings.EqualFold(h.Key, HeaderSchedulerTargetKey) {
			if !h.Null { // a null value: a null key, as no header
				m.Key = append([]byte{}, h.Value...) // an empty value: an empty key, not a null one
			}
			break
		}
	}
	at := p.published
	if at.IsZero() {
		at = p.now
	}
	m.Headers = schedulerHeaders(p.in.Headers, m.ID, p.in.Source, at)
}

// schedulerHeaders returns what a kafka-scheduler record forwards: its
// headers without the dialect's three control headers (read, and dropped
// so that a target topic that is itself a kafka-scheduler ingest does not
// loop), then scheduler-timestamp, scheduler-key and scheduler-topic as
// etf1's scheduler adds them to the records it triggers (any already there
// are replaced, so there is one of each).
func schedulerHeaders(h Headers, id, topic string, published time.Time) Headers {
	out := make(Headers, 0, len(h)+len(schedulerAdded))
	for _, kv := range forwarded(h) {
		if !equalFoldAny(kv.Key, schedulerControl) && !equalFoldAny(kv.Key, schedulerAdded) {
			out = append(out, kv)
		}
	}
	return append(out,
		Header{Key: HeaderSchedulerTimestamp, Value: strconv.FormatInt(published.Unix(), 10)},
		Header{Key: HeaderSchedulerKey, Value: id},
		Header{Key: HeaderSchedulerTopic, Value: topic},
	)
}

func equalFoldAny(k string, names []string) bool {
	for _, n := range names {
		if strings.EqualFold(k, n) {
			return true
		}
	}
	return false
}
