package envelope

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Dialect is a set of header names an ingest understands (config
// ingest[].dialects). The default is DialectDelaybridge alone.
type Dialect string

const (
	// DialectDelaybridge is the contract's own headers (x-delay,
	// x-deliver-at, ...). RabbitMQ delayed-exchange publishers already speak
	// it: x-delay as an AMQP integer is read as milliseconds.
	DialectDelaybridge Dialect = "delaybridge"
	// DialectKafkaScheduler is the headers of etf1's kafka-message-scheduler
	// (Kafka ingests only): scheduler-epoch (Unix seconds) is the due time,
	// scheduler-target-topic the destination, scheduler-target-key the key
	// to publish with; the record key is the ID, a newer record with that
	// key replaces the parked one, and a tombstone (a record without a
	// value) with that key cancels it.
	DialectKafkaScheduler Dialect = "kafka-scheduler"
)

// Dialects lists every dialect, for validation.
var Dialects = []Dialect{DialectDelaybridge, DialectKafkaScheduler}

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

// delaybridgeSignals are the headers that make a message a delaybridge one
// on an ingest that reads both dialects: those that say when it is due, or
// that it is a control message.
var delaybridgeSignals = []string{HeaderDelay, HeaderDeliverAt, HeaderEvery, HeaderCron, HeaderCancel, HeaderCancelGroup}

// maxEpochSeconds is 9999-12-31T23:59:59Z: a due time beyond it is out of
// range whatever limits.max_delay says.
const maxEpochSeconds = 253402300799

// millisecondsEpoch is where a scheduler-epoch stops looking like seconds:
// 1e11 seconds is the year 5138, 1e11 milliseconds is 1973.
const millisecondsEpoch = 100_000_000_000

func (r *Route) reads(d Dialect) bool {
	if len(r.Dialects) == 0 {
		return d == DialectDelaybridge
	}
	for _, x := range r.Dialects {
		if x == d {
			return true
		}
	}
	return false
}

// dialect says which dialect a message is written in, or why it is
// rejected. On an ingest that reads both, x-delay, x-deliver-at or
// x-delay-cancel make it a delaybridge message, scheduler-* headers or a
// keyed tombstone a kafka-scheduler one, and both together are refused.
func (p *parser) dialect() (Dialect, string) {
	if !p.r.reads(DialectKafkaScheduler) {
		return DialectDelaybridge, ""
	}
	db := firstPresent(p.in.Headers, delaybridgeSignals)
	sched := firstPresent(p.in.Headers, schedulerControl)
	tomb := p.in.Tombstone && len(p.in.Key) > 0
	switch {
	case db != "" && sched != "":
		return "", fmt.Sprintf("both %s (kafka-scheduler) and %s (delaybridge) given; write a record in one dialect", sched, db)
	case db != "" && !p.r.reads(DialectDelaybridge):
		return "", fmt.Sprintf("%s given, but ingest %q reads only the kafka-scheduler dialect (dialects: [kafka-scheduler]); give %s in Unix seconds", db, p.r.Ingest, HeaderSchedulerEpoch)
	case db != "":
		return DialectDelaybridge, ""
	case sched != "" || tomb || !p.r.reads(DialectDelaybridge):
		return DialectKafkaScheduler, ""
	}
	return DialectDelaybridge, ""
}

func firstPresent(h Headers, names []string) string {
	for _, n := range names {
		if _, ok := h.Get(n); ok {
			return n
		}
	}
	return ""
}

// schedulerID returns a kafka-scheduler record's ID, its key, or the reason
// it has none.
func (p *parser) schedulerID() (string, string) {
	if len(p.in.Key) == 0 {
		return "", "a kafka-scheduler record needs a key: the key is the schedule's ID"
	}
	return string(p.in.Key), checkID("record key (the schedule ID)", string(p.in.Key), p.lim.MaxIDBytes)
}

// schedulerDue reads scheduler-epoch: Unix seconds as a decimal integer,
// what etf1's clientlib writes (strconv.FormatInt(t.Unix(), 10)).
func (p *parser) schedulerDue() (due time.Time, code, reason string) {
	v, ok := p.in.Headers.Get(HeaderSchedulerEpoch)
	if !ok {
		return due, CodeInvalidEpoch, fmt.Sprintf("no %s header: a kafka-scheduler record gives its due time in Unix seconds", HeaderSchedulerEpoch)
	}
	sec, err := strconv.ParseInt(v, 10, 64)
	switch {
	case err != nil && v != "" && isInteger(v):
		return due, CodeOverMaxDelay, fmt.Sprintf("%s %q is out of range (it should be Unix seconds)", HeaderSchedulerEpoch, printable(v))
	case err != nil:
		return due, CodeInvalidEpoch, fmt.Sprintf("%s %q is not Unix seconds as a decimal integer (1893456000)", HeaderSchedulerEpoch, printable(v))
	case sec < 0:
		return due, CodeInvalidEpoch, fmt.Sprintf("%s %q is before 1970", HeaderSchedulerEpoch, printable(v))
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
		return due, CodeOverMaxDelay, fmt.Sprintf("%s %q is%s after the year 9999%s", HeaderSchedulerEpoch, printable(v), limit, hint)
	}
	due = time.Unix(sec, 0).UTC()
	if p.lim.MaxDelay > 0 && due.Sub(p.now) > p.lim.MaxDelay {
		return time.Time{}, CodeOverMaxDelay, fmt.Sprintf("%s %s (%s) is more than limits.max_delay %s from now%s", HeaderSchedulerEpoch, printable(v), FormatTime(due), p.lim.MaxDelay, hint)
	}
	return due, "", ""
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
