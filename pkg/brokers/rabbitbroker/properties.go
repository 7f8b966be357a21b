package rabbitbroker

import (
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// The AMQP basic properties a RabbitMQ ingest keeps (envelope.Message
// Properties) and a RabbitMQ sink publishes back, as RabbitMQ's delayed
// exchange kept them. Each is named by the header a Kafka or NATS sink
// publishes it as (sinks.PropertyHeaders); its Value is that header's
// value. Not kept: message_id (the message ID goes out as message_id),
// delivery_mode (a sink publishes persistent), headers (they are the
// headers).
const (
	PropContentType     = "content-type"
	PropContentEncoding = "content-encoding"
	PropCorrelationID   = "correlation-id"
	PropReplyTo         = "reply-to"
	PropExpiration      = "expiration" // per-message TTL in milliseconds, a decimal string
	PropPriority        = "priority"   // decimal; Native: the byte, as the B field type
	PropType            = "type"
	PropAppID           = "app-id"
	// PropUserID is published back only by a sink that connects as that
	// user: RabbitMQ closes the channel of a publish whose user_id is not
	// the connection's user.
	PropUserID = "user-id"
	// PropTimestamp is RFC 3339 in UTC (AMQP timestamps have whole
	// seconds); Native: the T field type.
	PropTimestamp = "timestamp"
)

// Properties returns the kept properties of an AMQP delivery, in a fixed
// order. AMQP cannot tell an absent property from an empty one (or priority
// 0, a zero timestamp), so those are left out.
func Properties(d amqp.Delivery) envelope.Headers {
	var out envelope.Headers
	add := func(k, v string) {
		if v != "" {
			out = append(out, envelope.Header{Key: k, Value: v})
		}
	}
	add(PropContentType, d.ContentType)
	add(PropContentEncoding, d.ContentEncoding)
	add(PropCorrelationID, d.CorrelationId)
	add(PropReplyTo, d.ReplyTo)
	add(PropExpiration, d.Expiration)
	if d.Priority != 0 {
		native, _ := encodeNative(d.Priority)
		out = append(out, envelope.Header{Key: PropPriority, Value: strconv.Itoa(int(d.Priority)), Native: native})
	}
	add(PropType, d.Type)
	add(PropAppID, d.AppId)
	add(PropUserID, d.UserId)
	if !d.Timestamp.IsZero() {
		native, _ := encodeNative(d.Timestamp)
		out = append(out, envelope.Header{Key: PropTimestamp, Value: d.Timestamp.UTC().Format(time.RFC3339), Native: native})
	}
	return out
}

// setProperties sets the properties of pub from props. user is the user the
// sink's connection logs in as ("" when unknown: SASL EXTERNAL), the only
// user_id it may publish. A property it does not know, or whose value does
// not parse, is left out rather than failing the message.
func setProperties(pub *amqp.Publishing, props envelope.Headers, user string) {
	for _, p := range props {
		switch p.Key {
		case PropContentType:
			pub.ContentType = p.Value
		case PropContentEncoding:
			pub.ContentEncoding = p.Value
		case PropCorrelationID:
			pub.CorrelationId = p.Value
		case PropReplyTo:
			pub.ReplyTo = p.Value
		case PropExpiration:
			pub.Expiration = p.Value
		case PropPriority:
			if v, ok := tableValue(p).(uint8); ok {
				pub.Priority = v
			} else if n, err := strconv.ParseUint(p.Value, 10, 8); err == nil {
				pub.Priority = uint8(n)
			}
		case PropType:
			pub.Type = p.Value
		case PropAppID:
			pub.AppId = p.Value
		case PropUserID:
			if user != "" && p.Value == user {
				pub.UserId = p.Value
			}
		case PropTimestamp:
			if v, ok := tableValue(p).(time.Time); ok {
				pub.Timestamp = v
			} else if t, err := time.Parse(time.RFC3339, p.Value); err == nil {
				pub.Timestamp = t
			}
		}
	}
}
