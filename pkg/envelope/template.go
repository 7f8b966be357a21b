package envelope

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/delaybridge/delaybridge/pkg/destination"
)

// Template is a destination with placeholders, expanded per message at
// ingest (route.destination, x-delay-destination):
//
//	{source}        the ingest message's own name (Incoming.Source: NATS
//	                subject, AMQP routing key, Kafka topic)
//	{source.N}      its N-th dot-separated token, from 1
//	{source.N:}     tokens N..last, joined by dots
//	{header.NAME}   the value of header NAME (case-insensitive; given more than once, with one value)
//	{{ and }}       a literal { and }
//
// Anything else in braces is an error of ParseTemplate, which `delaybridge
// validate` reports for route.destination. A placeholder that names what the
// message does not have (a token past the last, a missing header) is an
// error of Expand: the message is rejected with that reason.
type Template struct {
	raw   string
	parts []tmplPart
}

type tmplKind uint8

const (
	tmplLiteral tmplKind = iota
	tmplSource           // {source}
	tmplToken            // {source.N}
	tmplTail             // {source.N:}
	tmplHeader           // {header.NAME}
)

type tmplPart struct {
	kind tmplKind
	text string // literal text, or the header name
	n    int    // token number, from 1
}

// ParseTemplate parses a destination template. A string without braces is
// a literal template: Expand returns it as it is.
func ParseTemplate(s string) (*Template, error) {
	t := &Template{raw: s}
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			t.parts = append(t.parts, tmplPart{kind: tmplLiteral, text: lit.String()})
			lit.Reset()
		}
	}
	var bad []string // the placeholders that are wrong (maxNamed), named in one error
	more := 0        // and how many more
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '{' && i+1 < len(s) && s[i+1] == '{':
			lit.WriteByte('{')
			i++
		case c == '}' && i+1 < len(s) && s[i+1] == '}':
			lit.WriteByte('}')
			i++
		case c == '}':
			return nil, errors.New(strings.Join(append(bad, fmt.Sprintf("a lone } at byte %d (write }} for a literal brace)", i)), "; "))
		case c == '{':
			end := strings.IndexByte(s[i:], '}')
			if end < 0 {
				return nil, errors.New(strings.Join(append(bad, fmt.Sprintf("unclosed { at byte %d (write {{ for a literal brace)", i)), "; "))
			}
			part, err := parsePlaceholder(s[i+1 : i+end])
			switch {
			case err == nil:
			case len(bad) < maxNamed:
				bad = append(bad, err.Error())
			default:
				more++
			}
			flush()
			t.parts = append(t.parts, part)
			i += end
		default:
			lit.WriteByte(c)
		}
	}
	if more > 0 {
		bad = append(bad, fmt.Sprintf("and %d more", more))
	}
	if len(bad) > 0 {
		return nil, errors.New(strings.Join(bad, "; "))
	}
	flush()
	return t, nil
}

// maxNamed is how many wrong placeholders an error names, so that it
// stays short (an error answer quotes at most 256 bytes of a request).
const maxNamed = 2

func parsePlaceholder(p string) (tmplPart, error) {
	const known = "{source}, {source.N}, {source.N:} or {header.NAME}"
	switch {
	case p == "source":
		return tmplPart{kind: tmplSource}, nil
	case strings.HasPrefix(p, "source."):
		num, tail := strings.CutSuffix(p[len("source."):], ":")
		n, err := strconv.Atoi(num)
		if err != nil || n < 1 || num[0] == '+' {
			return tmplPart{}, fmt.Errorf("placeholder %q: the token number must be an integer from 1 (%s)", "{"+printable(p)+"}", known)
		}
		if tail {
			return tmplPart{kind: tmplTail, n: n}, nil
		}
		return tmplPart{kind: tmplToken, n: n}, nil
	case strings.HasPrefix(p, "header."):
		name := p[len("header."):]
		if name == "" || strings.IndexFunc(name, func(c rune) bool { return c <= ' ' || c == 0x7f || c == '{' }) >= 0 {
			return tmplPart{}, fmt.Errorf("placeholder %q: a header name is required, without spaces or control characters (%s)", "{"+printable(p)+"}", known)
		}
		return tmplPart{kind: tmplHeader, text: name}, nil
	}
	return tmplPart{}, fmt.Errorf("unknown placeholder %q: use %s, or {{ }} for literal braces", "{"+printable(p)+"}", known)
}

// String returns the template as it was written.
func (t *Template) String() string { return t.raw }

// Literal reports whether the template has no placeholder.
func (t *Template) Literal() bool {
	for _, p := range t.parts {
		if p.kind != tmplLiteral {
			return false
		}
	}
	return true
}

// Expand fills the placeholders from the message's source name and
// headers. It returns the reason when a placeholder names what the message
// does not have, or expands to what is not one token: every placeholder but
// {source.N:} expands to exactly one token (destination.CheckToken: not
// empty, no separator, wildcard, white space or control character), and
// that one to tokens that each are one (destination.CheckTokens). Whether the result is a valid destination for
// its sink is destination.Syntax.Check's concern.
func (t *Template) Expand(source string, h Headers) (string, string) {
	if len(t.parts) == 1 && t.parts[0].kind == tmplLiteral {
		return t.parts[0].text, ""
	}
	var b strings.Builder
	var tokens []string
	for _, p := range t.parts {
		var v string
		switch p.kind {
		case tmplLiteral:
			b.WriteString(p.text)
			continue
		case tmplSource:
			v = source
		case tmplToken, tmplTail:
			if tokens == nil {
				tokens = strings.Split(source, ".")
			}
			if source == "" || p.n > len(tokens) {
				return "", fmt.Sprintf("%s: the source name %q has %d dot-separated tokens, not %d", placeholderName(p), printable(source), countTokens(source), p.n)
			}
			if p.kind == tmplToken {
				v = tokens[p.n-1]
			} else {
				v = strings.Join(tokens[p.n-1:], ".")
			}
		case tmplHeader:
			var ok bool
			if v, ok = h.Get(p.text); !ok {
				return "", fmt.Sprintf("%s: the message has no header %s", placeholderName(p), printable(p.text))
			}
			if differs(h, p.text, v) {
				// Which one a filter in front of the broker checked is
				// unknown, as for a control header given twice.
				return "", fmt.Sprintf("%s: the message has header %s %d times with different values; give it once", placeholderName(p), printable(p.text), h.Count(p.text))
			}
		}
		check := destination.CheckToken // every placeholder but {source.N:} is one token
		if p.kind == tmplTail {
			check = destination.CheckTokens
		}
		if why := check(v); why != "" {
			return "", fmt.Sprintf("%s %s", placeholderName(p), why)
		}
		b.WriteString(v)
	}
	return b.String(), ""
}

// differs reports whether header key appears with another value than v.
func differs(h Headers, key, v string) bool {
	for _, kv := range h {
		if strings.EqualFold(kv.Key, key) && kv.Value != v {
			return true
		}
	}
	return false
}

func countTokens(source string) int {
	if source == "" {
		return 0
	}
	return strings.Count(source, ".") + 1
}

func placeholderName(p tmplPart) string {
	switch p.kind {
	case tmplSource:
		return "{source}"
	case tmplToken:
		return "{source." + strconv.Itoa(p.n) + "}"
	case tmplTail:
		return "{source." + strconv.Itoa(p.n) + ":}"
	case tmplHeader:
		return "{header." + printable(p.text) + "}"
	}
	return ""
}
