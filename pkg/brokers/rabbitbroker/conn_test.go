package rabbitbroker

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

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
