package sinks

import (
	"context"
	"errors"
)

// Reason is why a publish failed, as a short label from a fixed set: the
// reason label of delaybridge_sink_publish_errors_total and the reason of
// the scheduler's WARN line. The set is closed so that the metric's label
// values stay bounded whatever the brokers answer.
type Reason string

// The reasons. A broker package marks the errors it can name with Because;
// ReasonOf derives the others from the error's class (Rejected, Permanent,
// or the sink's).
const (
	ReasonUnroutable   Reason = "unroutable"   // the broker routed it nowhere (RabbitMQ: no queue bound for the routing key)
	ReasonNotFound     Reason = "not_found"    // the destination does not exist (no JetStream stream for the subject, no such Kafka topic or RabbitMQ exchange)
	ReasonTooLarge     Reason = "too_large"    // over the broker's or the destination's size limit
	ReasonUnauthorized Reason = "unauthorized" // the sink's user may not publish there
	ReasonInvalid      Reason = "invalid"      // the message cannot be expressed for the broker (a bad subject, topic or header)
	ReasonTimeout      Reason = "timeout"      // no confirmation within scheduler.publish_timeout (or the lease)
	ReasonUnavailable  Reason = "unavailable"  // the sink could not take it: disconnected, blocked, the broker down, not sent (NotSent), its destination down (Down)
	ReasonRejected     Reason = "rejected"     // the broker refused this message for another reason
	ReasonOther        Reason = "other"        // a failure nothing above names (a permanent one without a reason)
)

// Reasons lists every Reason, for documentation and tests.
var Reasons = []Reason{ReasonUnroutable, ReasonNotFound, ReasonTooLarge, ReasonUnauthorized, ReasonInvalid,
	ReasonTimeout, ReasonUnavailable, ReasonRejected, ReasonOther}

// ReasonError is an error with the Reason a broker package named for it.
type ReasonError struct {
	Reason Reason
	Err    error
}

func (e *ReasonError) Error() string { return e.Err.Error() }
func (e *ReasonError) Unwrap() error { return e.Err }

// Because marks err with reason r. Wrap the result with Rejected or
// Permanent as usual: the class decides what becomes of the message, the
// reason only names the failure.
func Because(r Reason, err error) error { return &ReasonError{Reason: r, Err: err} }

// ReasonOf returns the Reason of a failed publish: the one marked with
// Because (the outermost), else unavailable for a NotSentError or a
// DownError, else timeout for an error that wraps
// context.DeadlineExceeded, else rejected for a RejectedError, other for a
// PermanentError, and unavailable for the rest (the sink's failures).
// It returns "" for nil.
func ReasonOf(err error) Reason {
	var re *ReasonError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &re):
		return re.Reason
	case IsNotSent(err), IsDown(err): // whatever ended its turn, it was not taken
		return ReasonUnavailable
	case errors.Is(err, context.DeadlineExceeded):
		return ReasonTimeout
	case IsRejected(err):
		return ReasonRejected
	case IsPermanent(err):
		return ReasonOther
	}
	return ReasonUnavailable
}
