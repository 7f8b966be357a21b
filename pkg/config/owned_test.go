package config_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/destination"
)

// The dead letters' destination is reserved like what an ingest
// consumes, on every sink of the dead sink's broker kind (another sink may
// reach the same cluster): a publisher's message sent there would pass for
// a dead letter (the security probe delivered one, its dead reason
// forged). A route's allowed_destinations that names it literally opens
// it; a destination that only begins with it is another one.
func TestDeadLetterDestinationIsReserved(t *testing.T) {
	cfg, err := config.Parse([]byte(`
redis: {addr: "a:1"}
ingest:
  - name: in
    nats: {url: "nats://127.0.0.1:1", subject: "delayed.>"}
    route: {sink: out, destination: fired.x, allow_override: true}
sinks:
  - name: out
    nats: {url: "nats://127.0.0.1:1"}
  - name: other
    nats: {url: "nats://127.0.0.1:1"}
  - name: rabbit
    rabbitmq: {url: "amqp://127.0.0.1:1", exchange: ""}
dead: {sink: out, destination: delaybridge.dead}
`), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	out, _ := cfg.SinkDestinations("out")
	other, _ := cfg.SinkDestinations("other")
	rabbit, _ := cfg.SinkDestinations("rabbit")
	for _, c := range []struct {
		syn     destination.Syntax
		dest    string
		allowed []string
		ok      bool
	}{
		{out, "delaybridge.dead", []string{">"}, false},
		{out, "delaybridge.dead", []string{"delaybridge.dead"}, true},
		{out, "delaybridge.deadline", []string{">"}, true},
		{other, "delaybridge.dead", []string{">"}, false}, // maybe the same cluster
		{rabbit, "delaybridge.dead", []string{"#"}, true}, // another broker
	} {
		err := c.syn.Check(c.dest, c.allowed, true)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, destination.ErrReserved)) {
			t.Errorf("%s under %v: %v, want allowed %v", c.dest, c.allowed, err, c.ok)
		}
	}
	if refused := strings.Join(cfg.Refused(), "\n"); !strings.Contains(refused, `"delaybridge.dead" (dead letters go there)`) {
		t.Errorf("Refused() does not list the dead letters' destination:\n%s", refused)
	}
}
