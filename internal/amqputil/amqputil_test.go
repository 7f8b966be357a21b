package amqputil

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"amqp://guest:secret@127.0.0.1:5672/vh": "amqp://guest:xxxxx@127.0.0.1:5672/vh",
		"amqp://127.0.0.1:5672/":                "amqp://127.0.0.1:5672/",
		"amqps://user@host/":                    "amqps://user@host/",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
	if strings.Contains(Redact("amqp://u:p%zz@h/"), "p%zz") {
		t.Error("an unparsable URL leaks its password")
	}
}

func TestCode(t *testing.T) {
	err := fmt.Errorf("wrapped: %w", &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND"})
	if Code(err) != 404 || Code(errors.New("x")) != 0 || Code(nil) != 0 {
		t.Error("Code")
	}
}

func TestBackoff(t *testing.T) {
	b := Backoff{Min: 100 * time.Millisecond, Max: time.Second}
	var last time.Duration
	for i := range 10 {
		d := b.Next()
		if d < 75*time.Millisecond || d > 1250*time.Millisecond {
			t.Fatalf("wait %d: %v out of bounds", i, d)
		}
		last = d
	}
	if last < 750*time.Millisecond {
		t.Errorf("after 10 tries the wait is %v, want about Max", last)
	}
	b.Reset()
	if d := b.Next(); d > 125*time.Millisecond {
		t.Errorf("after Reset: %v", d)
	}
	done := make(chan struct{})
	close(done)
	if b.Wait(context.Background(), done) {
		t.Error("Wait with done closed: true")
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
