package destination_test

import (
	"errors"
	"strings"
	"testing"

	_ "github.com/delaybridge/delaybridge/pkg/brokers" // registers the brokers' reserved parts with Generic
	"github.com/delaybridge/delaybridge/pkg/brokers/kafkabroker"
	"github.com/delaybridge/delaybridge/pkg/brokers/natsbroker"
	"github.com/delaybridge/delaybridge/pkg/brokers/rabbitbroker"
	"github.com/delaybridge/delaybridge/pkg/destination"
)

// The syntaxes of the brokers, defined in their packages.
var (
	NATS       = natsbroker.Destinations
	Kafka      = kafkabroker.Destinations
	RabbitMQ   = rabbitbroker.Destinations
	RabbitMQOn = rabbitbroker.DestinationsOn
)

func TestMatch(t *testing.T) {
	for _, c := range []struct {
		s          destination.Syntax
		p, d       string
		want       bool
		name, note string
	}{
		// NATS: * is one token, > one or more trailing tokens.
		{s: NATS, p: "fired.*", d: "fired.a", want: true},
		{s: NATS, p: "fired.*", d: "fired.a.b.c", want: false, note: "not shell globbing (issue 25)"},
		{s: NATS, p: "fired.*", d: "fired", want: false},
		{s: NATS, p: "fired.>", d: "fired.a.b.c", want: true},
		{s: NATS, p: "fired.>", d: "fired", want: false},
		{s: NATS, p: "*.eu.*", d: "orders.eu.created", want: true},
		{s: NATS, p: "orders", d: "orders", want: true},
		{s: NATS, p: "$KV.orders.>", d: "$KV.orders.k1", want: true},
		// RabbitMQ: * one word, # zero or more.
		{s: RabbitMQ, p: "orders.#", d: "orders", want: true},
		{s: RabbitMQ, p: "orders.#", d: "orders.eu.created", want: true},
		{s: RabbitMQ, p: "orders.*", d: "orders.eu.created", want: false},
		{s: RabbitMQ, p: "a.#.b", d: "a.b", want: true},
		{s: RabbitMQ, p: "a.#.b", d: "a.x.y.b", want: true},
		{s: RabbitMQ, p: "#.audit", d: "audit.x", want: false},
		{s: RabbitMQ, p: "#", d: "anything.at.all", want: true},
		// Kafka: * is any run of characters.
		{s: Kafka, p: "videos-*", d: "videos-online", want: true},
		{s: Kafka, p: "videos-*", d: "online-videos", want: false},
		{s: Kafka, p: "*-out", d: "a.b-out", want: true},
		{s: Kafka, p: "a*b*c", d: "aXbYc", want: true},
		{s: Kafka, p: "a*b*c", d: "aXbY", want: false},
		{s: Kafka, p: "exact", d: "exact", want: true},
	} {
		if got := c.s.Match(c.p, c.d); got != c.want {
			t.Errorf("%s.Match(%q, %q) = %v, want %v %s", c.s.Noun, c.p, c.d, got, c.want, c.note)
		}
	}
}

// TestCheck holds the rules of "Destinations stay in their lane": control
// planes refused unless a pattern names the prefix literally, patterns in
// the broker's wildcards, each broker's validity.
func TestCheck(t *testing.T) {
	for _, c := range []struct {
		name    string
		s       destination.Syntax
		dest    string
		allowed []string
		chosen  bool
		want    error // nil, or the kind
		reason  string
	}{
		{name: "plain subject", s: NATS, dest: "orders.expired"},
		{name: "JetStream API delete", s: NATS, dest: "$JS.API.STREAM.DELETE.VICTIM", chosen: true, want: destination.ErrReserved, reason: `begins with "$"`},
		{name: "JetStream API by a route's own destination", s: NATS, dest: "$JS.API.STREAM.PURGE.V2", want: destination.ErrReserved},
		{name: "allowed star does not open $", s: NATS, dest: "$JS.API.STREAM.DELETE.X", allowed: []string{"*"}, chosen: true, want: destination.ErrReserved},
		{name: "allowed > does not open $", s: NATS, dest: "$JS.API.INFO", allowed: []string{">"}, chosen: true, want: destination.ErrReserved},
		{name: "KV named literally", s: NATS, dest: "$KV.orders.k1", allowed: []string{"$KV.orders.>"}, chosen: true},
		{name: "KV named, other bucket", s: NATS, dest: "$KV.users.k1", allowed: []string{"$KV.orders.>"}, chosen: true, want: destination.ErrReserved},
		{name: "inbox", s: NATS, dest: "_INBOX.abc.def", chosen: true, want: destination.ErrReserved},
		{name: "inbox named", s: NATS, dest: "_INBOX.abc", allowed: []string{"_INBOX.>"}, chosen: true},
		{name: "wildcard subject", s: NATS, dest: "fired.*", want: destination.ErrInvalid},
		{name: "empty token", s: NATS, dest: "fired..orders", want: destination.ErrInvalid, reason: "empty token"},
		{name: "space in subject", s: NATS, dest: "fired. x", want: destination.ErrInvalid},
		{name: "CR LF", s: NATS, dest: "a\r\nb", want: destination.ErrInvalid, reason: "control character"},
		{name: "empty", s: RabbitMQ, dest: " ", want: destination.ErrInvalid},
		{name: "chosen, no pattern", s: NATS, dest: "elsewhere", allowed: []string{"fired.*"}, chosen: true, want: destination.ErrNotAllowed},
		{name: "route's own, no pattern needed", s: NATS, dest: "elsewhere", allowed: []string{"fired.*"}},
		{name: "chosen, three tokens under fired.*", s: NATS, dest: "fired.a.b", allowed: []string{"fired.*"}, chosen: true, want: destination.ErrNotAllowed},
		{name: "kafka internal", s: Kafka, dest: "__consumer_offsets", chosen: true, want: destination.ErrReserved},
		{name: "kafka internal, star allowed", s: Kafka, dest: "__consumer_offsets", allowed: []string{"*"}, chosen: true, want: destination.ErrReserved},
		{name: "kafka internal named", s: Kafka, dest: "__audit-x", allowed: []string{"__audit-*"}, chosen: true},
		{name: "kafka bad char", s: Kafka, dest: "$JS.API.STREAM.DELETE.X", want: destination.ErrInvalid},
		{name: "kafka too long", s: Kafka, dest: strings.Repeat("a", 250), want: destination.ErrInvalid},
		{name: "kafka topic", s: Kafka, dest: "online-videos_1.x"},
		{name: "nats subject too long for a publish's protocol line", s: NATS, dest: "fired." + strings.Repeat("x", 4100), want: destination.ErrInvalid, reason: "max_control_line"},
		{name: "nats long subject", s: NATS, dest: "fired." + strings.Repeat("x", 1000)},
		{name: "rabbit any key", s: RabbitMQ, dest: "$anything goes#"},
		{name: "rabbit too long", s: RabbitMQ, dest: strings.Repeat("a", 256), want: destination.ErrInvalid},
		{name: "rabbit pattern", s: RabbitMQ, dest: "orders.eu.late", allowed: []string{"orders.#"}, chosen: true},
		{name: "generic refuses every control plane", s: destination.Generic(), dest: "__x", want: destination.ErrReserved},
		// What a publisher may not reach.
		{name: "schema registry", s: Kafka, dest: "_schemas", allowed: []string{"*"}, chosen: true, want: destination.ErrReserved, reason: destination.ReservedCode + ": "},
		{name: "confluent", s: Kafka, dest: "_confluent-metrics", allowed: []string{"*"}, chosen: true, want: destination.ErrReserved},
		{name: "schemas by the route's own destination", s: Kafka, dest: "_schemas", want: destination.ErrReserved},
		{name: "schemas named", s: Kafka, dest: "_schemas", allowed: []string{"_schemas"}, chosen: true},
		{name: "_ named does not open __", s: Kafka, dest: "__consumer_offsets", allowed: []string{"_*"}, chosen: true, want: destination.ErrReserved},
		{name: "connect configs", s: Kafka, dest: "connect-configs", allowed: []string{"connect-*"}, chosen: true, want: destination.ErrReserved, reason: `is in "connect-configs"`},
		{name: "connect offsets", s: Kafka, dest: "connect-offsets", allowed: []string{"*"}, chosen: true, want: destination.ErrReserved},
		{name: "connect status", s: Kafka, dest: "connect-status", want: destination.ErrReserved},
		{name: "connect status named", s: Kafka, dest: "connect-status", allowed: []string{"connect-status"}, chosen: true},
		{name: "another connect topic", s: Kafka, dest: "connect-orders", allowed: []string{"connect-*"}, chosen: true},
		{name: "reply-to on the default exchange", s: RabbitMQ, dest: "amq.rabbitmq.reply-to.g1h2AA==.x", allowed: []string{"#"}, chosen: true, want: destination.ErrReserved},
		{name: "server-named queue", s: RabbitMQ, dest: "amq.gen-JzTY20BRgKO-HjmUJj0wLg", want: destination.ErrReserved, reason: `begins with "amq."`},
		{name: "reply-to named", s: RabbitMQ, dest: "amq.rabbitmq.reply-to.g1h2AA==.x", allowed: []string{"amq.rabbitmq.reply-to.#"}, chosen: true},
		{name: "amq. key on an exchange of its own", s: RabbitMQOn("events"), dest: "amq.gen-x"},
		{name: "amq.topic exchange", s: RabbitMQOn("amq.topic"), dest: "orders.late", want: destination.ErrReserved, reason: "amq.topic"},
		{name: "amq.topic exchange, key named", s: RabbitMQOn("amq.topic"), dest: "orders.late", allowed: []string{"orders.#"}},
		{name: "amq.topic exchange, # does not open it", s: RabbitMQOn("amq.topic"), dest: "orders.late", allowed: []string{"#"}, chosen: true, want: destination.ErrReserved},
		{name: "loop: the ingest's subject", s: NATS.Reserve(NATS.Consumed("delayed.>")), dest: "delayed.orders", allowed: []string{">"}, chosen: true, want: destination.ErrReserved, reason: `is in "delayed.>"`},
		{name: "loop: named", s: NATS.Reserve(NATS.Consumed("delayed.>")), dest: "delayed.orders", allowed: []string{"delayed.orders"}, chosen: true},
		{name: "loop: beside the ingest's subject", s: NATS.Reserve(NATS.Consumed("delayed.>")), dest: "delayed", allowed: []string{">"}, chosen: true},
		{name: "loop: a Kafka topic", s: Kafka.Reserve(Kafka.Consumed("orders-in")), dest: "orders-in", want: destination.ErrReserved},
		{name: "loop: a binding's # matching no word", s: RabbitMQ.Reserve(RabbitMQ.Consumed("evt.#")), dest: "evt", allowed: []string{"#"}, chosen: true, want: destination.ErrReserved, reason: `is in "evt.#"`},
		{name: "loop: # matching no word, twice", s: RabbitMQ.Reserve(RabbitMQ.Consumed("d.#.#")), dest: "d", want: destination.ErrReserved},
		{name: "loop: a binding's #, named", s: RabbitMQ.Reserve(RabbitMQ.Consumed("evt.#")), dest: "evt", allowed: []string{"evt"}, chosen: true},
		{name: "loop: beside a binding's #", s: RabbitMQ.Reserve(RabbitMQ.Consumed("evt.#")), dest: "evtx"},
		{name: "loop: another Kafka topic", s: Kafka.Reserve(Kafka.Consumed("orders-in")), dest: "orders-in-2"},
		// A source that begins with a wildcard: only the destination itself,
		// or the source's own pattern, names it.
		{name: "loop: *.in reached by out.>", s: NATS.Reserve(NATS.Consumed("*.in")), dest: "out.in", allowed: []string{"out.>"}, chosen: true, want: destination.ErrReserved, reason: `is in "*.in"`},
		{name: "loop: *.in by the route's own destination", s: NATS.Reserve(NATS.Consumed("*.in")), dest: "out.in", allowed: []string{"x.>"}, want: destination.ErrReserved},
		{name: "loop: *.in named", s: NATS.Reserve(NATS.Consumed("*.in")), dest: "out.in", allowed: []string{"out.>", "out.in"}, chosen: true},
		{name: "loop: *.in named by its pattern", s: NATS.Reserve(NATS.Consumed("*.in")), dest: "out.in", allowed: []string{"*.in"}, chosen: true},
		{name: "loop: beside *.in", s: NATS.Reserve(NATS.Consumed("*.in")), dest: "out.done", allowed: []string{"out.>"}, chosen: true},
		{name: "loop: a binding's *.rg reached by x.#", s: RabbitMQ.Reserve(RabbitMQ.Consumed("*.rg")), dest: "x.rg", allowed: []string{"x.#"}, chosen: true, want: destination.ErrReserved},
		{name: "loop: a binding's #.late reached by orders.#", s: RabbitMQ.Reserve(RabbitMQ.Consumed("#.late")), dest: "orders.late", allowed: []string{"orders.#"}, chosen: true, want: destination.ErrReserved},
		{name: "loop: a binding's #.late named", s: RabbitMQ.Reserve(RabbitMQ.Consumed("#.late")), dest: "orders.late", allowed: []string{"orders.late"}, chosen: true},
		{name: "loop: a pattern of wildcards alone is no name", s: NATS.Reserve(NATS.Consumed("*.>")), dest: "a.b", allowed: []string{"*.>"}, chosen: true, want: destination.ErrReserved},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.s.Check(c.dest, c.allowed, c.chosen)
			switch {
			case c.want == nil && err != nil:
				t.Fatalf("Check(%q) = %v, want nil", c.dest, err)
			case c.want != nil && !errors.Is(err, c.want):
				t.Fatalf("Check(%q) = %v, want %v", c.dest, err, c.want)
			case c.reason != "" && !strings.Contains(err.Error(), c.reason):
				t.Fatalf("Check(%q) = %q, want it to say %q", c.dest, err, c.reason)
			}
			var de *destination.Error
			if err != nil && (!errors.As(err, &de) || de.Dest != c.dest) {
				t.Fatalf("Check(%q): %#v is not an *destination.Error naming the destination", c.dest, err)
			}
		})
	}
}

func TestConsumed(t *testing.T) {
	for _, c := range []struct {
		s               destination.Syntax
		pattern, prefix string
	}{
		{NATS, "delayed.>", "delayed."},
		{NATS, "delayed.*.in", "delayed."},
		{NATS, "*.in", ""},
		{NATS, "in", "in"},
		{RabbitMQ, "orders.#", "orders"}, // # matches no word too: "orders"
		{RabbitMQ, "orders.#.late", "orders"},
		{RabbitMQ, "orders.*.late", "orders."},
		{RabbitMQ, "#.late", ""},
		{Kafka, "orders-in", "orders-in"},
	} {
		if r := c.s.Consumed(c.pattern); r.Prefix != c.prefix || r.Pattern != c.pattern {
			t.Errorf("%s.Consumed(%q) = %+v, want prefix %q", c.s.Noun, c.pattern, r, c.prefix)
		}
	}
}

func TestCheckPattern(t *testing.T) {
	for _, c := range []struct {
		s    destination.Syntax
		p    string
		want string
	}{
		{NATS, "fired.*", ""},
		{NATS, "fired.>", ""},
		{NATS, "$KV.orders.>", ""},
		{NATS, "fired.>.x", "last token"},
		{NATS, "fired.a*", "whole token"},
		{NATS, "fired..x", "empty token"},
		{RabbitMQ, "orders.#.late", ""},
		{RabbitMQ, "orders#", "whole token"},
		{Kafka, "videos-*", ""},
		{Kafka, "", "empty"},
	} {
		got := c.s.CheckPattern(c.p)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s.CheckPattern(%q) = %q, want %q", c.s.Noun, c.p, got, c.want)
		}
	}
}

func TestCheckToken(t *testing.T) {
	for v, want := range map[string]string{
		"tenant-a":            "",
		"victim.orders.admin": "separator",
		"":                    "empty",
		"a*":                  "wildcard",
		">":                   "wildcard",
		"#":                   "wildcard",
		"a b":                 "white space",
		"a\nb":                "white space",
		"a\x00b":              "control",
	} {
		got := destination.CheckToken(v)
		if (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("CheckToken(%q) = %q, want %q", v, got, want)
		}
	}
	for v, want := range map[string]string{
		"orders.created": "",
		"orders..x":      "empty token",
		"orders.*":       "wildcard",
		"":               "empty",
	} {
		got := destination.CheckTokens(v)
		if (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("CheckTokens(%q) = %q, want %q", v, got, want)
		}
	}
}

// BenchmarkCheck is the scheduler's check of every fired message.
func BenchmarkCheck(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if err := NATS.Check("fired.orders.expired", nil, false); err != nil {
			b.Fatal(err)
		}
	}
}
