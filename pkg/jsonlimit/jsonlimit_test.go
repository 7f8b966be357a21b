package jsonlimit

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func nested(depth int, open, close string) string {
	return strings.Repeat(open, depth) + strings.Repeat(close, depth)
}

func TestCheckDepth(t *testing.T) {
	for _, tc := range []struct {
		name string
		doc  string
		ok   bool
	}{
		{"flat object", `{"a":1,"b":"x"}`, true},
		{"at the limit", nested(MaxDepth, "[", "]"), true},
		{"one past the limit", nested(MaxDepth+1, "[", "]"), false},
		{"objects past the limit", strings.Repeat(`{"a":`, MaxDepth+1) + "1" + strings.Repeat("}", MaxDepth+1), false},
		{"brackets inside strings do not count", `{"a":"` + strings.Repeat("[{", 1000) + `"}`, true},
		{"an escaped quote does not end a string", `{"a":"\"` + strings.Repeat("[", 1000) + `"}`, true},
		{"an escaped backslash ends before the quote", `{"a":"\\"` + `,"b":` + nested(MaxDepth, "[", "]") + `}`, false},
		{"siblings do not add up", `[` + strings.Repeat(nested(MaxDepth-1, "[", "]")+",", 100) + `1]`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check([]byte(tc.doc), MaxDepth)
			var de *DepthError
			if tc.ok != (err == nil) || (err != nil && !errors.As(err, &de)) {
				t.Fatalf("Check = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// TestCheckIsLinear: a document of 2 MB nested all the way is refused at
// the first byte past the limit, without reading the rest.
func TestCheckStopsAtTheLimit(t *testing.T) {
	doc := []byte(nested(1<<20, "[", "]"))
	var de *DepthError
	if err := Check(doc, MaxDepth); !errors.As(err, &de) || de.Offset != MaxDepth {
		t.Fatalf("Check = %v, want a DepthError at byte %d", err, MaxDepth)
	}
}

// FuzzCheck: Check agrees with encoding/json on the depth of any valid
// document (encoding/json's own limit is 10000).
func FuzzCheck(f *testing.F) {
	f.Add(`{"a":[1,{"b":"[["}]}`)
	f.Add(nested(70, "[", "]"))
	f.Add(`"\\"` + nested(3, "{", "}"))
	f.Fuzz(func(t *testing.T, doc string) {
		var v any
		if json.Unmarshal([]byte(doc), &v) != nil {
			return
		}
		want := depthOf(v)
		for _, max := range []int{0, 1, 2, 5, MaxDepth} {
			err := Check([]byte(doc), max)
			if (err == nil) != (want <= max) {
				t.Fatalf("Check(%q, %d) = %v; the document's depth is %d", doc, max, err, want)
			}
		}
	})
}

func depthOf(v any) int {
	d := 0
	switch v := v.(type) {
	case map[string]any:
		for _, e := range v {
			d = max(d, depthOf(e))
		}
		return d + 1
	case []any:
		for _, e := range v {
			d = max(d, depthOf(e))
		}
		return d + 1
	}
	return 0
}

func TestClip(t *testing.T) {
	if got := Clip("abc", 5); got != "abc" {
		t.Fatalf("Clip = %q", got)
	}
	if got := Clip("héllo", 2); got != "h..." {
		t.Fatalf("Clip cut a rune: %q", got)
	}
}
