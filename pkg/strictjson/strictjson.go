// Package strictjson reads a request body of the admin API into a Go
// value, more strictly than encoding/json, so that a filter in front of
// the API and the API read the same request (Decode has the rules).
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/delaybridge/delaybridge/pkg/jsonlimit"
)

// Decode reads a request body into dst (a pointer to a struct) as one
// JSON object, more strictly than encoding/json, so that a filter in front
// of the API and the API read the same request:
//
//   - field names match dst's json tags exactly (encoding/json would take
//     "ID" for "id"), and no name is unknown;
//   - no object, at any depth, names a key twice (encoding/json lets the
//     last one win, a filter may look at the first);
//   - the body is valid UTF-8 and its strings hold no lone UTF-16
//     surrogate escape (encoding/json replaces both with U+FFFD; binary
//     data belongs in base64 fields);
//   - nothing follows the object (the operation bounds its size);
//   - objects and arrays nest at most jsonlimit.MaxDepth deep, checked in
//     one pass before anything is decoded (the refusal's reason begins
//     with the code too_deep).
//
// Its memory is linear in the body's size: the path of a field is only
// put together for a reason.
// It returns 0 and "" when dst was filled, else the status and the reason
// to answer. Every operation that takes JSON reads it so.
func Decode(raw []byte, dst any) (int, string) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return http.StatusBadRequest, "empty request body: send a JSON object"
	}
	if err := jsonlimit.Check(raw, jsonlimit.MaxDepth); err != nil {
		return http.StatusBadRequest, jsonlimit.Code + ": " + err.Error()
	}
	if !utf8.Valid(raw) {
		i := invalidUTF8At(raw)
		return http.StatusBadRequest, fmt.Sprintf("the request body is not valid UTF-8 (at byte %d); send binary data base64-encoded in the *_base64 fields", i)
	}
	t := reflect.TypeOf(dst).Elem()
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber() // a number is only skipped here: no float64 range error
	if reason := checkValue(dec, t, nil); reason != "" {
		return http.StatusBadRequest, reason
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return http.StatusBadRequest, "the request body must hold exactly one JSON object"
	}
	if reason := loneSurrogate(raw); reason != "" {
		return http.StatusBadRequest, reason
	}
	strict := json.NewDecoder(bytes.NewReader(raw))
	strict.DisallowUnknownFields()
	if err := strict.Decode(dst); err != nil {
		return decodeError(err, t)
	}
	return 0, ""
}

// checkValue reads one JSON value from dec, checking the keys of every
// object in it: against t's json fields when t is a struct, for duplicates
// always. at is the value's path (nil for the body), which a reason shows
// as "headers.x-a" or "tags[2]".
func checkValue(dec *json.Decoder, t reflect.Type, at fieldPath) string {
	tok, err := dec.Token()
	if err != nil {
		return syntaxReason(err)
	}
	if tok == nil && inMap(at) && t != nil && t.Kind() == reflect.String {
		// encoding/json would read it as "", which it is not.
		return fmt.Sprintf("%s is null: a value here is a string", at)
	}
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if at == nil && tok != json.Delim('{') {
		return "the request body must be a JSON object"
	}
	switch tok {
	case json.Delim('{'):
		var fields map[string]reflect.Type
		if t != nil && t.Kind() == reflect.Struct {
			fields = jsonFields(t)
		}
		seen := map[string]bool{}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return syntaxReason(err)
			}
			key := k.(string) // the decoder only returns string keys in an object
			path := append(at, pathStep{key: key, index: -1})
			if seen[key] {
				return fmt.Sprintf("%s is given twice; give each field once", path)
			}
			seen[key] = true
			var sub reflect.Type
			switch {
			case fields != nil:
				ft, ok := fields[key]
				if !ok {
					return unknownField(path, key, fields)
				}
				sub = ft
			case t != nil && t.Kind() == reflect.Map:
				sub = t.Elem()
				path[len(path)-1].mapKey = true
			}
			if reason := checkValue(dec, sub, path); reason != "" {
				return reason
			}
		}
		if _, err := dec.Token(); err != nil { // '}'
			return syntaxReason(err)
		}
	case json.Delim('['):
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for i := 0; dec.More(); i++ {
			if reason := checkValue(dec, elem, append(at, pathStep{index: i})); reason != "" {
				return reason
			}
		}
		if _, err := dec.Token(); err != nil { // ']'
			return syntaxReason(err)
		}
	}
	return ""
}

// fieldPath is where a value is in the body: a step per object key or
// array index, put into words only for a reason.
type fieldPath []pathStep

type pathStep struct {
	key    string
	index  int  // -1 for a key
	mapKey bool // a key of a map, not a field
}

// inMap reports whether the value at p is one of a map's.
func inMap(p fieldPath) bool { return len(p) > 0 && p[len(p)-1].mapKey }

// maxQuoted bounds what a reason quotes of the request (a field name, a
// value): an error answer never echoes more than a few hundred bytes.
const maxQuoted = 64

// String is the path as a reason names it: field "headers.x-a".
func (p fieldPath) String() string {
	var b strings.Builder
	for _, s := range p {
		switch {
		case s.index >= 0:
			fmt.Fprintf(&b, "[%d]", s.index)
		case b.Len() > 0:
			b.WriteString("." + jsonlimit.Clip(s.key, maxQuoted))
		default:
			b.WriteString(jsonlimit.Clip(s.key, maxQuoted))
		}
		if b.Len() > 3*maxQuoted {
			break
		}
	}
	return fmt.Sprintf("field %q", jsonlimit.Clip(b.String(), 3*maxQuoted))
}

// syntaxReason is the reason for a token error: the body was not empty, so
// an end of input is an unexpected one.
func syntaxReason(err error) string {
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	_, reason := decodeError(err, nil)
	return reason
}

var rawMessageType = reflect.TypeFor[json.RawMessage]()

// jsonFields maps the JSON names of a struct's fields to their types
// (nil for json.RawMessage and interfaces: any shape, keys still unique).
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && f.Tag.Get("json") == "" && f.Type.Kind() == reflect.Struct {
			maps.Copy(out, jsonFields(f.Type)) // an embedded struct's fields are the outer's, as encoding/json reads them
			continue
		}
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		ft := f.Type
		if ft == rawMessageType || ft.Kind() == reflect.Interface {
			ft = nil
		}
		out[name] = ft
	}
	return out
}

// unknownField names the field and the known ones; a name that differs
// from a known one only in case says so, as encoding/json would have taken
// it silently.
func unknownField(path fieldPath, key string, fields map[string]reflect.Type) string {
	known := make([]string, 0, len(fields))
	for k := range fields {
		known = append(known, k)
	}
	slices.Sort(known)
	for _, k := range known {
		if strings.EqualFold(k, key) {
			return fmt.Sprintf("unknown %s: field names are case-sensitive; did you mean %q?", path, k)
		}
	}
	return fmt.Sprintf("unknown %s; known: %s", path, strings.Join(known, ", "))
}

// invalidUTF8At returns the offset of the first byte of b that is not
// valid UTF-8.
func invalidUTF8At(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return len(b)
}

// loneSurrogate finds a \uD800-\uDFFF escape that is not half of a pair in
// a JSON text already known to be valid JSON, and returns the reason to
// refuse it ("" when there is none).
func loneSurrogate(raw []byte) string {
	inString := false
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch {
		case !inString:
			inString = c == '"'
		case c == '"':
			inString = false
		case c == '\\':
			if raw[i+1] != 'u' {
				i++ // a one-character escape: \" \\ \/ \b \f \n \r \t
				continue
			}
			u := hex4(raw[i+2 : i+6])
			i += 5
			switch {
			case u >= 0xd800 && u < 0xdc00: // high: a low one must follow
				if i+6 < len(raw) && raw[i+1] == '\\' && raw[i+2] == 'u' {
					if lo := hex4(raw[i+3 : i+7]); lo >= 0xdc00 && lo < 0xe000 {
						i += 6
						continue
					}
				}
				return fmt.Sprintf("the request body holds a lone UTF-16 surrogate \\u%04x, which is not a character; send binary data base64-encoded in the *_base64 fields", u)
			case u >= 0xdc00 && u < 0xe000:
				return fmt.Sprintf("the request body holds a lone UTF-16 surrogate \\u%04x, which is not a character; send binary data base64-encoded in the *_base64 fields", u)
			}
		}
	}
	return ""
}

// hex4 decodes four hex digits (valid JSON guarantees them).
func hex4(b []byte) rune {
	var r rune
	for _, c := range b {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		}
	}
	return r
}

// decodeError turns a JSON decoding error of a value of type t (nil: not
// known) into a status and a reason.
func decodeError(err error, t reflect.Type) (int, string) {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.Is(err, io.EOF):
		return http.StatusBadRequest, "empty request body: send a JSON object"
	case errors.As(err, &syntax), errors.Is(err, io.ErrUnexpectedEOF):
		return http.StatusBadRequest, fmt.Sprintf("the request body is not valid JSON: %v", err)
	case errors.As(err, &typ):
		if typ.Field == "" {
			return http.StatusBadRequest, "the request body must be a JSON object"
		}
		field, ft := apiPath(t, typ.Field)
		if ft != nil && ft.Kind() == reflect.Map && typ.Type == ft.Elem() { // a value in it, not the field itself
			return http.StatusBadRequest, fmt.Sprintf("field %q must be %s, not one with a value of type %s", jsonlimit.Clip(field, maxQuoted), jsonKind(ft.String()),
				jsonlimit.Clip(typ.Value, maxQuoted))
		}
		return http.StatusBadRequest, fmt.Sprintf("field %q must be %s, not %s", jsonlimit.Clip(field, maxQuoted), jsonKind(typ.Type.String()),
			jsonlimit.Clip(typ.Value, maxQuoted))
	}
	return http.StatusBadRequest, fmt.Sprintf("the request body cannot be read: %v", err)
}

// apiPath is the path of encoding/json's UnmarshalTypeError.Field in a
// value of type t as the API names it: without the Go names of embedded
// structs, which encoding/json puts in ("Options.priority"); and the type
// of the field it ends at (nil when not found).
func apiPath(t reflect.Type, path string) (string, reflect.Type) {
	var out []string
	for _, seg := range strings.Split(path, ".") {
		for t != nil && t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t == nil || t.Kind() != reflect.Struct {
			out, t = append(out, seg), nil
			continue
		}
		if f, ok := t.FieldByName(seg); ok && f.Anonymous && f.Tag.Get("json") == "" {
			t = f.Type // an embedded struct: its fields are the outer's
			continue
		}
		out, t = append(out, seg), jsonFields(t)[seg]
	}
	return strings.Join(out, "."), t
}

func jsonKind(goType string) string {
	switch {
	case strings.Contains(goType, "map"):
		return "an object of strings"
	case strings.Contains(goType, "int"):
		return "an integer"
	case strings.Contains(goType, "bool"):
		return "true or false"
	default:
		return "a string"
	}
}
