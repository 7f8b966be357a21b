package kafkabroker

import (
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// A RabbitMQ ingest's properties go out as headers after the others.
func TestToKafkaProperties(t *testing.T) {
	m := sinks.Outgoing{Attempt: 1, Message: &envelope.Message{
		ID: "p-1", Destination: "out",
		Headers:    envelope.Headers{{Key: "x-a", Value: "1", Native: "I\x02"}},
		Properties: envelope.Headers{{Key: "content-type", Value: "application/json"}, {Key: "priority", Value: "7", Native: "B\x07"}},
	}}
	km := toKafka(m, time.Now())
	var got []string
	for _, h := range km.Headers {
		got = append(got, h.Key+"="+string(h.Value))
	}
	want := []string{"x-a=1", "x-message-id=p-1", "x-delaybridge-due-at=" + envelope.FormatTime(time.Time{}), "x-delaybridge-attempt=1",
		"content-type=application/json", "priority=7"}
	if len(got) != len(want) {
		t.Fatalf("headers %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("header %d: %q, want %q", i, got[i], want[i])
		}
	}
}
