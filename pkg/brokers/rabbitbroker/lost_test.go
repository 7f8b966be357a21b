package rabbitbroker

import (
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A connection lost on a reset, a broken pipe or EOF may be the broker's
// close for a publish, unread (its publishes are tried again apart); one
// lost on a timeout is a broker that does not answer; a close the broker
// sent is attributable or not, never lost.
func TestLostConnection(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&amqp.Error{Code: amqp.FrameError, Reason: "write tcp 127.0.0.1:38766->127.0.0.1:29236: write: connection reset by peer"}, true},
		{&amqp.Error{Code: amqp.FrameError, Reason: "write tcp 127.0.0.1:1->127.0.0.1:2: write: broken pipe"}, true},
		{fmt.Errorf("connection closed: %w", &amqp.Error{Code: amqp.FrameError, Reason: "EOF"}), true},
		{&amqp.Error{Code: amqp.FrameError, Reason: "read tcp 127.0.0.1:1->127.0.0.1:2: i/o timeout"}, false},
		{&amqp.Error{Code: amqp.FrameError, Reason: "Heartbeat Timeout"}, false},
		{&amqp.Error{Code: amqp.InternalError, Reason: "INTERNAL_ERROR", Server: true}, false},
		{amqp.ErrClosed, false},
	} {
		if got := lost(c.err); got != c.want {
			t.Errorf("lost(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
