// Package jsonlimit bounds a JSON document before anything decodes it.
//
// Every JSON document the daemon reads from outside (an admin request body,
// an import line) goes through Check first: its nesting depth is found by
// one pass over the bytes, in constant memory, and a document nested deeper
// than MaxDepth is refused before a decoder builds anything for it. The
// size bound is the caller's (an HTTP body limit, an import line limit),
// checked before the bytes are read whole.
package jsonlimit

import (
	"fmt"
	"unicode/utf8"
)

// MaxDepth is the deepest nesting of objects and arrays a document may
// have: the body's own object is depth 1, an object or array in one of its
// fields depth 2. No request of the API needs more than 3; 64 leaves room
// for user headers of any sensible shape.
const MaxDepth = 64

// Code is the machine-readable name of a depth refusal (the admin API's
// 400 `too_deep`).
const Code = "too_deep"

// DepthError is a document nested deeper than its limit.
type DepthError struct {
	Limit  int // the limit it passed
	Offset int // the byte at which it passed it
}

func (e *DepthError) Error() string {
	return fmt.Sprintf("the JSON document nests objects and arrays deeper than %d levels (at byte %d); flatten it", e.Limit, e.Offset)
}

// Check returns a *DepthError when doc nests objects and arrays deeper
// than max, and nil otherwise. It does not validate the rest of the syntax
// (the decoder after it does) and reads each byte once.
func Check(doc []byte, max int) error {
	depth, inString := 0, false
	for i := 0; i < len(doc); i++ {
		c := doc[i]
		if inString {
			switch c {
			case '\\':
				i++ // the escaped byte cannot end the string
			case '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{', '[':
			depth++
			if depth > max {
				return &DepthError{Limit: max, Offset: i}
			}
		case '}', ']':
			depth--
		}
	}
	return nil
}

// Clip returns s cut to at most n bytes (on a rune boundary), with "..."
// where it was cut: what an error may quote of its input.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}
