package config_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/delaybridge/delaybridge/pkg/config"
)

func problems(t *testing.T, yaml string) []string {
	t.Helper()
	_, err := config.Parse([]byte(yaml), noEnv)
	var ps config.Problems
	if !errors.As(err, &ps) {
		t.Fatalf("Parse = %v, want Problems", err)
	}
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

// A value that cannot be read is reported once, and the checks of meaning
// run on the rest of the file read completely: nothing that follows from
// the value's absence is reported.
func TestOnlyTheRealProblemAfterADecodingError(t *testing.T) {
	cases := []struct {
		name, yaml string
		want       []string
	}{
		{"a duration without its unit", `
redis: {addr: 127.0.0.1:6379}
scheduler:
  lease: 30
sinks:
  - name: kafka
    kafka: {brokers: [127.0.0.1:9092]}
`, []string{`scheduler.lease: "30" is not a duration; write it with a unit, e.g. 30s, 500ms, 5m`}},
		{"a string where a list goes", `
redis: {addr: 127.0.0.1:6379}
ingest:
  - name: in
    kafka: {brokers: [127.0.0.1:9092], topic: t, group: g}
    route: {sink: kafka, destination: out}
sinks:
  - name: kafka
    kafka: {brokers: 127.0.0.1:9092}
`, []string{`sinks[0].kafka.brokers (kafka): expected a list, got "127.0.0.1:9092"`}},
		{"a sink name that cannot be read: no lookup of the routes' sinks in it", `
redis: {addr: 127.0.0.1:6379}
ingest:
  - name: in
    kafka: {brokers: [127.0.0.1:9092], topic: t, group: g}
    route: {sink: kafka, destination: out, allowed_sinks: [kafka], allow_override: true, allowed_destinations: ["*"]}
sinks:
  - name: [kafka]
    kafka: {brokers: [127.0.0.1:9092]}
dead: {sink: kafka, destination: dead}
`, []string{`sinks[0].name: expected a string, got a list`}},
		{"a lease that cannot be read is not compared with publish_timeout", `
redis: {addr: 127.0.0.1:6379}
scheduler: {lease: 1 minute, publish_timeout: 40s}
sinks: [{name: s, nats: {url: "nats://127.0.0.1:4222"}}]
`, []string{`scheduler.lease: "1 minute" is not a duration; write it with a unit, e.g. 30s, 500ms, 5m`}},
		{"an unset variable is not reported again as missing", `
redis: {addr: "${REDIS_ADDR}"}
admin: {pprof: true, token: "${ADMIN_TOKEN}"}
sinks: [{name: s, nats: {url: "nats://127.0.0.1:4222"}}]
`, []string{
			"redis.addr: environment variable REDIS_ADDR is not set (export it, or write ${REDIS_ADDR:-default} for a default)",
			"admin.token: environment variable ADMIN_TOKEN is not set (export it, or write ${ADMIN_TOKEN:-default} for a default)"}},
		{"a key given twice: the first is read, the rest of the file too", `
redis: {addr: 127.0.0.1:6379}
scheduler:
  lease: 20s
  lease: 40s
sinks: [{name: s, nats: {url: "nats://127.0.0.1:4222"}}]
`, []string{"scheduler.lease: key given twice, on lines 4 and 5; give it once (merge what the two hold)"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := problems(t, c.yaml); !slices.Equal(got, c.want) {
				t.Errorf("problems:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(c.want, "\n  "))
			}
		})
	}
}

// Problems are listed in the order of the file, whichever pass found
// them; a problem about something missing stands where its parent is, and
// one about something not in the file at all comes last.
func TestProblemsInTheOrderOfTheFile(t *testing.T) {
	got := problems(t, `
log: {level: loud}
redis: {addr: nohost, shards: 5000}
colour: red
scheduler:
  batch_size: 0x
  max_attempts: -1
ingest:
  - name: in
    nats: {url: "nats://127.0.0.1:4222", subject: a.>, stream: A}
    route: {sink: nowhere, destination: out}
`)
	want := []string{
		`log.level: "loud" is not one of debug, info, warn, error`,
		`redis.addr: "nohost" is not host:port`,
		"redis.shards: 5000 is not between 1 and 1024",
		"colour: unknown key (known keys here: admin, dead, encryption, ingest, limits, log, redis, scheduler, shutdown_timeout, sinks, tracing)",
		`scheduler.batch_size: "0x" is not an integer`,
		"scheduler.max_attempts: must be at least 1",
		`ingest[0].route.sink (in): "nowhere" names no sink in sinks`,
		"sinks: at least one sink is required",
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}
