package envelope

import (
	"errors"
	"fmt"
)

// Code is the short fixed name of why a message is rejected: the reason
// label of delaybridge_ingest_rejected_total, which pkg/ops also reads to
// name the field of a 400 answer. A Code is an error, the sentinel of its
// rejections: errors.Is(err, CodeInvalidRoute) reports whether err is a
// Rejection of that code.
type Code string

func (c Code) Error() string { return string(c) }

// Reject codes. Parse sets every one of them but CodeCancelUnknown,
// CodeMaxSeries and CodeIDTaken, which the ingest pipeline sets from what
// the store answers (CancelUnknown, ErrMaxSeries, ErrIDTaken).
const (
	CodeUndecodableHeaders Code = "undecodable_headers"
	CodeInvalidID          Code = "invalid_id"
	CodePayloadTooLarge    Code = "payload_too_large"
	CodeHeadersTooLarge    Code = "headers_too_large"
	CodeDuplicateHeader    Code = "duplicate_header"
	CodeInvalidCancel      Code = "invalid_cancel"
	CodeBothDelays         Code = "both_delay_headers"
	CodeInvalidDelay       Code = "invalid_delay"
	CodeInvalidDeliverAt   Code = "invalid_deliver_at"
	CodeNoDelay            Code = "no_delay"
	CodeOverMaxDelay       Code = "over_max_delay"
	CodeInvalidPriority    Code = "invalid_priority"
	CodeInvalidRoute       Code = "invalid_route"
	CodeCancelUnknown      Code = "cancel_unknown_id" // a cancel of an ID that is not parked (CancelUnknown)
	CodeInvalidSchedule    Code = "invalid_schedule"
	CodeInvalidGroup       Code = "invalid_group"

	CodeInvalidDestination  Code = "invalid_destination"      // a template that does not expand to a valid destination
	CodeDestinationReserved Code = "destination_reserved"     // a reserved part of a broker's namespace (destination.ErrReserved; = destination.ReservedCode)
	CodeMaxSeries           Code = "max_series"               // a new series past limits.max_series or its ingest's max_series (ErrMaxSeries, ErrIngestMaxSeries)
	CodeIDTaken             Code = "id_taken"                 // an ID known as another source's message (ErrIDTaken)
	CodeInvalidReplace      Code = "invalid_replace"          // x-delay-replace neither true nor false
	CodeInvalidEpoch        Code = "invalid_scheduler_epoch"  // kafka-scheduler: scheduler-epoch missing or not Unix seconds
	CodeInvalidScheduler    Code = "invalid_scheduler_record" // kafka-scheduler: no key, mixed dialects, a header of the other dialect
)

// RejectCodes lists every Code.
var RejectCodes = []Code{
	CodeUndecodableHeaders, CodeInvalidID, CodePayloadTooLarge, CodeHeadersTooLarge, CodeDuplicateHeader,
	CodeInvalidCancel, CodeBothDelays, CodeInvalidDelay, CodeInvalidDeliverAt,
	CodeNoDelay, CodeOverMaxDelay, CodeInvalidPriority, CodeInvalidRoute, CodeCancelUnknown,
	CodeInvalidSchedule, CodeInvalidGroup,
	CodeInvalidDestination, CodeDestinationReserved, CodeInvalidReplace, CodeInvalidEpoch, CodeInvalidScheduler,
	CodeMaxSeries, CodeIDTaken,
}

// Rejection is why a message is rejected (Decision.Err): its Code, and the
// reason in words an operator can act on, which is what a dead message
// keeps (Error).
type Rejection struct {
	Code   Code
	Reason string
}

func (r *Rejection) Error() string { return r.Reason }

// Is reports whether target is r's Code.
func (r *Rejection) Is(target error) bool {
	c, ok := target.(Code)
	return ok && c == r.Code
}

// CodeOf is the Code of err's Rejection; "" when err is none.
func CodeOf(err error) Code {
	var r *Rejection
	if errors.As(err, &r) {
		return r.Code
	}
	return ""
}

// rejectf is the Rejection of code with the reason format and args.
func rejectf(code Code, format string, args ...any) error {
	return &Rejection{Code: code, Reason: fmt.Sprintf(format, args...)}
}

// ReasonMaxSeries is the reason of a new recurring series refused for
// limits.max_series.
const ReasonMaxSeries = "the store holds as many live recurring series as limits.max_series allows: end or cancel series (x-delay-cancel, DELETE /v1/messages/{id}), or raise the limit"

// ErrMaxSeries rejects a new recurring series that the store refused for
// limits.max_series (store.OverSeries).
var ErrMaxSeries error = &Rejection{Code: CodeMaxSeries, Reason: ReasonMaxSeries}

// ReasonIngestMaxSeries is the reason of a new recurring series refused for
// its ingest's ingest[].max_series.
const ReasonIngestMaxSeries = "the store holds as many live recurring series of this ingest as its max_series allows: end or cancel series (x-delay-cancel, DELETE /v1/messages/{id}), or raise the ingest's max_series"

// ErrIngestMaxSeries rejects a new recurring series that the store refused
// for its ingest's max_series (store.OverSourceSeries).
var ErrIngestMaxSeries error = &Rejection{Code: CodeMaxSeries, Reason: ReasonIngestMaxSeries}

// ReasonIDTaken is the reason of a message whose ID is known as a message
// of another source (another ingest, or the admin API).
const ReasonIDTaken = "id_taken: the message ID is known as a message of another ingest (or of the admin API); " +
	"a publisher cannot replace or drop another's message by reusing its ID: give this message an ID of its own"

// ErrIDTaken rejects a message whose ID the store knows as another
// source's message (store.IDTaken).
var ErrIDTaken error = &Rejection{Code: CodeIDTaken, Reason: ReasonIDTaken}

// CancelUnknown rejects a cancel (x-delay-cancel) of id, which is not
// parked: the ID may be wrong, the message may have fired already, or the
// cancel raced ahead of it.
func CancelUnknown(id string) error {
	return rejectf(CodeCancelUnknown, "%s: no message with ID %q is parked (unknown, already delivered, or not parked yet)", HeaderCancel, id)
}
