package sinks

import "github.com/delaybridge/delaybridge/pkg/envelope"

// PropertyHeaders returns m.Properties as headers, for a sink whose broker
// has no fields of its own for them (Kafka, NATS): each property becomes a
// header named by its key with its string value (a RabbitMQ ingest's
// content_type becomes content-type, ...), unless a forwarded header of that
// name (compared case-insensitively) already exists: the sender's own header
// wins.
func PropertyHeaders(m *envelope.Message) envelope.Headers {
	if len(m.Properties) == 0 {
		return nil
	}
	out := make(envelope.Headers, 0, len(m.Properties))
	for _, p := range m.Properties {
		if _, taken := m.Headers.Get(p.Key); taken || envelope.IsControlHeader(p.Key) {
			continue
		}
		out = append(out, envelope.Header{Key: p.Key, Value: p.Value})
	}
	return out
}
