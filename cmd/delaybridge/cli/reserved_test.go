package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/admin"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/daemon"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// reservedConfig has a sink of each broker (RabbitMQ on the default
// exchange, on an exchange an ingest's queue is bound to, and on amq.topic)
// and an ingest of each broker, whose sources are loops for the sinks of
// their broker. over lets a publisher choose any sink and any destination
// that is not reserved (x-delay-sink, x-delay-destination); fwd-* copy
// the subject into the destination (a template); open names some reserved
// destinations literally.
const reservedConfig = `
redis: {addr: "%s", key_prefix: reserved, shards: 4}
ingest:
  - name: k-in
    kafka: {brokers: ["127.0.0.1:9092"], topic: orders-in, group: g}
    route: {sink: kafka, destination: out}
  - name: r-in
    rabbitmq: {url: "amqp://127.0.0.1:5672", queue: jobs-in, bindings: [{exchange: events, routing_key: "jobs.#"}]}
    route: {sink: rabbit, destination: jobs-out}
  - name: n-in
    nats: {url: "nats://127.0.0.1:4222", subject: "delayed.>"}
    route: {sink: nats, destination: fired.x}
  - name: over
    nats: {url: "nats://127.0.0.1:4222", subject: "over"}
    route: {sink: nats, destination: fired.x, allow_override: true, allowed_destinations: ["*", "#", ">"]}
  - name: fwd-kafka
    nats: {url: "nats://127.0.0.1:4222", subject: "fwd.kafka.>"}
    route: {sink: kafka, destination: "{source.3:}", allowed_destinations: ["*"]}
  - name: fwd-rabbit
    nats: {url: "nats://127.0.0.1:4222", subject: "fwd.rabbit.>"}
    route: {sink: rabbit, destination: "{source.3:}", allowed_destinations: ["#"]}
  - name: fwd-events
    nats: {url: "nats://127.0.0.1:4222", subject: "fwd.events.>"}
    route: {sink: events, destination: "{source.3:}", allowed_destinations: ["#"]}
  - name: fwd-mqtt
    nats: {url: "nats://127.0.0.1:4222", subject: "fwd.mqtt.>"}
    route: {sink: mqtt, destination: "{source.3:}", allowed_destinations: ["#"]}
  - name: fwd-nats
    nats: {url: "nats://127.0.0.1:4222", subject: "fwd.nats.>"}
    route: {sink: nats, destination: "{source.3:}", allowed_destinations: [">"]}
  - name: open
    nats: {url: "nats://127.0.0.1:4222", subject: "open"}
    route: {sink: nats, destination: fired.x, allow_override: true,
            allowed_destinations: ["_schemas", "connect-status", "orders-in", "amq.rabbitmq.reply-to.#", "jobs-in", "jobs.late", "orders.late", "delayed.orders"]}
sinks:
  - {name: kafka, kafka: {brokers: ["127.0.0.1:9092"]}}
  - {name: rabbit, rabbitmq: {url: "amqp://127.0.0.1:5672"}}
  - {name: events, rabbitmq: {url: "amqp://127.0.0.1:5672", exchange: events}}
  - {name: mqtt, rabbitmq: {url: "amqp://127.0.0.1:5672", exchange: amq.topic}}
  - {name: nats, nats: {url: "nats://127.0.0.1:4222"}}
`

// What a publisher may not reach: the brokers' internal names, what an
// ingest reads, and the other reserved parts, each refused with destination_reserved through each way a destination is
// chosen: a header, a template, POST /v1/messages, an import line, and the
// scheduler's last check before it publishes; validate lists them. Named
// literally by a pattern of the route, each is reachable.
func TestPublisherMayNotReach(t *testing.T) {
	r := testenv.Redis(t)
	path := writeConfig(t, fmt.Sprintf(reservedConfig, r.Addr))
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	targets := []struct{ sink, dest string }{
		// The brokers' internal names and what an ingest reads.
		{"kafka", "_schemas"}, {"kafka", "connect-configs"}, {"kafka", "connect-offsets"}, {"kafka", "connect-status"},
		{"kafka", "_confluent-metrics"}, {"kafka", "__consumer_offsets"},
		{"rabbit", "amq.rabbitmq.reply-to.g1h2AA==.x"}, {"rabbit", "amq.gen-JzTY20BRgKO-HjmUJj0wLg"},
		{"rabbit", "jobs-in"}, {"kafka", "orders-in"}, {"nats", "delayed.orders"},
		// And the rest of the list.
		{"events", "jobs.late"}, {"mqtt", "orders.late"}, {"nats", "$JS.API.STREAM.DELETE.X"}, {"nats", "_INBOX.x"},
	}

	// validate lists every reserved part, once per sink.
	code, out, errOut := run(t, "validate", path)
	if code != 0 || !strings.Contains(out, "is valid") {
		t.Fatalf("validate: exit %d %q %q", code, out, errOut)
	}
	for _, want := range []string{
		`sink kafka (Kafka topics): beginning with "__", beginning with "_", "connect-configs", "connect-offsets", "connect-status", "orders-in" (ingest k-in reads it)`,
		`sink rabbit (RabbitMQ routing keys): beginning with "amq.", "jobs-in" (ingest r-in reads it)`,
		`sink events (RabbitMQ routing keys): "jobs.#" (ingest r-in reads it)`,
		`sink mqtt (RabbitMQ routing keys): every one (the sink publishes on "amq.topic"`,
		`sink nats (NATS subjects): beginning with "$", beginning with "_INBOX.", "delayed.>" (ingest n-in reads it)`,
	} {
		if strings.Count(errOut, want) != 1 {
			t.Errorf("validate does not print once %q:\n%s", want, errOut)
		}
	}

	route := func(name string) *envelope.Route {
		for i := range cfg.Ingest {
			if cfg.Ingest[i].Name == name {
				return daemon.Route(cfg, &cfg.Ingest[i])
			}
		}
		t.Fatalf("no ingest %s", name)
		return nil
	}
	now := time.Now()
	lim := daemon.Limits(cfg)
	refusedAtIngest := func(way string, d envelope.Decision) {
		t.Helper()
		if d.Action != envelope.Reject || envelope.CodeOf(d.Err) != envelope.CodeDestinationReserved ||
			!strings.HasPrefix(d.Err.Error(), "destination_reserved: ") {
			t.Errorf("%s: %v %s %v, want a reject with destination_reserved", way, d.Action, envelope.CodeOf(d.Err), d.Err)
		}
	}

	st := store.New(r.Client(), store.Options{Prefix: "reserved", Shards: 4})
	srv := admin.New(admin.Params{Listen: "127.0.0.1:0", Ops: service(cfg, st)})
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	guard := daemon.DestinationGuard(cfg)

	var lines []string
	for _, tg := range targets {
		what := tg.sink + " " + tg.dest
		// A header.
		in := &envelope.Incoming{Headers: envelope.Headers{{Key: envelope.HeaderDelay, Value: "1000"},
			{Key: envelope.HeaderSink, Value: tg.sink}, {Key: envelope.HeaderDestination, Value: tg.dest}}}
		refusedAtIngest(what+", a header", envelope.Parse(in, route("over"), lim, now, nil))
		// A template: {source.3:} copies the rest of the subject.
		in = &envelope.Incoming{Headers: envelope.Headers{{Key: envelope.HeaderDelay, Value: "1000"}}, Source: "fwd." + tg.sink + "." + tg.dest}
		refusedAtIngest(what+", a template", envelope.Parse(in, route("fwd-"+tg.sink), lim, now, nil))
		// The admin API.
		body := fmt.Sprintf(`{"delay":1000,"sink":%q,"destination":%q,"body":"x"}`, tg.sink, tg.dest)
		resp, err := http.Post("http://"+srv.Addr()+"/v1/messages", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e admin.ErrorBody
		if resp.StatusCode != http.StatusBadRequest || json.Unmarshal(b, &e) != nil || e.Field != "destination" ||
			!strings.Contains(e.Message, "destination_reserved: ") {
			t.Errorf("%s, POST /v1/messages: %d %s", what, resp.StatusCode, b)
		}
		// The scheduler, for a message parked by an older version.
		if err := guard(&envelope.Message{Ingest: "over", Sink: tg.sink, Destination: tg.dest}); err == nil ||
			!strings.HasPrefix(err.Error(), "destination_reserved: ") {
			t.Errorf("%s, the scheduler's check: %v", what, err)
		}
		// An import line, of the ingest that allows every other destination.
		lines = append(lines, importRecord("imp-"+fmt.Sprint(len(lines)), func(f map[string]string) {
			f["sink"], f["destination"], f["ingest"] = q(tg.sink), q(tg.dest), q("over")
		}))
	}
	file := filepath.Join(t.TempDir(), "in.jsonl")
	if err := os.WriteFile(file, []byte(strings.Join(lines, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = run(t, "import", "-c", path, "--in", file, "--on-error=skip")
	if code != 1 || strings.Count(errOut, "refused by the rules of ingest: destination_reserved: ") != len(targets) {
		t.Errorf("import: exit %d, want every line refused with destination_reserved:\n%s", code, errOut)
	}
	if s, err := st.Stats(context.Background()); err != nil || s.Parked != 0 || s.Dead != 0 {
		t.Errorf("something was written: %+v %v", s, err)
	}

	// Named literally by a pattern of the route, each is reachable.
	for _, tg := range []struct{ sink, dest string }{
		{"kafka", "_schemas"}, {"kafka", "connect-status"}, {"kafka", "orders-in"}, {"rabbit", "amq.rabbitmq.reply-to.g1h2AA==.x"},
		{"rabbit", "jobs-in"}, {"events", "jobs.late"}, {"mqtt", "orders.late"}, {"nats", "delayed.orders"},
	} {
		in := &envelope.Incoming{Headers: envelope.Headers{{Key: envelope.HeaderDelay, Value: "1000"},
			{Key: envelope.HeaderSink, Value: tg.sink}, {Key: envelope.HeaderDestination, Value: tg.dest}}}
		if d := envelope.Parse(in, route("open"), lim, now, nil); d.Action != envelope.Park || d.Message.Destination != tg.dest {
			t.Errorf("%s %s named literally: %v %v", tg.sink, tg.dest, d.Action, d.Err)
		}
		if err := guard(&envelope.Message{Ingest: "open", Sink: tg.sink, Destination: tg.dest}); err != nil {
			t.Errorf("%s %s named literally, the scheduler's check: %v", tg.sink, tg.dest, err)
		}
	}
}
