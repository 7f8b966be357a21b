package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// TestStartupFailures runs `delaybridge run` against every kind of server a
// new user can get wrong at start (Redis not running, wrong Redis, NATS or
// RabbitMQ credentials, a sink nobody listens for) and checks what the user
// sees: exit status 1, the last line "delaybridge: ..." naming the component
// and what to check, no panic or stack trace, no secret.
func TestStartupFailures(t *testing.T) {
	const (
		redisPass  = "redis-Right-5c1e"
		wrongPass  = "Wrong-Secret-77aa"
		natsPass   = "nats-Right-0b3d"
		rabbitPass = "rabbit-Right-91fe"
	)
	rs := testenv.Redis(t, testenv.WithArgs("--requirepass", redisPass))
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
		NoLog: true, NoSigs: true, Users: []*server.User{{Username: "db", Password: natsPass}}})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats not ready")
	}
	defer ns.Shutdown()
	rabbit := testenv.RabbitMQ(t)
	rabbit.AddUser(t, "startup", rabbitPass)

	dead := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)) // nothing listens here
	goodRedis := fmt.Sprintf("{addr: %q, password: %q}", rs.Addr, redisPass)
	natsIn := fmt.Sprintf(`{url: %q, user: db, password: %q, subject: "delayed.>", stream: DELAYED}`, ns.ClientURL(), natsPass)
	natsOut := fmt.Sprintf(`{url: %q, user: db, password: %q}`, ns.ClientURL(), natsPass)

	cases := []struct {
		name   string
		redis  string
		ingest string // the ingest's broker block, e.g. "nats: {...}"
		sink   string // the sink's broker block
		want   []string
	}{
		{"redis not running", fmt.Sprintf("{addr: %q}", dead), "nats: " + natsIn, "nats: " + natsOut,
			[]string{"redis", dead, "is Redis running"}},
		{"redis wrong password", fmt.Sprintf("{addr: %q, password: %q}", rs.Addr, wrongPass), "nats: " + natsIn, "nats: " + natsOut,
			[]string{"redis", "credentials"}},
		{"nats wrong password", goodRedis,
			fmt.Sprintf(`nats: {url: %q, user: db, password: %q, subject: "delayed.>", stream: DELAYED}`, ns.ClientURL(), wrongPass),
			"nats: " + natsOut, []string{"ingest in", "nats"}},
		{"nats sink unreachable", goodRedis, "nats: " + natsIn, fmt.Sprintf("nats: {url: %q}", "nats://"+dead),
			[]string{"sink out", dead}},
		{"rabbitmq wrong password", goodRedis, "nats: " + natsIn,
			fmt.Sprintf("rabbitmq: {url: %q}", fmt.Sprintf("amqp://startup:%s@%s/", wrongPass, fmt.Sprintf("127.0.0.1:%d", rabbit.Port))),
			[]string{"sink out", "rabbitmq"}},
		{"rabbitmq sink unreachable", goodRedis, "nats: " + natsIn,
			fmt.Sprintf("rabbitmq: {url: %q}", fmt.Sprintf("amqp://startup:%s@%s/", rabbitPass, dead)),
			[]string{"sink out", dead}},
		{"kafka ingest unreachable", goodRedis,
			fmt.Sprintf("kafka: {brokers: [%q], topic: delayed, group: db}", dead), "nats: " + natsOut,
			[]string{"ingest in", dead}},
	}
	bin := testenv.Build(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := fmt.Sprintf(`
redis: %s
ingest:
  - name: in
    %s
    route: {sink: out, destination: fired.x}
sinks:
  - name: out
    %s
`, c.redis, c.ingest, c.sink)
			path := filepath.Join(t.TempDir(), "config.yaml")
			if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
				t.Fatal(err)
			}
			p := testenv.StartProcess(t, bin, "run", "--config", path)
			code := p.Wait(60 * time.Second)
			out := p.Output()
			if code != 1 {
				t.Fatalf("exit status %d, want 1; output:\n%s", code, out)
			}
			for _, bad := range []string{"panic", "goroutine ", ".go:", redisPass, natsPass, rabbitPass, wrongPass} {
				if strings.Contains(out, bad) {
					t.Errorf("output contains %q:\n%s", bad, out)
				}
			}
			t.Logf("output:\n%s", out)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			last := lines[len(lines)-1]
			if !strings.HasPrefix(last, "delaybridge: ") {
				t.Fatalf("last line is not the error (%q); output:\n%s", last, out)
			}
			for _, w := range c.want {
				if !strings.Contains(strings.ToLower(last), strings.ToLower(w)) {
					t.Errorf("error line %q does not mention %q", last, w)
				}
			}
		})
	}
}
