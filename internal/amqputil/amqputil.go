// Package amqputil holds what the RabbitMQ ingest and sink share: dialing,
// the reconnect back-off, the connection state behind Ready, and the
// classification of AMQP errors.
//
// amqp091-go does not reconnect by itself (its experimental Recovery is left
// off): each adapter runs its own loop that dials, sets up its channels,
// watches NotifyClose, and dials again with Backoff when the broker goes away.
package amqputil

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DialTimeout bounds the TCP connect plus the AMQP handshake.
const DialTimeout = 10 * time.Second

// Heartbeat is the AMQP heartbeat interval asked for: a broker that vanishes
// without closing the TCP connection is noticed within about twice this.
const Heartbeat = 10 * time.Second

// Dial opens an AMQP connection to rawURL (amqp:// or amqps://) named name
// in the broker's management UI. ctx cancels the TCP connect.
func Dial(ctx context.Context, rawURL, name string) (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(name)
	conn, err := amqp.DialConfig(rawURL, amqp.Config{
		Heartbeat:  Heartbeat,
		Properties: props,
		Dial: func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: DialTimeout}
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// Cleared by the library once the handshake is done.
			if err := c.SetDeadline(time.Now().Add(DialTimeout)); err != nil {
				c.Close()
				return nil, err
			}
			return c, nil
		},
	})
	if err != nil {
		return nil, fmt.Errorf("connect to rabbitmq %s: %w", Redact(rawURL), err)
	}
	return conn, nil
}

// Redact hides the password of an AMQP URL, for logs and errors.
func Redact(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "(unparsable url)"
	}
	return u.Redacted()
}

// Code returns the AMQP reply code of err (404 NOT_FOUND, 403
// ACCESS_REFUSED, 320 CONNECTION_FORCED ...), or 0 when err carries none.
func Code(err error) int {
	var ae *amqp.Error
	if errors.As(err, &ae) {
		return ae.Code
	}
	return 0
}

// Backoff is an exponential back-off with jitter for reconnect loops:
// Min, doubling up to Max. The zero value uses 100ms and 5s.
type Backoff struct {
	Min, Max time.Duration
	n        int
}

// Next returns the next wait.
func (b *Backoff) Next() time.Duration {
	lo, hi := b.Min, b.Max
	if lo <= 0 {
		lo = 100 * time.Millisecond
	}
	if hi <= 0 {
		hi = 5 * time.Second
	}
	d := lo << min(b.n, 16)
	if d > hi || d <= 0 {
		d = hi
	}
	b.n++
	// Jitter: 75% to 125%, so that many clients do not reconnect in step.
	return d*3/4 + rand.N(d/2+1)
}

// Reset starts over at Min, after a successful connect.
func (b *Backoff) Reset() { b.n = 0 }

// Wait sleeps for the next back-off; it returns false when done is closed or
// ctx ends first.
func (b *Backoff) Wait(ctx context.Context, done <-chan struct{}) bool {
	t := time.NewTimer(b.Next())
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-done:
		return false
	case <-ctx.Done():
		return false
	}
}

// State is a connection state for Ready: nil while connected, else why not.
type State struct {
	mu  sync.Mutex
	err error
}

// NewState returns a State that is not connected yet.
func NewState() *State {
	return &State{err: errors.New("not connected yet")}
}

// Up marks the connection as working.
func (s *State) Up() {
	s.mu.Lock()
	s.err = nil
	s.mu.Unlock()
}

// Down marks the connection as down because of err.
func (s *State) Down(err error) {
	if err == nil {
		err = errors.New("disconnected")
	}
	s.mu.Lock()
	s.err = err
	s.mu.Unlock()
}

// Err returns nil when connected, else the reason.
func (s *State) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// CloseReason describes why a connection or channel ended, from the value
// read from its NotifyClose channel (nil when the channel was closed without
// an error, which amqp091-go does on a graceful close).
func CloseReason(e *amqp.Error, what string) error {
	if e == nil {
		return fmt.Errorf("%s closed", what)
	}
	return fmt.Errorf("%s closed: %w", what, e)
}
