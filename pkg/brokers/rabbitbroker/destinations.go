package rabbitbroker

import (
	"fmt"
	"strings"

	"github.com/delaybridge/delaybridge/pkg/destination"
)

// Destinations is the syntax of RabbitMQ routing keys on the default
// exchange, where a routing key is a queue name: keys of at most 255 bytes,
// dot-separated words; in a pattern `*` is one word and `#` zero or more
// words (topic-exchange rules). DestinationsOn is the syntax of a sink on
// an exchange.
var Destinations = destination.Syntax{
	Noun: "RabbitMQ routing key",
	Reserved: []destination.Reserved{
		{Prefix: "amq.", What: "on the default exchange, a queue RabbitMQ names itself (amq.gen-*: another client's, amq.rabbitmq.reply-to.*: an RPC reply)",
			Example: "amq.rabbitmq.reply-to.#"},
	},
	Invalid:  invalidKey,
	Patterns: topics{},
}

// DestinationsOn is the syntax of a sink publishing on exchange: on the
// default exchange (""), Destinations; on one of RabbitMQ's own exchanges
// (amq.topic, amq.direct...: what its plugins and other clients use),
// every routing key is reserved, and a route lists the ones it may publish
// there.
func DestinationsOn(exchange string) destination.Syntax {
	if exchange == "" {
		return Destinations
	}
	s := Destinations
	s.Reserved = nil
	if strings.HasPrefix(exchange, "amq.") {
		s.Reserved = []destination.Reserved{{What: fmt.Sprintf("the sink publishes on %q, one of RabbitMQ's own exchanges (amq.*)", exchange), Example: "orders.#"}}
	}
	return s
}

const maxRoutingKey = 255 // an AMQP short string

// invalidKey returns why dest is not a routing key, or "".
func invalidKey(dest string) string {
	if len(dest) > maxRoutingKey {
		return fmt.Sprintf("RabbitMQ routing key %q is %d bytes, over AMQP's %d", destination.Printable(dest), len(dest), maxRoutingKey)
	}
	return ""
}

// topics are the wildcards of a topic exchange's binding keys: `*` is one
// word and `#` zero or more words.
type topics struct{}

func (topics) Match(pattern, dest string) bool {
	return topicMatch(strings.Split(pattern, destination.Separator), strings.Split(dest, destination.Separator))
}

// Literal is the words before the first wildcard; before a `#` without
// the separator, since `#` matches no word too (`orders.#` matches
// `orders`).
func (topics) Literal(pattern string) string {
	lit := destination.LiteralTokens(pattern)
	if strings.HasPrefix(pattern[len(lit):], "#") {
		return strings.TrimSuffix(lit, destination.Separator)
	}
	return lit
}

// Check refuses a wildcard inside a word; `#` may be anywhere.
func (topics) Check(noun, pattern string) string {
	return destination.CheckTokenPattern(noun, pattern, "*#", "")
}

// topicMatch is RabbitMQ topic-exchange matching of words.
func topicMatch(p, d []string) bool {
	if len(p) == 0 {
		return len(d) == 0
	}
	switch p[0] {
	case "#":
		for i := 0; i <= len(d); i++ {
			if topicMatch(p[1:], d[i:]) {
				return true
			}
		}
		return false
	case "*":
		return len(d) > 0 && topicMatch(p[1:], d[1:])
	}
	return len(d) > 0 && p[0] == d[0] && topicMatch(p[1:], d[1:])
}
