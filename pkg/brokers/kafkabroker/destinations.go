package kafkabroker

import (
	"fmt"
	"strings"

	"github.com/delaybridge/delaybridge/pkg/destination"
)

// Destinations is the syntax of Kafka topics, what a sink publishes to
// (SinkConfig.Destinations) and an ingest reads: names of [a-zA-Z0-9._-],
// at most 249 bytes; in a pattern `*` is any run of characters.
var Destinations = destination.Syntax{
	Noun: "Kafka topic",
	Reserved: []destination.Reserved{
		{Prefix: "__", What: "Kafka's internal topics (__consumer_offsets, __transaction_state)", Example: "__audit-*"},
		{Prefix: "_", What: "the topics of Kafka's tools (Schema Registry's _schemas, Confluent's _confluent-*)", Example: "_audit-*"},
		connect("configs"), connect("offsets"), connect("status"),
	},
	Invalid:  invalidTopic,
	Patterns: globs{},
}

// connect is a default topic of Kafka Connect's distributed workers.
func connect(what string) destination.Reserved {
	name := "connect-" + what
	return destination.Reserved{Prefix: name, Pattern: name, What: "a topic of Kafka Connect's workers (their " + what + ")", Example: name}
}

const maxTopic = 249 // Kafka's limit of a topic name

// invalidTopic returns why dest is not a topic name Kafka accepts, or "".
func invalidTopic(dest string) string {
	if len(dest) > maxTopic {
		return fmt.Sprintf("Kafka topic %q is %d bytes, over Kafka's %d", destination.Printable(dest), len(dest), maxTopic)
	}
	if dest == "." || dest == ".." {
		return fmt.Sprintf("Kafka topic %q is not a topic name", dest)
	}
	for _, c := range dest {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Sprintf("Kafka topic %q holds %q: a topic name has only letters, digits, '.', '_' and '-'", destination.Printable(dest), c)
		}
	}
	return ""
}

// globs are the wildcards of Kafka topic patterns: `*` is any run of
// characters, and every pattern is one.
type globs struct{}

func (globs) Match(pattern, dest string) bool { return globMatch(pattern, dest) }

// Literal is what precedes the first `*`.
func (globs) Literal(pattern string) string {
	prefix, _, _ := strings.Cut(pattern, "*")
	return prefix
}

func (globs) Check(_, _ string) string { return "" }

// globMatch matches s against p, where `*` is any run of characters.
func globMatch(p, s string) bool {
	star, mark := -1, 0
	i, j := 0, 0
	for j < len(s) {
		switch {
		case i < len(p) && p[i] == '*':
			star, mark = i, j
			i++
		case i < len(p) && p[i] == s[j]:
			i++
			j++
		case star >= 0:
			i, mark = star+1, mark+1
			j = mark
		default:
			return false
		}
	}
	for i < len(p) && p[i] == '*' {
		i++
	}
	return i == len(p)
}
