// Package destination holds the one set of rules for where delaybridge may
// publish a message: each sink broker's destination syntax (what a valid
// NATS subject, Kafka topic or RabbitMQ routing key is), the parts of the
// brokers' namespaces that a message never reaches unless its route names
// them (Reserved: NATS `$...` and `_INBOX.` subjects; Kafka `_...` topics
// and Kafka Connect's; RabbitMQ's `amq.` queues and exchanges; and what this
// daemon itself consumes, a loop), and the patterns of
// route.allowed_destinations, written in the sink broker's own wildcards.
//
// Every path that decides a destination calls Syntax.Check: ingest
// (envelope.Parse, for headers, templates and dialects alike), the admin
// API, a dead message's retry, import, and the scheduler once more right
// before it publishes, so that a message parked by any path, or by an older
// version, never reaches a control plane.
//
// Nothing in this package does I/O.
package destination

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Errors a Check can match (errors.Is).
var (
	// ErrInvalid: not a destination the sink's broker accepts (empty, a
	// control character, a wildcard in a NATS subject, a character Kafka
	// refuses in a topic, too long).
	ErrInvalid = errors.New("invalid destination")
	// ErrReserved: a part of the broker's namespace a message never reaches
	// (a control plane: JetStream, KV and system API subjects, inboxes,
	// Kafka's internal and Connect topics, RabbitMQ's amq. names; or a
	// source this daemon consumes) that no pattern of
	// route.allowed_destinations names literally. Its reason begins with
	// ReservedCode.
	ErrReserved = errors.New("reserved destination")
	// ErrNotAllowed: the publisher chose a destination that matches no
	// pattern of route.allowed_destinations.
	ErrNotAllowed = errors.New("destination not allowed")
)

// Error is the error of Check: one of the kinds above with the destination
// and a reason an operator can act on.
type Error struct {
	Kind   error // ErrInvalid, ErrReserved or ErrNotAllowed
	Dest   string
	Reason string
}

func (e *Error) Error() string        { return e.Reason }
func (e *Error) Is(target error) bool { return target == e.Kind }

// ReservedCode names the refusal of a reserved destination: the reason
// of an ErrReserved begins with it, and so does the reason a message dead
// for it keeps (envelope.CodeDestinationReserved is the same word).
const ReservedCode = "destination_reserved"

// Reserved is a part of a broker's namespace that a message never reaches
// unless a pattern of its route names it literally: every destination
// that begins with Prefix and, when Pattern is set, matches Pattern too.
// A pattern names it literally when it begins with Prefix itself, and
// with a literal token where Prefix is empty (a wildcard does not open it:
// `>` never reaches `$JS.API`, `#` no key of amq.topic).
type Reserved struct {
	Prefix string
	// Pattern, in the broker's wildcards, narrows the part to the
	// destinations it matches ("" for every one with Prefix): a topic this
	// daemon consumes (`orders-in`), the subjects of a NATS ingest
	// (`delayed.>`), the keys a RabbitMQ binding routes to its queue.
	Pattern string
	What    string // what lives there, for the reason and `validate`
	Example string // a pattern that names it, for the reason
}

// String is the part as `validate` lists it: its pattern, its prefix, or
// every destination and why.
func (r Reserved) String() string {
	switch {
	case r.Pattern != "":
		return strconv.Quote(r.Pattern)
	case r.Prefix == "":
		return "every one (" + r.What + ")"
	}
	return "beginning with " + strconv.Quote(r.Prefix)
}

// contains reports whether dest is in the part r of the namespace of s.
func (s Syntax) contains(r Reserved, dest string) bool {
	return strings.HasPrefix(dest, r.Prefix) && (r.Pattern == "" || s.Match(r.Pattern, dest))
}

// Reserve returns s with more reserved parts.
func (s Syntax) Reserve(rs ...Reserved) Syntax {
	s.Reserved = append(append([]Reserved{}, s.Reserved...), rs...)
	return s
}

// Syntax is how one broker names the destinations a sink publishes to.
type Syntax struct {
	// Noun names a destination of this broker in reasons ("NATS subject").
	Noun string
	// Reserved are the parts of the namespace a message never reaches
	// unless a pattern of the route names them literally.
	Reserved []Reserved

	// kind selects the wildcards of patterns and the validity rules.
	kind kind
}

type kind uint8

const (
	kindGeneric kind = iota
	kindNATS
	kindKafka
	kindRabbitMQ
)

// The syntaxes of the three brokers. A broker package's sink block returns
// its own (config.SinkBroker.Destinations).
var (
	// NATS: subjects are dot-separated tokens; in a pattern `*` is one
	// token and `>` one or more trailing tokens.
	NATS = Syntax{Noun: "NATS subject", kind: kindNATS, Reserved: []Reserved{
		{Prefix: "$", What: "the JetStream, KV, object store and system API", Example: "$KV.orders.>"},
		{Prefix: "_INBOX.", What: "request-reply inboxes", Example: "_INBOX.>"},
	}}
	// Kafka: topics of [a-zA-Z0-9._-], at most 249 bytes; in a pattern `*`
	// is any run of characters.
	Kafka = Syntax{Noun: "Kafka topic", kind: kindKafka, Reserved: []Reserved{
		{Prefix: "__", What: "Kafka's internal topics (__consumer_offsets, __transaction_state)", Example: "__audit-*"},
		{Prefix: "_", What: "the topics of Kafka's tools (Schema Registry's _schemas, Confluent's _confluent-*)", Example: "_audit-*"},
		connect("configs"), connect("offsets"), connect("status"),
	}}
	// RabbitMQ: routing keys of at most 255 bytes, dot-separated words; in a
	// pattern `*` is one word and `#` zero or more words (topic-exchange
	// rules). This is a sink on the default exchange, where a routing key
	// is a queue name; RabbitMQOn is the syntax of a sink on an exchange.
	RabbitMQ = Syntax{Noun: "RabbitMQ routing key", kind: kindRabbitMQ, Reserved: []Reserved{
		{Prefix: "amq.", What: "on the default exchange, a queue RabbitMQ names itself (amq.gen-*: another client's, amq.rabbitmq.reply-to.*: an RPC reply)",
			Example: "amq.rabbitmq.reply-to.#"},
	}}

	// Generic is for a sink whose broker is not known (a test's route): the
	// checks every broker shares, and every broker's reserved parts.
	Generic = Syntax{Noun: "destination", kind: kindGeneric,
		Reserved: slices.Concat(NATS.Reserved, Kafka.Reserved, RabbitMQ.Reserved)}
)

// connect is a default topic of Kafka Connect's distributed workers.
func connect(what string) Reserved {
	name := "connect-" + what
	return Reserved{Prefix: name, Pattern: name, What: "a topic of Kafka Connect's workers (their " + what + ")", Example: name}
}

// RabbitMQOn is the syntax of a RabbitMQ sink publishing on exchange: on
// the default exchange (""), RabbitMQ; on one of RabbitMQ's own exchanges
// (amq.topic, amq.direct...: what its plugins and other clients use), every
// routing key is reserved, and a route lists the ones it may publish there.
func RabbitMQOn(exchange string) Syntax {
	if exchange == "" {
		return RabbitMQ
	}
	s := RabbitMQ
	s.Reserved = nil
	if strings.HasPrefix(exchange, "amq.") {
		s.Reserved = []Reserved{{What: fmt.Sprintf("the sink publishes on %q, one of RabbitMQ's own exchanges (amq.*)", exchange), Example: "orders.#"}}
	}
	return s
}

// Wildcards are the characters that are wildcards in some broker's patterns
// (`*`, `>`, `#`): a template placeholder never expands to one.
const Wildcards = "*>#"

// Separator separates the tokens (words) of a destination.
const Separator = "."

// Check returns nil when a message may be published to dest through a sink
// of this syntax, under the route's allowed patterns; else an *Error.
// chosen says whether the publisher chose (part of) dest: a header, or a
// template placeholder; only then must dest match one of allowed (when
// allowed is not empty). A reserved part needs a matching pattern that
// names it literally (e.g. "$KV.orders.>"), whoever chose dest.
func (s Syntax) Check(dest string, allowed []string, chosen bool) error {
	if why := s.invalid(dest); why != "" {
		return &Error{Kind: ErrInvalid, Dest: dest, Reason: why}
	}
	for _, r := range s.Reserved {
		if !s.contains(r, dest) || s.namedLiterally(r.Prefix, dest, allowed) {
			continue
		}
		var where string
		switch {
		case r.Pattern != "":
			where = fmt.Sprintf("is in %q, %s", r.Pattern, r.What)
		case r.Prefix != "":
			where = fmt.Sprintf("begins with %q, %s", r.Prefix, r.What)
		default:
			where = "is reserved: " + r.What
		}
		name := r.Prefix
		if name == "" {
			name = "it"
		} else {
			name = strconv.Quote(name)
		}
		return &Error{Kind: ErrReserved, Dest: dest, Reason: fmt.Sprintf(
			"%s: %s %q %s: delaybridge never publishes there unless a pattern of route.allowed_destinations names %s literally (e.g. %q)",
			ReservedCode, s.Noun, Printable(dest), where, name, r.Example)}
	}
	if chosen && len(allowed) > 0 && !s.MatchAny(allowed, dest) {
		return &Error{Kind: ErrNotAllowed, Dest: dest, Reason: fmt.Sprintf(
			"%s %q matches no pattern of route.allowed_destinations", s.Noun, Printable(dest))}
	}
	return nil
}

// namedLiterally reports whether a pattern of allowed that matches dest
// begins with prefix; for a part without a prefix (every key of a RabbitMQ
// exchange of its own, a source of the form `*.in`), with a literal token:
// a bare wildcard (`#`, `*`, `>`) never opens a reserved part.
func (s Syntax) namedLiterally(prefix, dest string, allowed []string) bool {
	for _, p := range allowed {
		if strings.HasPrefix(p, prefix) && (prefix != "" || s.Consumed(p).Prefix != "") && s.Match(p, dest) {
			return true
		}
	}
	return false
}

// MatchAny reports whether dest matches one of patterns.
func (s Syntax) MatchAny(patterns []string, dest string) bool {
	for _, p := range patterns {
		if s.Match(p, dest) {
			return true
		}
	}
	return false
}

// Match reports whether dest matches pattern in the broker's wildcards:
// NATS `*` one token, `>` one or more trailing tokens; RabbitMQ `*` one
// word, `#` zero or more words; Kafka `*` any run of characters. Generic
// reads patterns as NATS does.
func (s Syntax) Match(pattern, dest string) bool {
	switch s.kind {
	case kindKafka:
		return globMatch(pattern, dest)
	case kindRabbitMQ:
		return topicMatch(strings.Split(pattern, Separator), strings.Split(dest, Separator))
	}
	return subjectMatch(strings.Split(pattern, Separator), strings.Split(dest, Separator))
}

// Consumed is the part of this broker's namespace that a pattern of its
// own wildcards reads (an ingest's subject, topic, queue or binding key):
// a Reserved with Pattern and Example the pattern and Prefix its literal
// beginning, up to its first wildcard (Kafka: `*`; NATS and RabbitMQ: a
// wildcard token). What is left to the caller.
func (s Syntax) Consumed(pattern string) Reserved {
	prefix := pattern
	if s.kind == kindKafka {
		prefix, _, _ = strings.Cut(pattern, "*")
	} else {
		var lit []string
		for _, t := range strings.Split(pattern, Separator) {
			if t == "*" || t == ">" || t == "#" {
				lit = append(lit, "") // ends the literal part with a separator
				break
			}
			lit = append(lit, t)
		}
		prefix = strings.Join(lit, Separator)
	}
	return Reserved{Prefix: prefix, Pattern: pattern, Example: pattern}
}

// CheckPattern returns why pattern is not a pattern of this syntax, or "":
// a NATS `>` that is not the last token, or a wildcard inside a token
// (`orders*`), which NATS and RabbitMQ read as a literal character.
func (s Syntax) CheckPattern(pattern string) string {
	if pattern == "" {
		return "a pattern is empty"
	}
	if s.kind == kindKafka {
		return ""
	}
	wild := "*>"
	if s.kind == kindRabbitMQ {
		wild = "*#"
	}
	tokens := strings.Split(pattern, Separator)
	for i, t := range tokens {
		if t == "" {
			return fmt.Sprintf("%q has an empty token (two dots, or a dot at an end)", pattern)
		}
		if len(t) > 1 && strings.ContainsAny(t, wild) {
			return fmt.Sprintf("%q: in a %s pattern a wildcard is a whole token (%q matches itself only); write e.g. %q",
				pattern, s.Noun, t, strings.Join(append(append([]string{}, tokens[:i]...), "*"), Separator))
		}
		if s.kind != kindRabbitMQ && t == ">" && i != len(tokens)-1 {
			return fmt.Sprintf("%q: > matches the trailing tokens and must be the last token", pattern)
		}
	}
	return ""
}

// CheckToken returns why v cannot be one token of a destination (what a
// template placeholder other than {source.N:} expands to), or "": it must
// not be empty, and must not hold the separator, a wildcard, white space or
// a control character.
func CheckToken(v string) string {
	switch {
	case v == "":
		return "is empty"
	case strings.Contains(v, Separator):
		return fmt.Sprintf("%q holds the separator %q: it would add tokens", Printable(v), Separator)
	case strings.ContainsAny(v, Wildcards):
		return fmt.Sprintf("%q holds a wildcard (%s)", Printable(v), strings.Join(strings.Split(Wildcards, ""), " "))
	}
	for _, c := range v {
		if unicode.IsSpace(c) || unicode.IsControl(c) {
			return fmt.Sprintf("%q holds white space or a control character", Printable(v))
		}
	}
	if !utf8.ValidString(v) {
		return fmt.Sprintf("%q is not UTF-8", Printable(v))
	}
	return ""
}

// CheckTokens is CheckToken for each dot-separated token of v (what
// {source} and {source.N:} expand to): several tokens, none of them empty
// or holding a wildcard, white space or a control character.
func CheckTokens(v string) string {
	if v == "" {
		return "is empty"
	}
	for _, t := range strings.Split(v, Separator) {
		if why := CheckToken(t); why != "" {
			if t == "" {
				return fmt.Sprintf("%q has an empty token", Printable(v))
			}
			return why
		}
	}
	return ""
}

// invalid returns why dest is not valid for the broker, or "".
func (s Syntax) invalid(dest string) string {
	switch {
	case strings.TrimSpace(dest) == "":
		return "destination is empty"
	case !utf8.ValidString(dest):
		return fmt.Sprintf("destination is not UTF-8 (not printable): %q", Printable(dest))
	}
	for _, c := range dest {
		if c < 0x20 || c == 0x7f {
			return fmt.Sprintf("destination contains a control character such as NUL, CR or LF (not printable): %q", Printable(dest))
		}
	}
	switch s.kind {
	case kindNATS:
		for rest := dest; ; {
			t, tail, more := strings.Cut(rest, Separator)
			switch {
			case t == "":
				return fmt.Sprintf("NATS subject %q has an empty token (two dots, or a dot at an end)", Printable(dest))
			case t == "*" || t == ">":
				return fmt.Sprintf("NATS subject %q holds the wildcard %q: a message is published to one subject", Printable(dest), t)
			case strings.ContainsFunc(t, unicode.IsSpace):
				return fmt.Sprintf("NATS subject %q holds white space", Printable(dest))
			}
			if !more {
				break
			}
			rest = tail
		}
	case kindKafka:
		if len(dest) > maxKafkaTopic {
			return fmt.Sprintf("Kafka topic %q is %d bytes, over Kafka's %d", Printable(dest), len(dest), maxKafkaTopic)
		}
		if dest == "." || dest == ".." {
			return fmt.Sprintf("Kafka topic %q is not a topic name", dest)
		}
		for _, c := range dest {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
				return fmt.Sprintf("Kafka topic %q holds %q: a topic name has only letters, digits, '.', '_' and '-'", Printable(dest), c)
			}
		}
	case kindRabbitMQ:
		if len(dest) > maxRoutingKey {
			return fmt.Sprintf("RabbitMQ routing key %q is %d bytes, over AMQP's %d", Printable(dest), len(dest), maxRoutingKey)
		}
	}
	return ""
}

const (
	maxKafkaTopic = 249 // Kafka's limit of a topic name
	maxRoutingKey = 255 // an AMQP short string
)

// subjectMatch is NATS subject matching of tokens.
func subjectMatch(p, d []string) bool {
	for i, t := range p {
		switch {
		case t == ">":
			return i == len(p)-1 && len(d) > i
		case i >= len(d):
			return false
		case t != "*" && t != d[i]:
			return false
		}
	}
	return len(p) == len(d)
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

// Printable quotes at most 64 bytes of a value for a reason, so that a
// reason stays readable and bounded whatever the value was.
func Printable(v string) string {
	if len(v) > 64 {
		v = v[:64] + "..."
	}
	if !utf8.ValidString(v) {
		return strings.ToValidUTF8(v, "\uFFFD")
	}
	return v
}

// Sinks maps configured sink names to their destination syntax.
type Sinks map[string]Syntax

// Lookup returns the syntax of the sink name, false when none has that
// name (the shape of envelope.Route.Sinks).
func (s Sinks) Lookup(name string) (Syntax, bool) {
	syn, ok := s[name]
	return syn, ok
}
