package natsbroker

import (
	"testing"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// A RabbitMQ ingest's properties go out as headers; one NATS cannot carry
// exactly is left out instead of failing the message.
func TestToNATSProperties(t *testing.T) {
	m := sinks.Outgoing{Attempt: 1, Message: &envelope.Message{
		ID: "p-1", Destination: "out.p",
		Properties: envelope.Headers{
			{Key: "content-type", Value: "application/json"},
			{Key: "reply-to", Value: " padded "},
			{Key: "timestamp", Value: "2026-11-18T11:06:40Z", Native: "T\x00"},
		},
	}}
	nm, err := toNATS(m)
	if err != nil {
		t.Fatal(err)
	}
	if v := nm.Header.Get("content-type"); v != "application/json" {
		t.Errorf("content-type %q", v)
	}
	if v := nm.Header.Get("timestamp"); v != "2026-11-18T11:06:40Z" {
		t.Errorf("timestamp %q", v)
	}
	if v, ok := nm.Header["reply-to"]; ok {
		t.Errorf("reply-to %q: NATS drops its blanks, so it should be left out", v)
	}
}
