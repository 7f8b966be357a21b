package envelope

import (
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/pkg/destination"
)

// TestControlPlaneRefused: a publisher who may choose a destination must
// not reach the JetStream API with the daemon's own credentials, through a
// header, a forwarding template or a kafka-scheduler record. Each of those
// is dead at ingest with destination_reserved, whatever
// allowed_destinations says short of naming the prefix.
func TestControlPlaneRefused(t *testing.T) {
	sinks := destination.Sinks{"nats": SyntaxNATS, "kafka": SyntaxKafka, "rabbit": SyntaxRabbitMQ}.Lookup
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	lim := Limits{MaxDelay: 24 * time.Hour, MaxIDBytes: 256}
	for _, c := range []struct {
		name  string
		route Route
		in    Incoming
	}{
		{"header override", Route{Sink: "nats", Destination: "fired.x", AllowOverride: true},
			Incoming{Headers: hdrs(HeaderDelay, "1", HeaderDestination, "$JS.API.STREAM.DELETE.VICTIM")}},
		{"header override, purge", Route{Sink: "nats", Destination: "fired.x", AllowOverride: true},
			Incoming{Headers: hdrs(HeaderDelay, "1", HeaderDestination, "$JS.API.STREAM.PURGE.V2")}},
		{"forwarding template from the subject", Route{Sink: "nats", Destination: "{source.4:}"},
			Incoming{Headers: hdrs(HeaderDelay, "1"), Source: "delayed.fwd.x.$JS.API.STREAM.DELETE.VICTIM"}},
		{"template from a header", Route{Sink: "nats", Destination: "{header.t}.x"},
			Incoming{Headers: hdrs(HeaderDelay, "1", "t", "$JS")}},
		{"inbox", Route{Sink: "nats", Destination: "fired.x", AllowOverride: true, AllowedDestinations: []string{">"}},
			Incoming{Headers: hdrs(HeaderDelay, "1", HeaderDestination, "_INBOX.abc")}},
		{"config.example schedules-in, to a nats sink", Route{Sink: "kafka", Destination: "unscheduled", AllowOverride: true,
			AllowedDestinations: []string{"*"}, Dialects: []Dialect{DialectKafkaScheduler}},
			Incoming{Key: []byte("k1"), Body: []byte("b"), Headers: hdrs(HeaderSchedulerEpoch, "1796119200",
				HeaderSchedulerTargetTopic, "$JS.API.STREAM.DELETE.X", HeaderSink, "nats")}},
		{"kafka internal topic", Route{Sink: "kafka", Destination: "x", AllowOverride: true, AllowedDestinations: []string{"*"}},
			Incoming{Headers: hdrs(HeaderDelay, "1", HeaderDestination, "__consumer_offsets")}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := c.route
			r.Ingest, r.Sinks = "in", sinks
			d := Parse(&c.in, &r, lim, now, nil)
			if d.Action != Reject || CodeOf(d.Err) != CodeDestinationReserved {
				t.Fatalf("%v %s %q, want a reject with %s", d.Action, CodeOf(d.Err), why(d), CodeDestinationReserved)
			}
		})
	}
	// Named literally, a control plane is reachable: a KV bucket.
	r := Route{Ingest: "in", Sinks: sinks, Sink: "nats", Destination: "x", AllowOverride: true, AllowedDestinations: []string{"$KV.orders.>"}}
	d := Parse(&Incoming{Headers: hdrs(HeaderDelay, "1", HeaderDestination, "$KV.orders.k1")}, &r, lim, now, nil)
	if d.Action != Park || d.Message.Destination != "$KV.orders.k1" {
		t.Fatalf("$KV.orders.> named: %v %q", d.Action, why(d))
	}
}
