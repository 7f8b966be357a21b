package brokers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Unreachable tells a broker that does not answer (the daemon starts with
// the ingest connecting) from one that answered and refused or whose
// request timed out on a connection made (the start stops with the cause).
func TestUnreachable(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	dialTimeout := &net.OpError{Op: "dial", Net: "tcp", Err: context.DeadlineExceeded}
	for _, c := range []struct {
		what string
		err  error
		want bool
	}{
		{"a refused dial", fmt.Errorf("ingest in: connect: %w", refused), true},
		{"a dial that timed out", fmt.Errorf("ingest in: %w", dialTimeout), true},
		{"nats.go's no servers", fmt.Errorf("connect to nats: %w", nats.ErrNoServers), true},
		{"a RabbitMQ broker silent after the connect", fmt.Errorf("connect: %w", &amqp.Error{Code: amqp.FrameError, Reason: "read tcp 127.0.0.1:1->127.0.0.1:2: i/o timeout"}), true},
		{"a JetStream request without an answer", fmt.Errorf(`ingest in: stream "S": %w`, context.DeadlineExceeded), false},
		{"wrong credentials", fmt.Errorf("connect: %w", nats.ErrAuthorization), false},
		{"a RabbitMQ refusal", &amqp.Error{Code: amqp.AccessRefused, Reason: "ACCESS_REFUSED", Server: true}, false},
		{"another error", errors.New("topic does not exist"), false},
	} {
		if got := Unreachable(c.err); got != c.want {
			t.Errorf("%s (%v): Unreachable %v, want %v", c.what, c.err, got, c.want)
		}
		if c.want && !Waiting(c.err) {
			t.Errorf("%s (%v): not Waiting", c.what, c.err)
		}
	}
	// A connection made and lost before the broker answered: not waited
	// for at start (a TLS or SASL mismatch looks the same), but once the
	// ingest waits for its broker, it goes on waiting.
	for _, c := range []struct {
		what string
		err  error
	}{
		{"an EOF", fmt.Errorf("connect to nats: %w", io.EOF)},
		{"a reset", fmt.Errorf("no broker answered: %w", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET})},
		{"a connection closed", fmt.Errorf("answered: %w", &net.OpError{Op: "read", Net: "tcp", Err: net.ErrClosed})},
		{"amqp091-go's EOF", fmt.Errorf("connect: %w", &amqp.Error{Code: amqp.FrameError, Reason: "EOF"})},
	} {
		if Unreachable(c.err) || !Waiting(c.err) {
			t.Errorf("%s (%v): Unreachable %v, Waiting %v; want false, true", c.what, c.err, Unreachable(c.err), Waiting(c.err))
		}
	}
	for _, err := range []error{nats.ErrAuthorization, &amqp.Error{Code: amqp.AccessRefused, Reason: "ACCESS_REFUSED", Server: true},
		&amqp.Error{Code: amqp.FrameError, Reason: "frame could not be parsed"}, // an answer, in another protocol
		&amqp.Error{Code: amqp.FrameError, Reason: "remote error: tls: certificate required"}} {
		if Waiting(err) {
			t.Errorf("%v: Waiting, want a refusal to end the wait", err)
		}
	}
}
