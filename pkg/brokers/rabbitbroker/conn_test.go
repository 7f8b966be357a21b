package rabbitbroker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestCode(t *testing.T) {
	err := fmt.Errorf("wrapped: %w", &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND"})
	if Code(err) != 404 || Code(errors.New("x")) != 0 || Code(nil) != 0 {
		t.Error("Code")
	}
}

func TestState(t *testing.T) {
	s := NewState()
	if s.Err() == nil {
		t.Error("new state is ready")
	}
	s.Up()
	if s.Err() != nil {
		t.Error("Up: not ready")
	}
	s.Down(nil)
	if s.Err() == nil {
		t.Error("Down(nil): ready")
	}
}

// A broker that rejects the client certificate after a TLS 1.3 handshake
// closes the connection, and which error Dial returns depends on who reads
// or writes first: each gets the hint about the client certificate.
// (TestDialExternal sees whichever one the machine's timing gives.)
func TestExplainTLSClosedAfterHandshake(t *testing.T) {
	const url = "amqps://127.0.0.1:5671/"
	for _, cause := range []error{
		io.EOF,
		&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET},
		&net.OpError{Op: "write", Net: "tcp", Err: syscall.EPIPE},
		amqp.ErrClosed,
		&net.OpError{Op: "write", Net: "tcp", Err: net.ErrClosed}, // "use of closed network connection"
	} {
		got := explain(cause, url, Auth{External: true}).Error()
		if !strings.Contains(got, "check tls.cert_file and tls.key_file") || !errors.Is(explain(cause, url, Auth{}), cause) {
			t.Errorf("%v: %s", cause, got)
		}
	}
}

// A stop while a broker that took the connection says nothing ends Dial at
// once, with the stop's cause, not the handshake's timeout DialTimeout later.
func TestDialEndsWithItsContext(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c // held open, never answered
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := Dial(ctx, "amqp://guest:guest@"+ln.Addr().String()+"/", "test", Auth{})
		done <- err
	}()
	c := <-accepted
	defer c.Close()
	if _, err := io.ReadFull(c, make([]byte, 8)); err != nil { // the protocol header: the handshake waits for the broker
		t.Fatal(err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Dial after its context ended: %v, want context.Canceled", err)
	}
}
