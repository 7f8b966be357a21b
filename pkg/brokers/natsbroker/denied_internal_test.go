package natsbroker

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/nats-io/nats.go"
)

// refusal is a refusal as nats.go hands it to the async error callback:
// nats-server quotes the subject with Go's %q.
func refusal(subject string) error {
	return fmt.Errorf("%w: Permissions Violation for Publish to %q", nats.ErrPermissionViolation, subject)
}

// The subject of a refusal is read as the server quoted it, quotes and
// backslashes included; a refusal of a reply subject, or another error,
// names none.
func TestRefusedSubject(t *testing.T) {
	for _, subject := range []string{"deny.a", `orders.eu"1`, `a\b`, "ü.x"} {
		if got, ok := refusedSubject(refusal(subject)); !ok || got != subject {
			t.Errorf("refusal of %q: read %q, %v", subject, got, ok)
		}
	}
	for _, err := range []error{
		fmt.Errorf("%w: Permissions Violation for Publish with Reply of %q", nats.ErrPermissionViolation, "_INBOX.x"),
		fmt.Errorf("%w: Permissions Violation for Subscription to %q", nats.ErrPermissionViolation, "deny.a"),
		errors.New(`Publish to "deny.a"`),
	} {
		if got, ok := refusedSubject(err); ok {
			t.Errorf("%v: read a publish refused to %q", err, got)
		}
	}
}

// A refusal dropped to keep to maxDenied subjects is never taken for none:
// a publish it may have been is refused too (a core NATS one taken for done
// would be lost).
func TestRefusalsDroppedAreNotNone(t *testing.T) {
	d := newDenials(slog.New(slog.DiscardHandler))
	from, _ := d.mark()
	d.asyncErr(nil, nil, refusal("first"))
	for i := range maxDenied {
		d.asyncErr(nil, nil, refusal(fmt.Sprint("other.", i)))
	}
	if err := d.since(from, "first"); !errors.Is(err, nats.ErrPermissionViolation) {
		t.Fatalf("a refusal dropped since the mark: %v, want a refusal", err)
	}
	later, _ := d.mark()
	if err := d.since(later, "first"); err != nil {
		t.Fatalf("nothing refused since a later mark: %v", err)
	}
	if err := d.since(from, "other.7"); err == nil || err == errRefusalsLost {
		t.Fatalf("a refusal kept: %v, want its own", err)
	}
}
