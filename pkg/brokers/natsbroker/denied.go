package natsbroker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
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
// sink's Publish looks here for the subjects of what it sent, and sends
// nothing to a subject refused within refusedFor.
type denials struct {
	mu  sync.Mutex
	seq uint64 // the number of the last refusal
	// bySubject is each subject's last refusal, at most maxDenied
	// subjects; lostUpTo is the newest number of one dropped to keep to
	// that, so that a refusal dropped is never taken for none.
	bySubject map[string]denial
	lostUpTo  uint64
	// recent are the errors of the last refusals, for caughtUp.
	recent []error
	// wake is closed, and replaced, at each refusal.
	wake chan struct{}
	log  *slog.Logger
}

// denial is one refusal: its number, when, and the server's words.
type denial struct {
	seq uint64
	at  time.Time
	err error
}

const (
	// maxDenied bounds the subjects whose refusals are kept.
	maxDenied = 4096
	// maxRecent bounds the errors caughtUp looks among.
	maxRecent = 1024
	// refusedFor is how long a subject refused is not published to: its
	// messages fail at once, as refused, instead of each leaving nats.go a
	// PubAck to wait for (the publish timeout) that never comes.
	refusedFor = time.Second
)

// errRefusalsLost is since's answer when refusals newer than its mark
// were dropped (more than maxDenied subjects refused meanwhile): whether
// the subject was among them is not known, and a publish taken for done
// would lose the message.
var errRefusalsLost = fmt.Errorf("%w: more subjects were refused at once than the sink keeps apart; this publish may be one of them", nats.ErrPermissionViolation)

// publishDenied finds the subject, quoted as Go quotes it, in the server's
// refusal of a publish.
var publishDenied = regexp.MustCompile(`(?i)publish to ("(?:[^"\\]|\\.)*")`)

func newDenials(log *slog.Logger) *denials {
	return &denials{bySubject: map[string]denial{}, wake: make(chan struct{}), log: log}
}

// refusedSubject is the subject a refusal of a publish names; false for
// any other error.
func refusedSubject(err error) (string, bool) {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return "", false
	}
	m := publishDenied.FindStringSubmatch(err.Error())
	if m == nil {
		return "", false
	}
	subject, uerr := strconv.Unquote(m[1])
	return subject, uerr == nil
}

// asyncErr is the connection's async error callback: a refused publish is
// recorded (and logged at debug: the scheduler logs the failed publish,
// once per destination and interval); anything else is a WARN, as
// Connect's own callback logs it.
func (d *denials) asyncErr(_ *nats.Conn, _ *nats.Subscription, err error) {
	subject, ok := refusedSubject(err)
	if !ok {
		d.log.Warn("nats error", "err", err)
		return
	}
	d.log.Debug("nats refused a publish", "subject", subject, "err", err)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seq++
	d.bySubject[subject] = denial{seq: d.seq, at: time.Now(), err: err}
	if len(d.bySubject) > maxDenied {
		oldest, at := "", d.seq
		for s, e := range d.bySubject {
			if e.seq < at {
				oldest, at = s, e.seq
			}
		}
		delete(d.bySubject, oldest)
		d.lostUpTo = max(d.lostUpTo, at)
	}
	d.recent = append(d.recent, err)
	if len(d.recent) > maxRecent {
		d.recent = d.recent[len(d.recent)-maxRecent:]
	}
	close(d.wake)
	d.wake = make(chan struct{})
}

// mark is the number of the last refusal and the channel the next closes.
func (d *denials) mark() (uint64, <-chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.seq, d.wake
}

// since returns the refusal of a publish to subject recorded after the
// refusal numbered from, nil when none (errRefusalsLost when that cannot
// be told).
func (d *denials) since(from uint64, subject string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e, ok := d.bySubject[subject]; ok && e.seq > from {
		return e.err
	}
	if d.lostUpTo > from {
		return errRefusalsLost
	}
	return nil
}

// refused returns the refusal of subject recorded within refusedFor, nil
// when none.
func (d *denials) refused(subject string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e, ok := d.bySubject[subject]; ok && time.Since(e.at) < refusedFor {
		return e.err
	}
	return nil
}

// caughtUp waits until the callback has recorded err, the connection's
// last error once a flush returned (nats.go sets it as it reads the -ERR,
// before the flush's PONG, and queues the callback; the callbacks run one
// at a time, in order): every refusal the server sent before the PONG is
// then here. It gives up after a second, or when ctx ends.
func (d *denials) caughtUp(ctx context.Context, err error) {
	if _, ok := refusedSubject(err); !ok {
		return
	}
	deadline := time.NewTimer(time.Second)
	defer deadline.Stop()
	for {
		d.mu.Lock()
		wake := d.wake
		for i := len(d.recent) - 1; i >= 0; i-- {
			if d.recent[i] == err {
				d.mu.Unlock()
				return
			}
		}
		d.mu.Unlock()
		select {
		case <-wake:
		case <-deadline.C:
			return
		case <-ctx.Done():
			return
		}
	}
}
