package envelope

import (
	"strings"
	"testing"
)

func TestParseTemplateErrors(t *testing.T) {
	cases := []struct{ tmpl, errHas string }{
		{"{nope}", `unknown placeholder "{nope}"`},
		{"orders.{Source}", `unknown placeholder "{Source}"`},
		{"{source.0}", "integer from 1"},
		{"{source.-1}", "integer from 1"},
		{"{source.+1}", "integer from 1"},
		{"{source.x}", "integer from 1"},
		{"{source.}", "integer from 1"},
		{"{source.1:2}", "integer from 1"},
		{"{source.99999999999999999999}", "integer from 1"},
		{"{header.}", "header name is required"},
		{"{header.a b}", "header name is required"},
		{"{}", `unknown placeholder "{}"`},
		{"orders.{source", "unclosed {"},
		{"orders.}", "lone }"},
		{"{source}}", "lone }"},
		// every bad placeholder is named, not only the first
		{"f.{source.0}.{header.}", "integer from 1"},
		{"f.{source.0}.{header.}", "header name is required"},
	}
	for _, c := range cases {
		_, err := ParseTemplate(c.tmpl)
		if err == nil || !strings.Contains(err.Error(), c.errHas) {
			t.Errorf("ParseTemplate(%q) = %v, want an error containing %q", c.tmpl, err, c.errHas)
		}
	}
}

func TestTemplateExpand(t *testing.T) {
	h := hdrs("Tenant", "eu", "empty", "", "tenant", "eu") // given twice, one value
	cases := []struct {
		tmpl, source, want string
		literal            bool
	}{
		{"orders.expired", "x", "orders.expired", true},
		{"", "x", "", true},
		{"{source}", "orders", "orders", false},
		{"{source.1:}", "orders.created.eu", "orders.created.eu", false},
		{"delayed.{source}", "a", "delayed.a", false},
		{"{source.1}", "orders.created.eu", "orders", false},
		{"{source.3}", "orders.created.eu", "eu", false},
		{"{source.2:}", "orders.created.eu", "created.eu", false},
		{"{source.1:}", "orders.created.eu", "orders.created.eu", false},
		{"{source.3:}", "orders.created.eu", "eu", false},
		{"out.{source.2:}", "delayed.orders.created", "out.orders.created", false},
		{"{header.tenant}.{source.1}", "orders.x", "eu.orders", false},
		{"{header.TENANT}", "", "eu", false}, // case-insensitive
		{"{{literal}}.{source}", "s", "{literal}.s", false},
		{"{{}}", "s", "{}", true},
		{"q-{source}-{source.1}", "a", "q-a-a", false},
	}
	for _, c := range cases {
		tm, err := ParseTemplate(c.tmpl)
		if err != nil {
			t.Fatalf("ParseTemplate(%q): %v", c.tmpl, err)
		}
		got, why := tm.Expand(c.source, h)
		if why != "" || got != c.want {
			t.Errorf("%q with source %q = %q (%s), want %q", c.tmpl, c.source, got, why, c.want)
		}
		if tm.Literal() != c.literal || tm.String() != c.tmpl {
			t.Errorf("%q: Literal %v, String %q", c.tmpl, tm.Literal(), tm.String())
		}
	}
}

func TestTemplateExpandMissing(t *testing.T) {
	cases := []struct{ tmpl, source, whyHas string }{
		{"{source.4}", "orders.created.eu", `{source.4}: the source name "orders.created.eu" has 3 dot-separated tokens, not 4`},
		{"{source.4:}", "orders.created.eu", "{source.4:}"},
		{"{source.1}", "", "has 0 dot-separated tokens"},
		{"{header.nope}", "x", "{header.nope}: the message has no header nope"},
		// Every placeholder but {source.N:} is one token
		// (docs/reference.md: destinations stay in their lane).
		{"{source}", "orders.created", `{source} "orders.created" holds the separator`},
		{"{source.2}", "a..c", "{source.2} is empty"},
		{"fired.{header.empty}.orders", "", "{header.empty} is empty"},
		{"fired.{header.tenant}", "", `holds the separator`},
		{"fired.{header.wild}", "", `holds a wildcard`},
		{"fired.{header.gt}", "", `holds a wildcard`},
		{"fired.{header.space}", "", `white space`},
		{"{source.2:}", "a.b..c", "has an empty token"},
		{"{source}", "orders*", "holds a wildcard"},
		// Given twice in two cases: which one a filter in front checked is
		// unknown.
		{"fired.{header.kind}", "", "{header.kind}: the message has header kind 2 times with different values; give it once"},
	}
	for _, c := range cases {
		tm, err := ParseTemplate(c.tmpl)
		if err != nil {
			t.Fatal(err)
		}
		got, why := tm.Expand(c.source, hdrs("empty", "", "tenant", "victim.orders.admin", "wild", "a*", "gt", ">", "space", "a b", "kind", "ok", "KIND", "evil"))
		if !strings.Contains(why, c.whyHas) || got != "" {
			t.Errorf("%q with source %q = %q, reason %q; want a reason containing %q", c.tmpl, c.source, got, why, c.whyHas)
		}
	}
}

// Destination templates through Parse: the route's and x-delay-destination,
// expanded from Incoming.Source and the headers; what does not expand to a
// valid destination is rejected with the reason and invalid_destination.
func TestParseDestinationTemplate(t *testing.T) {
	type tc struct {
		name     string
		route    string
		source   string
		headers  Headers
		override bool
		allowed  []string
		want     string
		reason   string // non-empty: reject with this in the reason
		code     Code
	}
	cases := []tc{
		{name: "source", route: "{source}", source: "orders", want: "orders"},
		{name: "source of tokens", route: "{source}", source: "orders.created", reason: "holds the separator", code: CodeInvalidDestination},
		{name: "whole source", route: "{source.1:}", source: "orders.created", want: "orders.created"},
		{name: "token", route: "fired.{source.2}", source: "delayed.orders", want: "fired.orders"},
		{name: "tail", route: "{source.2:}", source: "delayed.orders.eu", want: "orders.eu"},
		{name: "header", route: "{header.x-tenant}.due", headers: hdrs("x-tenant", "acme"), want: "acme.due"},
		{name: "header kept", route: "{header.x-tenant}", headers: hdrs("x-tenant", "acme"), want: "acme"},
		{name: "literal braces", route: "{{q}}", want: "{q}"},
		{name: "empty source", route: "{source}", source: "", reason: `route.destination "{source}": {source} is empty`, code: CodeInvalidDestination},
		{name: "missing token", route: "{source.3}", source: "a.b", reason: "has 2 dot-separated tokens, not 3", code: CodeInvalidDestination},
		{name: "missing header", route: "{header.x-tenant}", reason: "the message has no header x-tenant", code: CodeInvalidDestination},
		{name: "empty header", route: "{header.x-tenant}", headers: hdrs("x-tenant", ""), reason: "{header.x-tenant} is empty", code: CodeInvalidDestination},
		{name: "header with newline", route: "q.{header.x-tenant}", headers: hdrs("x-tenant", "a\nb"), reason: "control character", code: CodeInvalidDestination},
		{name: "header not UTF-8", route: "{header.x-tenant}", headers: hdrs("x-tenant", "\xff"), reason: "not UTF-8", code: CodeInvalidDestination},
		{name: "unknown placeholder in route", route: "{nope}", reason: `route.destination "{nope}": unknown placeholder "{nope}"`, code: CodeInvalidDestination},
		{name: "override template", route: "orders", source: "in.eu", override: true, headers: hdrs(HeaderDestination, "late.{source.2}"), want: "late.eu"},
		{name: "override unknown placeholder", route: "orders", override: true, headers: hdrs(HeaderDestination, "{bad}"), reason: `x-delay-destination "{bad}": unknown placeholder`, code: CodeInvalidDestination},
		{name: "override expands empty", route: "orders", override: true, headers: hdrs(HeaderDestination, "{header.t}", "t", " "), reason: `x-delay-destination "{header.t}": {header.t} " " holds white space`, code: CodeInvalidDestination},
		{name: "allowed after expansion", route: "orders", source: "x.eu", override: true, allowed: []string{"late.*"}, headers: hdrs(HeaderDestination, "late.{source.2}"), want: "late.eu"},
		{name: "not allowed after expansion", route: "orders", source: "x.us", override: true, allowed: []string{"late.eu"}, headers: hdrs(HeaderDestination, "late.{source.2}"), reason: `"late.us" matches no pattern`, code: CodeInvalidRoute},
		{name: "literal destination with a tab", route: "orders", override: true, headers: hdrs(HeaderDestination, "a\tb"), reason: "control character", code: CodeInvalidRoute},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := testRoute()
			r.Destination = c.route
			r.AllowOverride = c.override
			r.AllowedDestinations = c.allowed
			in := &Incoming{Source: c.source, Headers: append(hdrs(HeaderDelay, "1000"), c.headers...)}
			d := parseWith(t, in, r, testLimits)
			if c.reason != "" {
				mustReject(t, d, c.reason)
				if CodeOf(d.Err) != c.code {
					t.Fatalf("code %q, want %q", CodeOf(d.Err), c.code)
				}
				return
			}
			if m := mustPark(t, d); m.Destination != c.want {
				t.Fatalf("destination %q, want %q", m.Destination, c.want)
			}
		})
	}
}
