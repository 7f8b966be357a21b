package docs

import (
	"strings"
	"testing"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// docs/reference.md states every per-message option of the table
// (envelope.Options): a row of the ingest's header table and a field of
// POST /v1/messages in the table of routes.
func TestReferenceStatesEveryOption(t *testing.T) {
	ref := read(t, "docs/reference.md")
	var post string
	for _, l := range strings.Split(ref, "\n") {
		if strings.HasPrefix(l, "| `POST /v1/messages` |") {
			post = l
		}
	}
	if post == "" {
		t.Fatal("docs/reference.md has no row for POST /v1/messages")
	}
	for _, o := range envelope.OptionTable() {
		if !strings.Contains(ref, "\n| `"+o.Header+"` |") {
			t.Errorf("docs/reference.md: no row for the header %s (option %s) in the table of headers read at ingest", o.Header, o.Field)
		}
		if !strings.Contains(post, `"`+o.Field+`"`) {
			t.Errorf("docs/reference.md: POST /v1/messages does not list the field %q (header %s)", o.Field, o.Header)
		}
	}
}
