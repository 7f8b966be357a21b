package brokers

import (
	"context"
	"errors"
	"fmt"
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
	}
}
