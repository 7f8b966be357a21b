// Package destination holds the one set of rules for where delaybridge may
// publish a message: what every broker's destinations share (not empty,
// UTF-8, no control character), the parts of a broker's namespace that a
// message never reaches unless its route names them (Reserved: a control
// plane such as NATS `$...` subjects, Kafka `_...` topics or RabbitMQ's
// `amq.` queues; and what this daemon itself consumes, a loop), and the
// patterns of route.allowed_destinations, written in the sink broker's own
// wildcards.
//
// Each broker package defines its Syntax beside its sink block (its noun,
// its reserved parts, its own validity rule and its wildcards) and returns
// it from config.SinkBroker.Destinations; this package knows no broker by
// name.
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
// `>` never reaches `$JS.API`, `#` no key of amq.topic). A part with a
// Pattern and no Prefix (what an ingest reads through a pattern that
// begins with a wildcard, `*.in`) is named only by the destination itself
// or by that pattern: `out.>` reaches `out.in` among others, and names
// nothing of `*.in`.
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
// A broker package defines its own (config.SinkBroker.Destinations).
type Syntax struct {
	// Noun names a destination of this broker in reasons ("NATS subject").
	Noun string
	// Reserved are the parts of the namespace a message never reaches
	// unless a pattern of the route names them literally.
	Reserved []Reserved
	// Invalid returns why dest is not a destination of the broker, or "":
	// the broker's own rules, checked after the ones every broker shares
	// (not empty, UTF-8, no control character). nil: none of its own.
	Invalid func(dest string) string
	// Patterns are the wildcards of the broker's patterns; nil reads them
	// as NATS does (Subjects).
	Patterns Patterns
}

// Patterns are a broker's wildcards, in the patterns of
// route.allowed_destinations and in what an ingest reads.
type Patterns interface {
	// Match reports whether dest matches pattern.
	Match(pattern, dest string) bool
	// Literal returns the literal beginning of pattern, up to its first
	// wildcard: every destination pattern matches begins with it.
	Literal(pattern string) string
	// Check returns why pattern (not empty) is not a pattern of these
	// wildcards, or "". noun names a destination in the reason.
	Check(noun, pattern string) string
}

// patterns returns the wildcards of s.
func (s Syntax) patterns() Patterns {
	if s.Patterns == nil {
		return Subjects{}
	}
	return s.Patterns
}

// generic is Generic's syntax, with the reserved parts of every broker
// given to RegisterBroker.
var generic = Syntax{Noun: "destination"}

// RegisterBroker adds the reserved parts of a broker's syntax to Generic's.
// config.RegisterBroker calls it for every broker of the build, in the
// order of the registry (pkg/brokers), at init.
func RegisterBroker(s Syntax) {
	generic.Reserved = append(generic.Reserved, s.Reserved...)
}

// Generic is the syntax for a sink whose broker is not known (a test's
// route): the checks every broker shares, the wildcards of Subjects, and
// the reserved parts of every registered broker.
func Generic() Syntax {
	s := generic
	s.Reserved = slices.Clip(s.Reserved) // an append by the caller copies
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
		if !s.contains(r, dest) || s.namedLiterally(r, dest, allowed) {
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
// names the reserved part r literally (Reserved): it begins with r.Prefix;
// for a part without a prefix, it begins with a literal token (a bare
// wildcard, `#`, `*`, `>`, never opens a reserved part), and for one with
// a pattern it is dest itself or that pattern.
func (s Syntax) namedLiterally(r Reserved, dest string, allowed []string) bool {
	for _, p := range allowed {
		switch {
		case !s.Match(p, dest):
		case r.Prefix != "":
			if strings.HasPrefix(p, r.Prefix) {
				return true
			}
		case r.Pattern != "":
			if p == dest || (p == r.Pattern && literalToken(p)) {
				return true
			}
		case s.Consumed(p).Prefix != "":
			return true
		}
	}
	return false
}

// literalToken reports whether a pattern has a token that is not a
// wildcard (`*.in` has, `*.>` has not).
func literalToken(pattern string) bool {
	for _, t := range strings.Split(pattern, Separator) {
		if t != "" && !strings.ContainsAny(t, Wildcards) {
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

// Match reports whether dest matches pattern in the broker's wildcards
// (Syntax.Patterns).
func (s Syntax) Match(pattern, dest string) bool {
	return s.patterns().Match(pattern, dest)
}

// Consumed is the part of this broker's namespace that a pattern of its
// own wildcards reads (an ingest's subject, topic, queue or binding key):
// a Reserved with Pattern and Example the pattern and Prefix its literal
// beginning, up to its first wildcard (Patterns.Literal). What is left to
// the caller.
func (s Syntax) Consumed(pattern string) Reserved {
	return Reserved{Prefix: s.patterns().Literal(pattern), Pattern: pattern, Example: pattern}
}

// CheckPattern returns why pattern is not a pattern of this syntax, or "":
// it is empty, or its broker's wildcards refuse it (Patterns.Check).
func (s Syntax) CheckPattern(pattern string) string {
	if pattern == "" {
		return "a pattern is empty"
	}
	return s.patterns().Check(s.Noun, pattern)
}

// Subjects are the wildcards of dot-separated tokens where `*` is one
// token and `>` one or more trailing tokens: NATS's, and those of a Syntax
// without Patterns.
type Subjects struct{}

// Match is NATS subject matching.
func (Subjects) Match(pattern, dest string) bool {
	return subjectMatch(strings.Split(pattern, Separator), strings.Split(dest, Separator))
}

// Literal returns LiteralTokens(pattern).
func (Subjects) Literal(pattern string) string { return LiteralTokens(pattern) }

// Check refuses a wildcard inside a token and a `>` that is not the last
// token (CheckTokenPattern).
func (Subjects) Check(noun, pattern string) string {
	return CheckTokenPattern(noun, pattern, "*>", ">")
}

// LiteralTokens returns the tokens of pattern before its first wildcard
// token (a token that is one of Wildcards), ending with the separator; the
// whole pattern when no token is a wildcard.
func LiteralTokens(pattern string) string {
	var lit []string
	for _, t := range strings.Split(pattern, Separator) {
		if t == "*" || t == ">" || t == "#" {
			lit = append(lit, "") // ends the literal part with a separator
			break
		}
		lit = append(lit, t)
	}
	return strings.Join(lit, Separator)
}

// CheckTokenPattern returns why pattern is not a pattern of dot-separated
// tokens whose wildcards (the characters of wild) are whole tokens, or "":
// an empty token, a wildcard inside a token (`orders*`, which the broker
// reads as a literal character), or last (a wildcard that matches the
// trailing tokens, "" for none) anywhere but at the end. noun names a
// destination in the reason.
func CheckTokenPattern(noun, pattern, wild, last string) string {
	tokens := strings.Split(pattern, Separator)
	for i, t := range tokens {
		if t == "" {
			return fmt.Sprintf("%q has an empty token (two dots, or a dot at an end)", pattern)
		}
		if len(t) > 1 && strings.ContainsAny(t, wild) {
			return fmt.Sprintf("%q: in a %s pattern a wildcard is a whole token (%q matches itself only); write e.g. %q",
				pattern, noun, t, strings.Join(append(append([]string{}, tokens[:i]...), "*"), Separator))
		}
		if last != "" && t == last && i != len(tokens)-1 {
			return fmt.Sprintf("%q: %s matches the trailing tokens and must be the last token", pattern, last)
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
// {source.N:} expands to): several tokens, none of them empty
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
	if s.Invalid != nil {
		return s.Invalid(dest)
	}
	return ""
}

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
