package admin

import (
	"strings"
	"testing"

	"github.com/delaybridge/delaybridge/pkg/jsonlimit"
	"github.com/delaybridge/delaybridge/pkg/ops"
)

// FuzzDecodeJSON: whatever the body, decodeJSON answers (no panic) with a
// reason of bounded length, and refuses a body nested past
// jsonlimit.MaxDepth as too_deep, whichever route type reads it.
func FuzzDecodeJSON(f *testing.F) {
	f.Add(`{"delay":1,"sink":"s","destination":"d","body":"x","headers":{"a":"b"}}`)
	f.Add(`{"delay":1,"headers":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}`)
	f.Add(`{"headers":{"a":{"b":[1,{"c":"\ud800"}]}}}`)
	f.Add(`{"ID":"x","id":"y","id":"z"}`)
	f.Add(`{"delay":"` + strings.Repeat(`\"[`, 40) + `"}`)
	f.Fuzz(func(t *testing.T, body string) {
		deep := jsonlimit.Check([]byte(body), jsonlimit.MaxDepth) != nil
		for _, dst := range []any{&ops.PostRequest{}, &ops.RescheduleRequest{}, new(any)} {
			status, reason := decodeJSON([]byte(body), dst)
			if deep && (status != 400 || !strings.HasPrefix(reason, jsonlimit.Code+": ")) {
				t.Fatalf("a body nested past the limit: %d %q", status, reason)
			}
			if len(reason) > 512 {
				t.Fatalf("a reason of %d bytes: %.200q", len(reason), reason)
			}
		}
	})
}
