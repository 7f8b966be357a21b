package sinks_test

import (
	"fmt"
	"testing"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

func TestPropertyHeaders(t *testing.T) {
	m := &envelope.Message{
		Headers: envelope.Headers{{Key: "Content-Type", Value: "text/plain"}},
		Properties: envelope.Headers{
			{Key: "content-type", Value: "application/json"}, // the sender's own header wins
			{Key: "correlation-id", Value: "c-1"},
			{Key: "priority", Value: "7", Native: "B\x07"}, // the string form goes out
		},
	}
	got := fmt.Sprint(sinks.PropertyHeaders(m))
	want := fmt.Sprint(envelope.Headers{{Key: "correlation-id", Value: "c-1"}, {Key: "priority", Value: "7"}})
	if got != want {
		t.Errorf("got %s, want %s", got, want)
	}
	if h := sinks.PropertyHeaders(&envelope.Message{}); h != nil {
		t.Errorf("no properties: %v", h)
	}
}
