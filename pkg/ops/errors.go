package ops

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/delaybridge/delaybridge/pkg/jsonlimit"
)

// The kinds of Error, for errors.Is. A front end turns each into its own
// terms (the admin API into 404, 409 and 400; the command line into its
// exit codes) and shows the Error's sentence as it is.
var (
	// ErrNotFound: the message, dead message, group or sink named does
	// not exist.
	ErrNotFound = errors.New("not found")
	// ErrConflict: the change is refused because of the state of what it
	// acts on (a message in flight or dead, a due time that changed, a
	// dead message whose sink or destination is not valid).
	ErrConflict = errors.New("conflict")
	// ErrInvalid: a field of the request cannot be used.
	ErrInvalid = errors.New("invalid")
	// ErrUnavailable: the store cannot take the change now (a limit is
	// reached); it passes (Error.RetryAfter).
	ErrUnavailable = errors.New("unavailable")
)

// Error is what an operation refuses with: its kind, the sentence an
// operator reads (written here once, for every front end) and, for some
// kinds, what the front end needs beyond it.
type Error struct {
	Kind   error  // ErrNotFound, ErrConflict, ErrInvalid or ErrUnavailable
	Reason string // the sentence, which names what to do
	// Field is, for ErrInvalid, the request field or parameter at fault
	// (a JSON field or query parameter name of the admin API: "delay",
	// "limit", "id").
	Field string
	// DueAt is, for the ErrConflict of a reschedule whose if_due_at no
	// longer holds, the due time the message has now.
	DueAt string
	// RetryAfter is, for an ErrConflict that passes (a message being
	// published is settled within moments), when to try again.
	RetryAfter time.Duration
}

func (e *Error) Error() string        { return e.Reason }
func (e *Error) Is(target error) bool { return target == e.Kind }

func notFound(format string, args ...any) *Error {
	return &Error{Kind: ErrNotFound, Reason: fmt.Sprintf(format, args...)}
}

func conflict(format string, args ...any) *Error {
	return &Error{Kind: ErrConflict, Reason: fmt.Sprintf(format, args...)}
}

func invalid(field, format string, args ...any) *Error {
	return &Error{Kind: ErrInvalid, Field: field, Reason: fmt.Sprintf(format, args...)}
}

// quoteMax bounds what a sentence quotes of a value it was given (an ID, a
// group, a filter, a name): an answer never echoes more of its input, so
// that its size does not grow with what was sent.
const quoteMax = 64

// quote is v quoted for a sentence as %q quotes it,
// cut to quoteMax bytes with "..." where it was cut.
func quote(v string) string { return strconv.Quote(jsonlimit.Clip(v, quoteMax)) }

// The sentences of what is not found, and of changes refused for a
// message's state.

func noMessage(id string) *Error {
	return notFound("no message with ID %s (never parked, already delivered, or cancelled)", quote(id))
}

func noDeadMessage(id string) *Error {
	return notFound("no dead message with ID %s", quote(id))
}

func noGroup(key string) *Error {
	return notFound("no message is filed under group %s (x-delay-group)", quote(key))
}

// inFlightRetry is when to try a change again that met a message being
// published: by then its publish is usually settled (delivered: gone;
// failed: scheduled again, and the change goes through).
const inFlightRetry = time.Second

// inFlight refuses a change (what: "rescheduled", "fired", "cancelled") to
// a message being published, or sent before without a confirmation.
func inFlight(id, what string) *Error {
	e := conflict("message %s is being published now, or a publish of it was (or may have been) sent and not confirmed and may still arrive, "+
		"and cannot be %s; a publish under way that fails before reaching its broker is scheduled again and can be %s then, "+
		"one that may have reached it only once a publish of it is confirmed (then it is gone)", quote(id), what, what)
	e.RetryAfter = inFlightRetry
	return e
}

// isDead refuses a change to a dead message.
func isDead(id, what string) *Error {
	return conflict("message %s is dead and cannot be %s; retry it (POST /v1/dead/{id}/retry, "+
		"`delaybridge dead retry`) to schedule it again, due now", quote(id), what)
}
