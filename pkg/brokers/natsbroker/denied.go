package natsbroker

import (
	"errors"
	"log/slog"
	"regexp"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// denials are the server's refusals of publishes on a sink's connection.
// A publish to a subject its user may not publish to is dropped by the
// server, which says so only in a -ERR ("Permissions Violation for Publish
// to ..."): nats.go passes it to the connection's async error callback and
// keeps it as the connection's last error, and a core NATS publish returns
// as if sent, a JetStream one waits for a PubAck that never comes. The
// sink's Publish looks here for the subjects of what it sent.
type denials struct {
	mu   sync.Mutex
	seq  uint64   // the number of the last denial
	last []denial // the most recent, at most maxDenials
	// wake is closed, and replaced, at each denial.
	wake chan struct{}
	log  *slog.Logger
}

// denial is one refusal: its number, the subject and the server's words.
type denial struct {
	seq     uint64
	subject string
	err     error
}

// maxDenials bounds the refusals kept: a Publish looks at those since it
// began, a few milliseconds.
const maxDenials = 1024

// publishDenied finds the subject in a permissions violation of a publish.
var publishDenied = regexp.MustCompile(`(?i)publish to "([^"]+)"`)

func newDenials(log *slog.Logger) *denials {
	return &denials{wake: make(chan struct{}), log: log}
}

// asyncErr is the connection's async error callback: a refused publish is
// recorded (and logged at debug: the scheduler logs the failed publish,
// once per destination and interval); anything else is a WARN, as
// Connect's own callback logs it.
func (d *denials) asyncErr(_ *nats.Conn, _ *nats.Subscription, err error) {
	m := publishDenied.FindStringSubmatch(err.Error())
	if !errors.Is(err, nats.ErrPermissionViolation) || m == nil {
		d.log.Warn("nats error", "err", err)
		return
	}
	d.log.Debug("nats refused a publish", "subject", m[1], "err", err)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seq++
	d.last = append(d.last, denial{seq: d.seq, subject: m[1], err: err})
	if len(d.last) > maxDenials {
		d.last = d.last[len(d.last)-maxDenials:]
	}
	close(d.wake)
	d.wake = make(chan struct{})
}

// mark is the number of the last denial and the channel the next closes:
// what a Publish takes before it sends.
func (d *denials) mark() (uint64, <-chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.seq, d.wake
}

// since returns the refusal of a publish to subject recorded after the
// denial numbered from, nil when none.
func (d *denials) since(from uint64, subject string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := len(d.last) - 1; i >= 0 && d.last[i].seq > from; i-- {
		if d.last[i].subject == subject {
			return d.last[i].err
		}
	}
	return nil
}

// caughtUp waits until the callback has recorded err, the connection's
// last error once a flush returned (nats.go sets it as it reads the -ERR,
// before the flush's PONG, and queues the callback): every refusal the
// server sent before the PONG is then here. It gives up after maxWait
// (the callbacks run one at a time, and another may be slow).
func (d *denials) caughtUp(err error, maxWait time.Duration) {
	if err == nil || !errors.Is(err, nats.ErrPermissionViolation) {
		return
	}
	deadline := time.NewTimer(maxWait)
	defer deadline.Stop()
	for {
		d.mu.Lock()
		wake := d.wake
		for i := len(d.last) - 1; i >= 0; i-- {
			if d.last[i].err == err {
				d.mu.Unlock()
				return
			}
		}
		d.mu.Unlock()
		select {
		case <-wake:
		case <-deadline.C:
			return
		}
	}
}
