package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/delaybridge/delaybridge/pkg/brokers" // registers the broker blocks

	"github.com/delaybridge/delaybridge/pkg/brokers/natsbroker"
	"github.com/delaybridge/delaybridge/pkg/config"
)

const minimal = `
redis:
  addr: 127.0.0.1:6379
  key_prefix: delaybridge
  shards: 16
admin:
  listen: 127.0.0.1:7070
ingest:
  - name: orders-in
    kafka:    {brokers: [127.0.0.1:9092], topic: delayed-orders, group: delaybridge}
    route:
      sink: rabbit
      destination: orders.expired
      allow_override: true
  - name: rabbit-in
    rabbitmq: {url: "amqp://guest:guest@127.0.0.1:5672/", queue: delayed-in}
    route: {sink: kafka, destination: out}
  - name: nats-in
    nats:     {url: "nats://127.0.0.1:4222", subject: delayed.>, stream: DELAYED, durable: delaybridge}
    route: {sink: nats, destination: fired}
sinks:
  - name: rabbit
    rabbitmq: {url: "amqp://guest:guest@127.0.0.1:5672/", exchange: ""}
  - name: kafka
    kafka:    {brokers: [127.0.0.1:9092]}
  - name: nats
    nats:     {url: "nats://127.0.0.1:4222", jetstream: true}
`

func noEnv(string) (string, bool) { return "", false }

func TestContractMinimalConfigIsValid(t *testing.T) {
	cfg, err := config.Parse([]byte(minimal), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Redis.Addr != "127.0.0.1:6379" || cfg.Redis.Shards != 16 || cfg.Admin.Listen != "127.0.0.1:7070" {
		t.Fatalf("redis/admin = %+v %+v", cfg.Redis, cfg.Admin)
	}
	if len(cfg.Ingest) != 3 || cfg.Ingest[0].Kind() != "kafka" || cfg.Ingest[1].Kind() != "rabbitmq" || cfg.Ingest[2].Kind() != "nats" {
		t.Fatalf("ingest = %+v", cfg.Ingest)
	}
	if !cfg.Ingest[0].Route.AllowOverride || cfg.Ingest[2].Broker.(*natsbroker.IngestConfig).Durable != "delaybridge" {
		t.Fatalf("ingest details = %+v %+v", cfg.Ingest[0].Route, cfg.Ingest[2].Broker)
	}
	if len(cfg.Sinks) != 3 || !cfg.Sinks[2].Broker.(*natsbroker.SinkConfig).JetStream {
		t.Fatalf("sinks = %+v", cfg.Sinks)
	}
}

func TestDefaults(t *testing.T) {
	cfg, err := config.Parse([]byte(`
redis: {addr: "localhost:6379"}
ingest:
  - name: n
    nats: {url: "nats://x:4222", subject: a.b, stream: S}
    route: {sink: s, destination: d}
sinks: [{name: s, nats: {url: "nats://x:4222"}}]
`), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"key_prefix", cfg.Redis.KeyPrefix, "delaybridge"},
		{"shards", cfg.Redis.Shards, 16},
		{"admin.listen", cfg.Admin.Listen, "127.0.0.1:7070"},
		{"log.level", cfg.Log.Level, "info"},
		{"lease", cfg.Scheduler.Lease.D(), 30 * time.Second},
		{"max_sleep", cfg.Scheduler.MaxSleep.D(), time.Second},
		{"max_attempts", cfg.Scheduler.MaxAttempts, 10},
		{"max_delay", cfg.Limits.MaxDelay.D(), 365 * 24 * time.Hour},
		{"max_payload_bytes", cfg.Limits.MaxPayloadBytes, 1 << 20},
		{"durable", cfg.Ingest[0].Broker.(*natsbroker.IngestConfig).Durable, "delaybridge_n"},
		{"ack_wait", cfg.Ingest[0].Broker.(*natsbroker.IngestConfig).AckWait.D(), 30 * time.Second},
		{"max_in_flight", cfg.Ingest[0].MaxInFlight, 1000},
		{"shutdown_timeout", cfg.ShutdownTimeout.D(), 30 * time.Second},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestEnvExpansion(t *testing.T) {
	env := map[string]string{"REDIS_ADDR": "10.0.0.1:6380", "SHARDS": "32", "PASS": "p@ss: #word"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	cfg, err := config.Parse([]byte(`
redis:
  addr: ${REDIS_ADDR}
  shards: ${SHARDS}
  password: ${PASS}
  key_prefix: ${PREFIX:-fallback}
  username: "literal $${NOT_EXPANDED}"
sinks: [{name: s, nats: {url: "nats://x:4222"}}]
`), lookup)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Redis.Addr != "10.0.0.1:6380" || cfg.Redis.Shards != 32 {
		t.Fatalf("redis = %+v", cfg.Redis)
	}
	// A value from the environment is data, never YAML.
	if cfg.Redis.Password != "p@ss: #word" {
		t.Fatalf("password = %q", cfg.Redis.Password)
	}
	if cfg.Redis.KeyPrefix != "fallback" || cfg.Redis.Username != "literal ${NOT_EXPANDED}" {
		t.Fatalf("prefix %q username %q", cfg.Redis.KeyPrefix, cfg.Redis.Username)
	}
}

func TestEveryProblemHasItsPath(t *testing.T) {
	cases := []struct {
		name string
		yaml string
		want []string // each must appear in the problems
	}{
		{"unknown keys at every level", `
redis: {addr: "a:1", adress: x}
colour: blue
ingest:
  - name: i
    nats: {url: "nats://x:1", subject: s, stremm: S}
    route: {sink: s, destination: d}
sinks: [{name: s, nats: {url: "nats://x:1"}}]
`, []string{"redis.adress: unknown key", "colour: unknown key", "ingest[0].nats.stremm (i): unknown key"}},
		{"env var unset", `
redis: {addr: "${NOPE}"}
sinks: [{name: s, nats: {url: "nats://x:1"}}]
`, []string{"redis.addr: environment variable NOPE is not set"}},
		{"wrong scalar types", `
redis: {addr: "a:1", shards: many, cluster: perhaps}
scheduler: {lease: 30, backoff: {multiplier: fast}}
sinks: [{name: s, nats: {url: "nats://x:1"}}]
`, []string{`redis.shards: "many" is not an integer`, `redis.cluster: "perhaps" is not true or false`,
			`scheduler.lease: "30" is not a duration`, `scheduler.backoff.multiplier: "fast" is not a number`}},
		{"wrong shapes", `
redis: [a, b]
sinks: {name: s}
`, []string{"redis: expected a mapping", "sinks: expected a list"}},
		{"redis addressing", `
redis: {addrs: ["a:1"]}
sinks: [{name: s, nats: {url: "nats://x:1"}}]
`, []string{"redis.addrs: addrs is for Redis Cluster"}},
		{"redis missing", `
sinks: [{name: s, nats: {url: "nats://x:1"}}]
`, []string{"redis.addr: required"}},
		{"sentinel mixed with addr", `
redis: {addr: "a:1", sentinel_addrs: ["s:26379"], master_name: m}
sinks: [{name: s, nats: {url: "nats://x:1"}}]
`, []string{"redis.sentinel_addrs: with Sentinel, give sentinel_addrs and master_name only"}},
		{"sentinel without master name", `
redis: {sentinel_addrs: ["s:26379", "bad"]}
sinks: [{name: s, nats: {url: "nats://x:1"}}]
`, []string{"redis.master_name: sentinel_addrs needs the master_name", `redis.sentinel_addrs[1]: "bad" is not host:port`}},
		{"cluster without addrs", `
redis: {cluster: true}
sinks: [{name: s, nats: {url: "nats://x:1"}}]
`, []string{"redis.addrs: cluster: true needs the seed nodes"}},
		{"bad values", `
redis: {addr: "nohostport", shards: 5000, key_prefix: "a{b}"}
admin: {listen: "7070"}
log: {level: loud, format: xml}
scheduler: {lease: 5s, publish_timeout: 10s, max_attempts: -1, batch_size: 20000, backoff: {initial: 2s, max: 1s, jitter: 2}}
limits: {max_delay: -1s}
sinks: [{name: s, nats: {url: "nats://x:1"}}]
`, []string{`redis.addr: "nohostport" is not host:port`, "redis.shards: 5000 is not between 1 and 1024",
			"redis.key_prefix", `admin.listen: "7070" is not host:port`, "log.level", "log.format",
			"scheduler.publish_timeout: 10s must be shorter than scheduler.lease 5s", "scheduler.max_attempts",
			"scheduler.batch_size", "scheduler.backoff.max", "scheduler.backoff.jitter", "limits.max_delay: must be positive"}},
		{"sinks", `
redis: {addr: "a:1"}
sinks:
  - {name: a, nats: {url: "nats://x:1"}, kafka: {brokers: ["b:1"]}}
  - {name: a, kafka: {brokers: []}}
  - {name: "", rabbitmq: {url: "http://x"}}
  - {name: c}
`, []string{"sinks[0] (a): give exactly one of kafka, nats, rabbitmq (got 2)", `sinks[1].name (a): "a" is used by another sink`,
			"sinks[1].kafka.brokers (a): at least one broker is required", "sinks[2].name: required",
			`sinks[2].rabbitmq.url: scheme "http" is not one of amqp, amqps`, "sinks[3] (c): give exactly one"}},
		{"urls and ports", `
redis: {addr: "a:70000", sentinel_addrs: ["s:"]}
sinks:
  - {name: a, nats: {url: "127.0.0.1:4222"}}
  - {name: b, rabbitmq: {url: "amqp://guest:guest@127.0.0.1:99999/"}}
  - {name: c, kafka: {brokers: ["b:0"]}}
`, []string{"redis.addr: port 70000 is not one of 1 to 65535", "redis.sentinel_addrs[0]: the port is missing (host:port)",
			"sinks[0].nats.url (a): not a URL: give its scheme and host, such as nats://127.0.0.1:4222",
			"sinks[1].rabbitmq.url (b): port 99999 is not one of 1 to 65535", "sinks[2].kafka.brokers[0] (c): port 0 is not one of 1 to 65535"}},
		{"admin", `
redis: {addr: "a:1"}
admin: {pprof: true, allowed_hosts: ["admin.example.com", "10.0.0.7", "::1", "", "http://x", "host:7070", "bad host", "-x.example", "a..b"]}
sinks: [{name: s, nats: {url: "nats://x:1"}}]
`, []string{"admin.pprof: requires admin.token", `admin.allowed_hosts[3]: "" is empty`,
			`admin.allowed_hosts[4]: "http://x" must be a host name or an IP address, without scheme, port or path`,
			`admin.allowed_hosts[5]: "host:7070" must be`, `admin.allowed_hosts[6]: "bad host" must be`,
			`admin.allowed_hosts[7]: "-x.example" is not a valid host name`, `admin.allowed_hosts[8]: "a..b" is not a valid host name`}},
		{"second round knobs", `
redis: {addr: "a:1"}
scheduler: {lease: 30s, dedupe_window: 10s}
sinks:
  - {name: s, nats: {url: "nats://x:1"}, max_rate: -5}
  - {name: t, nats: {url: "nats://x:1"}, max_rate: 1e9}
  - {name: u, nats: {url: "nats://x:1"}, max_rate: 0.0001}
ingest:
  - name: n
    nats: {url: "nats://x:1", subject: a}
    route: {sink: s, destination: d, missed: sometimes}
`, []string{"scheduler.dedupe_window: 10s is shorter than scheduler.lease 30s",
			"sinks[0].max_rate (s): must not be negative", "sinks[1].max_rate (t): 1e+09 messages/s is over",
			"sinks[2].max_rate (u): 0.0001 messages/s is under one message in 1000 s",
			`ingest[0].route.missed (n): "sometimes" is not one of once, all, skip`}},
		{"dedupe window bounds", `
redis: {addr: "a:1"}
scheduler: {dedupe_window: 200h}
sinks: [{name: s, nats: {url: "nats://x:1"}}]
`, []string{"scheduler.dedupe_window: 200h0m0s is over 168h0m0s"}},
		{"negative dedupe window", `
redis: {addr: "a:1"}
scheduler: {dedupe_window: -1s}
sinks: [{name: s, nats: {url: "nats://x:1"}}]
`, []string{"scheduler.dedupe_window: must not be negative"}},
		{"no sinks", `
redis: {addr: "a:1"}
`, []string{"sinks: at least one sink is required"}},
		{"negative ack_wait", `
redis: {addr: "a:1"}
ingest:
  - name: j
    nats: {url: "nats://x:1", subject: a, stream: S, ack_wait: -1s}
    route: {sink: s, destination: d}
sinks: [{name: s, nats: {url: "nats://x:1"}}]
`, []string{"ingest[0].nats.ack_wait (j): must be positive"}},
		{"ingests", `
redis: {addr: "a:1"}
ingest:
  - name: k
    kafka: {brokers: []}
    route: {sink: nope}
  - name: k
    rabbitmq: {url: "amqp://x"}
    route: {sink: s, destination: d, allowed_sinks: [s]}
  - name: n
    nats: {url: "nats://x:1", subject: a, durable: d}
    route: {sink: s, destination: d, allow_override: true, allowed_sinks: [zzz], allowed_destinations: ["fired.a*"], default_delay: 9000h}
  - name: none
    route: {sink: s, destination: d}
limits: {max_delay: 24h}
sinks: [{name: s, nats: {url: "nats://x:1"}}]
`, []string{"ingest[0].kafka.brokers (k): at least one broker", "ingest[0].kafka.topic (k): required", "ingest[0].kafka.group (k): required",
			`ingest[0].route.sink (k): "nope" names no sink`, "ingest[0].route.destination (k): required",
			`ingest[1].name (k): "k" is used by another ingest`, "ingest[1].rabbitmq.queue (k): required",
			"ingest[1].route.allow_override (k)", "ingest[2].nats.durable (n): a durable consumer needs a JetStream stream",
			`ingest[2].route.allowed_sinks[0] (n): "zzz" names no sink`, `ingest[2].route.allowed_destinations[0] (n): "fired.a*": in a NATS subject pattern a wildcard is a whole token`,
			"ingest[2].route.default_delay (n): 9000h0m0s is over limits.max_delay", "ingest[3] (none): give exactly one of kafka, nats, rabbitmq (got 0)"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := config.Parse([]byte(c.yaml), noEnv)
			var ps config.Problems
			if !errors.As(err, &ps) {
				t.Fatalf("err = %v, want Problems", err)
			}
			text := err.Error()
			for _, w := range c.want {
				if !strings.Contains(text, w) {
					t.Errorf("missing %q in:\n%s", w, text)
				}
			}
		})
	}
}

// pprof is accepted with a token, from the file or from token_file, and
// valid allowed_hosts are not reported.
func TestPprofWithTokenAndAllowedHosts(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, admin := range []string{
		`{pprof: true, token: "s3cret", allowed_hosts: ["admin.example.com", "10.0.0.7", "::1", "localhost", "host_1.internal."]}`,
		`{pprof: true, token_file: "` + tokenFile + `"}`,
	} {
		cfg := "redis: {addr: \"a:1\"}\nadmin: " + admin + "\nsinks: [{name: s, nats: {url: \"nats://x:1\"}}]\n"
		if _, err := config.Parse([]byte(cfg), noEnv); err != nil {
			t.Errorf("admin: %s: %v", admin, err)
		}
	}
}

func TestEmptyAndBrokenYAML(t *testing.T) {
	for _, in := range []string{"", "redis: [unclosed", "\t- bad"} {
		_, err := config.Parse([]byte(in), noEnv)
		var ps config.Problems
		if !errors.As(err, &ps) || len(ps) == 0 {
			t.Errorf("Parse(%q) = %v, want Problems", in, err)
		}
	}
}

// The example shipped with the project must stay valid.
func TestExampleConfigIsValid(t *testing.T) {
	path := filepath.Join("..", "..", "config.example.yaml") // go test runs in the package's directory
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	if _, err := config.Parse(data, func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err != nil {
		t.Fatalf("config.example.yaml: %v", err)
	}
}
