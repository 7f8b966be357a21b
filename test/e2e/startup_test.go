package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// TestStartupFailures runs `delaybridge run` against every kind of server a
// new user can get wrong at start (Redis not running, wrong Redis, NATS or
// RabbitMQ credentials) and checks what the
// user sees: exit status 1, the last line "delaybridge: ..." naming the
// component and what to check, no panic or stack trace, no secret. A sink
// or an ingest whose broker does not answer is not one of them
// (TestStartsWithASinkDown, TestStartsWithAnIngestDown).
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
		// After redis.start_timeout (a start waits for a Redis failing
		// over or not listening yet, saying so).
		{"redis not running", fmt.Sprintf("{addr: %q, start_timeout: 1s}", dead), "nats: " + natsIn, "nats: " + natsOut,
			[]string{"redis", dead, "is Redis running"}},
		{"redis wrong password", fmt.Sprintf("{addr: %q, password: %q}", rs.Addr, wrongPass), "nats: " + natsIn, "nats: " + natsOut,
			[]string{"redis", "credentials"}},
		{"nats wrong password", goodRedis,
			fmt.Sprintf(`nats: {url: %q, user: db, password: %q, subject: "delayed.>", stream: DELAYED}`, ns.ClientURL(), wrongPass),
			"nats: " + natsOut, []string{"ingest in", "nats"}},
		{"rabbitmq wrong password", goodRedis, "nats: " + natsIn,
			fmt.Sprintf("rabbitmq: {url: %q}", fmt.Sprintf("amqp://startup:%s@%s/", wrongPass, fmt.Sprintf("127.0.0.1:%d", rabbit.Port))),
			[]string{"sink out", "rabbitmq"}},
	}
	bin := testenv.Build(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// admin.listen on a free port: the default, 7070, may be taken
			// (a daemon of a developer's), and is bound first.
			cfg := fmt.Sprintf(`
redis: %s
admin: {listen: "127.0.0.1:%d"}
ingest:
  - name: in
    %s
    route: {sink: out, destination: fired.x}
sinks:
  - name: out
    %s
`, c.redis, testenv.FreePort(t), c.ingest, c.sink)
			p := runConfig(t, bin, cfg)
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

// TestStartsWithASinkDown: a sink whose broker does not answer at start
// (down, or not started yet: here a proxy that refuses connections; or
// hung: a server that takes the connection and says nothing) does not stop
// the daemon, which would stop every ingest and every other sink
// with it: the daemon starts, /readyz answers 503 naming the sink, the
// messages of the other sink are delivered, and the sink's own are held
// until its broker answers, then delivered.
func TestStartsWithASinkDown(t *testing.T) {
	rs := testenv.Redis(t)
	ns := testenv.NATS(t)
	rabbit := testenv.RabbitMQ(t)
	natsProxy := testenv.NewProxy(t, strings.TrimPrefix(ns.URL, "nats://"))
	rabbitProxy := testenv.NewProxy(t, fmt.Sprintf("127.0.0.1:%d", rabbit.Port))
	natsProxy.Down(t)
	rabbitProxy.Down(t)
	hung, _ := hungServer(t)
	js, fired := streamsAndFired(t, ns, map[string]string{"DELAYED": "delayed.>", "FIRED": "fired.>"})
	admin := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	cfg := fmt.Sprintf(`
redis: {addr: %q}
admin: {listen: %q}
scheduler: {max_sleep: 100ms}
ingest:
  - name: in
    nats: {url: %q, subject: "delayed.>", stream: DELAYED}
    route: {sink: ok, destination: fired.ok, allow_override: true, allowed_destinations: ["fired.*"]}
sinks:
  - name: ok
    nats: {url: %q, jetstream: true}
  - name: later
    nats: {url: "nats://%s", jetstream: true}
  - name: rabbit
    rabbitmq: {url: "amqp://guest:guest@%s/"}
  - name: hung
    nats: {url: "nats://%s", jetstream: true}
`, rs.Addr, admin, ns.URL, ns.URL, natsProxy.Addr, rabbitProxy.Addr, hung)
	p, readyz := runWithBrokersDown(t, cfg, admin)
	if code, body := readyz(); code != http.StatusServiceUnavailable || !strings.Contains(body, "later") || !strings.Contains(body, "rabbit") || !strings.Contains(body, "hung") {
		t.Errorf("/readyz with three sinks down: %d %s, want 503 naming them", code, body)
	}
	publish := func(id, sink, dest string) {
		publishDelayed(t, js, "delayed.x", id, "x-delay-sink", sink, "x-delay-destination", dest)
	}
	publish("to-ok", "ok", "fired.ok")
	publish("to-later", "later", "fired.later")
	next := func(what string) string { return nextFired(t, fired, p, what) }
	if id := next("the message to the sink that is up"); id != "to-ok" {
		t.Fatalf("delivered %s first, while its sink's broker was down", id)
	}
	natsProxy.Up(t)
	rabbitProxy.Up(t)
	if id := next("the held message once its sink's broker answers"); id != "to-later" {
		t.Fatalf("delivered %s, want to-later", id)
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		_, body := readyz()
		return !strings.Contains(body, "later") && !strings.Contains(body, "rabbit")
	}, "/readyz no longer naming the sinks whose brokers answer")
	if code, body := readyz(); code != http.StatusServiceUnavailable || !strings.Contains(body, "hung") {
		t.Errorf("/readyz with the hung server's sink down: %d %s, want 503 naming it", code, body)
	}
}

// hungServer listens on a free loopback port and takes every connection,
// answering nothing: a broker that hangs. Each connection is sent on conns
// (when there is room) and closed at the end of the test.
func hungServer(t *testing.T) (addr string, conns <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ch := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
			select {
			case ch <- c:
			default:
			}
		}
	}()
	return ln.Addr().String(), ch
}

// TestStartDialsTheBrokersAtOnce: the daemon connects to its sinks' brokers
// at once, not one after another, so that brokers that take the connection
// and say nothing delay the start by one dial timeout, not one each; and a
// SIGTERM while it connects stops it at once, with exit status 0 (a stop,
// not a failure), whatever the brokers do.
func TestStartDialsTheBrokersAtOnce(t *testing.T) {
	rs := testenv.Redis(t)
	hungA, connsA := hungServer(t)
	hungB, connsB := hungServer(t)
	hungK, _ := hungServer(t)
	cfg := fmt.Sprintf(`
redis: {addr: %q}
admin: {listen: "127.0.0.1:%d"}
ingest:
  - name: in
    kafka: {brokers: [%q], topic: delayed, group: db}
    route: {sink: a, destination: fired}
sinks:
  - name: a
    rabbitmq: {url: "amqp://guest:guest@%s/"}
  - name: b
    rabbitmq: {url: "amqp://guest:guest@%s/"}
`, rs.Addr, testenv.FreePort(t), hungK, hungA, hungB)
	p := runConfig(t, testenv.Build(t), cfg)
	handshake := func(conns <-chan net.Conn, what string) net.Conn {
		select {
		case c := <-conns:
			if _, err := io.ReadFull(c, make([]byte, 8)); err != nil { // AMQP's protocol header
				t.Fatalf("%s: %v\n%s", what, err, p.Output())
			}
			return c
		case <-time.After(60 * time.Second):
			t.Fatalf("%s: no connection in 60 s\n%s", what, p.Output())
			return nil
		}
	}
	a := handshake(connsA, "sink a's broker")
	handshake(connsB, "sink b's broker")
	// Dialled one after another, a's handshake would have timed out and
	// its connection closed before b's was made.
	_ = a.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := a.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("sink a's connection, once sink b's broker was dialled: %v, want it still waiting for the broker", err)
	}
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(60 * time.Second); code != 0 {
		t.Fatalf("SIGTERM while connecting: exit status %d, want 0\n%s", code, p.Output())
	}
	if out := p.Output(); !strings.Contains(out, "stopped while starting") {
		t.Errorf("SIGTERM while connecting: the output does not say it stopped while starting:\n%s", out)
	}
}

// TestAdminPortTakenStopsTheStartFirst: an admin.listen port that is taken
// (another instance running on this host) stops the start before any
// broker is dialled, so that a second start does not join consumer groups
// (making the running members rebalance) only to fail after: here the
// sink's broker is one that never answers, which the start would wait for.
func TestAdminPortTakenStopsTheStartFirst(t *testing.T) {
	rs := testenv.Redis(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	hung, conns := hungServer(t)
	cfg := fmt.Sprintf(`
redis: {addr: %q}
admin: {listen: %q}
ingest:
  - name: in
    rabbitmq: {url: "amqp://guest:guest@%s/", queue: delayed-in}
    route: {sink: out, destination: fired}
sinks:
  - name: out
    rabbitmq: {url: "amqp://guest:guest@%s/"}
`, rs.Addr, taken.Addr().String(), hung, hung)
	p := runConfig(t, testenv.Build(t), cfg)
	if code := p.Wait(60 * time.Second); code != 1 {
		t.Fatalf("exit status %d with admin.listen taken, want 1\n%s", code, p.Output())
	}
	if out := p.Output(); !strings.Contains(out, "admin: ") || !strings.Contains(out, "address already in use") {
		t.Errorf("the error does not name the admin port:\n%s", out)
	}
	select {
	case <-conns:
		t.Errorf("a broker was dialled before the taken admin port stopped the start:\n%s", p.Output())
	default:
	}
}

// TestStartsWithAnIngestDown: an ingest whose broker does not answer at
// start (NATS and RabbitMQ behind a proxy that refuses connections, Kafka
// at an address where nothing listens) does not stop the daemon, which
// would stop every sink with it: messages already parked, and those of the
// ingest that is up, are delivered; /readyz answers 503 naming the ingests
// that are down; an ingest connects when its broker answers and delivers
// what was published meanwhile.
func TestStartsWithAnIngestDown(t *testing.T) {
	rs := testenv.Redis(t)
	ns := testenv.NATS(t)
	rabbit := testenv.RabbitMQ(t)
	natsProxy := testenv.NewProxy(t, strings.TrimPrefix(ns.URL, "nats://"))
	rabbitProxy := testenv.NewProxy(t, fmt.Sprintf("127.0.0.1:%d", rabbit.Port))
	natsProxy.Down(t)
	rabbitProxy.Down(t)
	dead := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)) // nothing listens here
	js, fired := streamsAndFired(t, ns, map[string]string{"UP": "up.>", "LATER": "later.>", "FIRED": "fired.>"})
	admin := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	cfg := fmt.Sprintf(`
redis: {addr: %q}
admin: {listen: %q}
scheduler: {max_sleep: 100ms}
ingest:
  - name: up
    nats: {url: %q, subject: "up.>", stream: UP}
    route: {sink: out, destination: fired.up}
  - name: later
    nats: {url: "nats://%s", subject: "later.>", stream: LATER}
    route: {sink: out, destination: fired.later}
  - name: rabbit
    rabbitmq: {url: "amqp://guest:guest@%s/", queue: delayed-in}
    route: {sink: out, destination: fired.rabbit}
  - name: kafka
    kafka: {brokers: [%q], topic: delayed, group: db}
    route: {sink: out, destination: fired.kafka}
sinks:
  - name: out
    nats: {url: %q, jetstream: true}
`, rs.Addr, admin, ns.URL, natsProxy.Addr, rabbitProxy.Addr, dead, ns.URL)
	p, readyz := runWithBrokersDown(t, cfg, admin)
	if code, body := readyz(); code != http.StatusServiceUnavailable ||
		!strings.Contains(body, "ingest later") || !strings.Contains(body, "ingest rabbit") || !strings.Contains(body, "ingest kafka") {
		t.Errorf("/readyz with three ingests down: %d %s, want 503 naming them", code, body)
	}
	publish := func(subject, id string) { publishDelayed(t, js, subject, id) }
	next := func(what string) string { return nextFired(t, fired, p, what) }
	publish("later.x", "to-later") // read once its ingest connects
	publish("up.x", "to-up")
	if id := next("the message of the ingest that is up"); id != "to-up" {
		t.Fatalf("delivered %s first, while its ingest's broker was down", id)
	}
	natsProxy.Up(t)
	if id := next("the message published while its ingest's broker was down"); id != "to-later" {
		t.Fatalf("delivered %s, want to-later", id)
	}
	rabbitProxy.Up(t)
	testenv.Eventually(t, 30*time.Second, func() bool {
		_, body := readyz()
		return !strings.Contains(body, "ingest later") && !strings.Contains(body, "ingest rabbit")
	}, "/readyz no longer naming the ingests whose brokers answer")
	if code, body := readyz(); code != http.StatusServiceUnavailable || !strings.Contains(body, "ingest kafka") {
		t.Errorf("/readyz with the Kafka ingest down: %d %s, want 503 naming it", code, body)
	}
}

// runConfig writes cfg to a file of the test's and starts `bin run` with
// it.
func runConfig(t *testing.T, bin, cfg string) *testenv.Process {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return testenv.StartProcess(t, bin, "run", "--config", path)
}

// runWithBrokersDown runs the daemon with cfg, whose admin server listens on
// admin, and waits until that server answers; it fails the test if the
// daemon exits meanwhile (some of its brokers do not answer: it must start
// all the same). readyz asks GET /readyz (0 and the error when it cannot).
func runWithBrokersDown(t *testing.T, cfg, admin string) (p *testenv.Process, readyz func() (int, string)) {
	t.Helper()
	p = runConfig(t, testenv.Build(t), cfg)
	readyz = func() (int, string) {
		resp, err := http.Get("http://" + admin + "/readyz")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		if p.Exited() {
			t.Fatalf("delaybridge exited with some of its brokers down:\n%s", p.Output())
		}
		code, _ := readyz()
		return code != 0
	}, "the admin API answering")
	return p, readyz
}

// streamsAndFired creates the streams (name: subject) on ns and subscribes
// to fired.> there, where the tests' sinks publish.
func streamsAndFired(t *testing.T, ns *testenv.NATSServer, streams map[string]string) (jetstream.JetStream, *nats.Subscription) {
	t.Helper()
	nc, js := ns.Client(t)
	for name, subj := range streams {
		if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: name, Subjects: []string{subj}}); err != nil {
			t.Fatal(err)
		}
	}
	fired, err := nc.SubscribeSync("fired.>")
	if err != nil {
		t.Fatal(err)
	}
	return js, fired
}

// publishDelayed publishes the message id on subject, due in 100 ms, with
// the headers given as name, value pairs.
func publishDelayed(t *testing.T, js jetstream.JetStream, subject, id string, headers ...string) {
	t.Helper()
	m := nats.NewMsg(subject)
	m.Data = []byte(id)
	m.Header.Set("x-message-id", id)
	m.Header.Set("x-delay", "100ms")
	for i := 0; i+1 < len(headers); i += 2 {
		m.Header.Set(headers[i], headers[i+1])
	}
	if _, err := js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

// nextFired returns the ID of the next message on fired (30 s at most;
// the daemon p's output with the failure).
func nextFired(t *testing.T, fired *nats.Subscription, p *testenv.Process, what string) string {
	t.Helper()
	m, err := fired.NextMsg(30 * time.Second)
	if err != nil {
		t.Fatalf("%s: %v\n%s", what, err, p.Output())
	}
	return m.Header.Get("x-message-id")
}
