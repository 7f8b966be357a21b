package natsbroker

import (
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// BenchmarkToNATS builds the NATS message of a delivered message with three
// headers of its own, as every publish does: the allocations per message
// are the figure to watch.
func BenchmarkToNATS(b *testing.B) {
	m := sinks.Outgoing{Attempt: 1, Message: &envelope.Message{
		ID: "0f8fad5b-d9cb-469f-a165-70867728950e", DueAt: time.Now(), Destination: "fired.orders",
		Headers: envelope.Headers{{Key: "content-type", Value: "application/json"}, {Key: "trace", Value: "abc"}, {Key: "tenant", Value: "t1"}},
		Body:    make([]byte, 100),
	}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := toNATS(m); err != nil {
			b.Fatal(err)
		}
	}
}
