package envelope_test

import (
	"fmt"
	"time"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

func ExampleParse() {
	in := &envelope.Incoming{
		Headers: envelope.Headers{
			{Key: "X-Delay", Value: "5000"},
			{Key: "x-message-id", Value: "order-42"},
			{Key: "content-type", Value: "application/json"},
		},
		Body: []byte(`{"order":42}`),
	}
	route := &envelope.Route{Ingest: "orders-in", Sink: "rabbit", Destination: "orders.expired"}
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

	d := envelope.Parse(in, route, envelope.Limits{MaxDelay: 24 * time.Hour, MaxPayloadBytes: 1 << 20, MaxHeaderBytes: 64 << 10, MaxIDBytes: 256}, now, nil)
	m := d.Message
	fmt.Println("action:", d.Action)
	fmt.Println("id:", m.ID)
	fmt.Println("due:", envelope.FormatTime(m.DueAt))
	fmt.Println("to:", m.Sink, m.Destination)
	fmt.Println("body:", string(m.Body))
	for _, h := range m.OutHeaders(1) {
		fmt.Printf("header %s: %s\n", h.Key, h.Value)
	}
	// Output:
	// action: park
	// id: order-42
	// due: 2026-12-01T10:00:05.000Z
	// to: rabbit orders.expired
	// body: {"order":42}
	// header content-type: application/json
	// header x-message-id: order-42
	// header x-delaybridge-due-at: 2026-12-01T10:00:05.000Z
	// header x-delaybridge-attempt: 1
}
