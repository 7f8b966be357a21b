package natsbroker

import (
	"fmt"
	"strings"
	"unicode"

	"github.com/delaybridge/delaybridge/pkg/destination"
)

// Destinations is the syntax of NATS subjects, what a sink publishes to
// (SinkConfig.Destinations) and an ingest reads: dot-separated tokens; in a
// pattern `*` is one token and `>` one or more trailing tokens
// (destination.Subjects).
var Destinations = destination.Syntax{
	Noun: "NATS subject",
	Reserved: []destination.Reserved{
		{Prefix: "$", What: "the JetStream, KV, object store and system API", Example: "$KV.orders.>"},
		{Prefix: "_INBOX.", What: "request-reply inboxes", Example: "_INBOX.>"},
	},
	Invalid:  invalidSubject,
	Patterns: destination.Subjects{},
}

// maxSubject is the longest subject a sink publishes to. nats-server
// answers a protocol line longer than its max_control_line (4,096 bytes
// unless configured) with an error and closes the connection, which
// nats.go then never reopens; a publish's line holds, besides the subject,
// its verb, a reply inbox (JetStream) and two sizes, for which 256 bytes
// are kept.
const maxSubject = 4096 - 256

// invalidSubject returns why dest is not a subject a message is published
// to, or "": too long (maxSubject), an empty token, a wildcard token, white
// space.
func invalidSubject(dest string) string {
	if len(dest) > maxSubject {
		return fmt.Sprintf("NATS subject %q is %d bytes, over the %d a publish's protocol line has room for (nats-server's max_control_line is 4096 by default)", destination.Printable(dest), len(dest), maxSubject)
	}
	for rest := dest; ; {
		t, tail, more := strings.Cut(rest, destination.Separator)
		switch {
		case t == "":
			return fmt.Sprintf("NATS subject %q has an empty token (two dots, or a dot at an end)", destination.Printable(dest))
		case t == "*" || t == ">":
			return fmt.Sprintf("NATS subject %q holds the wildcard %q: a message is published to one subject", destination.Printable(dest), t)
		case strings.ContainsFunc(t, unicode.IsSpace):
			return fmt.Sprintf("NATS subject %q holds white space", destination.Printable(dest))
		}
		if !more {
			return ""
		}
		rest = tail
	}
}
