package rabbitbroker

import (
	"errors"
	"fmt"
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
