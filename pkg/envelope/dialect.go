package envelope

import "time"

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

// A dialectReader is the parser of one dialect (delaybridgeReader in
// delaybridge.go, schedulerReader in kafkascheduler.go): it reads what the
// dialect's headers say (the ID, a control message, the due time, the
// destination, what is published) into the Message, and Parse applies the
// rules every message meets around it. Parse calls the methods in this
// order, stopping at the first error (a *Rejection): id; the size limits;
// unique; control (the message is then not parked); foreign; due; the
// group, priority and replace headers; the route, with destination; finish.
type dialectReader interface {
	// id is the message's ID. With an error (no usable ID), it is a
	// fallback ID to keep the rejected message under.
	id(p *parser, newID func() string) (string, error)
	// unique are the headers given at most once.
	unique() []string
	// control reads a control message: the message is then not parked
	// (an Action other than Park).
	control(p *parser) (control, error)
	// foreign refuses what the dialect gives its own meaning to in another
	// dialect's headers.
	foreign(p *parser) error
	// due is the due time; a recurring message's schedule goes to p.recur.
	due(p *parser) (time.Time, error)
	// destination is the header that overrides the route's destination,
	// and whether its value is a literal name (else a template).
	destination() (header string, literal bool)
	// finish sets what a parked message publishes: its headers, key,
	// replace flag and recurrence.
	finish(p *parser, m *Message)
}

// control is what a control message asks (dialectReader.control).
type control struct {
	action    Action // Park: none (the message is not a control message)
	target    string // Cancel: the ID; CancelGroup: the group
	tombstone bool   // a kafka-scheduler tombstone (Decision.Tombstone)
}

// MayControl reports whether Parse may read in as a control message (a
// Cancel or a CancelGroup, or a rejected one) in some dialect: it has a
// control header (controls) or is a tombstone (the kafka-scheduler
// dialect's cancel). It reads no value and no route, cheap enough to order
// messages before they are parsed: a control message must see every park
// before it.
func MayControl(in *Incoming) bool {
	if in.Tombstone {
		return true
	}
	for _, c := range controls {
		if _, ok := in.Headers.Get(c.header); ok {
			return true
		}
	}
	return false
}

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

// delaybridgeSignals are the headers that make a message a delaybridge one
// on an ingest that reads both dialects: those that say when it is due, or
// that it is a control message.
var delaybridgeSignals = []string{HeaderDelay, HeaderDeliverAt, HeaderEvery, HeaderCron, HeaderCancel, HeaderCancelGroup}

// reader is the reader of the dialect a message is written in, or (with
// the delaybridge reader, which names the rejected message) why it is
// rejected. On an ingest that reads both, x-delay, x-deliver-at or
// x-delay-cancel make it a delaybridge message, scheduler-* headers or a
// keyed tombstone a kafka-scheduler one, and both together are refused.
func (p *parser) reader() (dialectReader, error) {
	if !p.r.reads(DialectKafkaScheduler) {
		return delaybridgeReader{}, nil
	}
	db := firstPresent(p.in.Headers, delaybridgeSignals)
	sched := firstPresent(p.in.Headers, schedulerControl)
	tomb := p.in.Tombstone && len(p.in.Key) > 0
	switch {
	case db != "" && sched != "":
		return delaybridgeReader{}, rejectf(CodeInvalidScheduler, "both %s (kafka-scheduler) and %s (delaybridge) given; write a record in one dialect", sched, db)
	case db != "" && !p.r.reads(DialectDelaybridge):
		return delaybridgeReader{}, rejectf(CodeInvalidScheduler, "%s given, but ingest %q reads only the kafka-scheduler dialect (dialects: [kafka-scheduler]); give %s in Unix seconds", db, p.r.Ingest, HeaderSchedulerEpoch)
	case db != "":
		return delaybridgeReader{}, nil
	case sched != "" || tomb || !p.r.reads(DialectDelaybridge):
		return schedulerReader{}, nil
	}
	return delaybridgeReader{}, nil
}

func firstPresent(h Headers, names []string) string {
	for _, n := range names {
		if _, ok := h.Get(n); ok {
			return n
		}
	}
	return ""
}
