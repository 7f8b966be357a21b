package strictjson

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/delaybridge/delaybridge/pkg/jsonlimit"
)

// request has the shapes the API's requests have: strings, pointers, a
// map of strings, a raw JSON value and a slice.
type request struct {
	Delay   json.RawMessage   `json:"delay,omitempty"`
	Sink    string            `json:"sink"`
	ID      *string           `json:"id,omitempty"`
	Count   *int              `json:"count,omitempty"`
	Replace *bool             `json:"replace,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
	Tags    []string          `json:"tags,omitempty"`
	embedded
}

type embedded struct {
	Group *string `json:"group,omitempty"`
}

// FuzzDecode: whatever the body, Decode answers (no panic) with a reason
// of bounded length, and refuses a body nested past jsonlimit.MaxDepth as
// too_deep, whatever type reads it.
func FuzzDecode(f *testing.F) {
	f.Add(`{"delay":1,"sink":"s","id":"x","group":"g","headers":{"a":"b"}}`)
	f.Add(`{"delay":1,"headers":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}`)
	f.Add(`{"headers":{"a":{"b":[1,{"c":"\ud800"}]}}}`)
	f.Add(`{"ID":"x","id":"y","id":"z"}`)
	f.Add(`{"delay":"` + strings.Repeat(`\"[`, 40) + `"}`)
	f.Fuzz(func(t *testing.T, body string) {
		deep := jsonlimit.Check([]byte(body), jsonlimit.MaxDepth) != nil
		for _, dst := range []any{&request{}, new(any)} {
			status, reason := Decode([]byte(body), dst)
			if deep && (status != 400 || !strings.HasPrefix(reason, jsonlimit.Code+": ")) {
				t.Fatalf("a body nested past the limit: %d %q", status, reason)
			}
			if len(reason) > 512 {
				t.Fatalf("a reason of %d bytes: %.200q", len(reason), reason)
			}
		}
	})
}

// The rules, each refused with a reason that names what to fix; an
// embedded struct's fields are the outer's.
func TestDecode(t *testing.T) {
	for _, c := range []struct{ body, reason string }{
		{`{"sink":"s","id":"x","group":"g"}`, ""},
		{`{"sink":"s","ID":"x"}`, `unknown field "ID": field names are case-sensitive; did you mean "id"?`},
		{`{"sink":"s","sink":"t"}`, `field "sink" is given twice; give each field once`},
		{`{"sink":"s","nope":1}`, `unknown field "nope"; known: count, delay, group, headers, id, replace, sink, tags`},
		{`{"sink":"\ud800"}`, `lone UTF-16 surrogate \ud800`},
		{"{\"sink\":\"\xff\"}", "not valid UTF-8 (at byte 9)"},
		{`{"sink":"s"} {}`, "exactly one JSON object"},
		{`[]`, "must be a JSON object"},
		{`{"count":"x"}`, `field "count" must be an integer`},
		{`{"group":7}`, `field "group" must be a string, not number`}, // the embedded struct's name is not the API's
		{`{"headers":{"a":1}}`, `field "headers" must be an object of strings, not one with a value of type number`},
		{`{"headers":5}`, `field "headers" must be an object of strings, not number`},
		{`{"headers":{"a":null}}`, `field "headers.a" is null: a value here is a string`},
		{``, "empty request body"},
	} {
		var r request
		status, reason := Decode([]byte(c.body), &r)
		switch {
		case c.reason == "" && (status != 0 || reason != ""):
			t.Errorf("%s: %d %q, want it read", c.body, status, reason)
		case c.reason != "" && (status != 400 || !strings.Contains(reason, c.reason)):
			t.Errorf("%s: %d %q, want 400 with %q", c.body, status, reason, c.reason)
		}
	}
}
