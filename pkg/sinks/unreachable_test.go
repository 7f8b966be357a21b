package sinks_test

import (
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// A broker that nothing answers for (a port nobody listens on, a host
// name that does not resolve, a server that takes the connection and says
// nothing) is unreachable; a broker that answered and refused is not.
func TestUnreachable(t *testing.T) {
	dial := func(addr string) error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			t.Fatalf("%s answered", addr)
		}
		return err
	}
	refused, noHost := dial(fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))), dial("no-such-host.invalid:5672")
	// A server that takes the connection and never answers (hung).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	_, silent := c.Read(make([]byte, 1))
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("connect to rabbitmq: %w", refused), true},
		{fmt.Errorf("connect to nats: %w", noHost), true},
		{fmt.Errorf("connect to nats: %w", silent), true},
		{errors.New("Exception (403) Reason: \"username or password not allowed\""), false},
		{nil, false},
	} {
		if got := sinks.Unreachable(c.err); got != c.want {
			t.Errorf("Unreachable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
