package cli

// The command line as a newcomer meets it: health probes that
// pass only on delaybridge's own answer, validate with a positional file,
// send that says what it sent, flags only where they act, and no log line
// of a running daemon's in a one-shot command.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/admin"
	"github.com/delaybridge/delaybridge/pkg/store"
)

func TestHealthProbesOnlyDelaybridge(t *testing.T) {
	r := testenv.Redis(t)
	st := store.New(r.Client(), store.Options{Prefix: "health", Shards: 2})
	var notReady atomic.Value
	notReady.Store("")
	ready := func() error {
		if why := notReady.Load().(string); why != "" {
			return errors.New(why)
		}
		return nil
	}
	srv := admin.New(admin.Params{Listen: "127.0.0.1:0", Store: st, Ready: ready})
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	base := "http://" + srv.Addr()

	// Something else on a port: a web page that answers 200 to every path.
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprint(w, "<html>a dashboard</html>")
	}))
	defer other.Close()
	// And one that answers JSON, but not delaybridge's.
	otherJSON := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"healthy":true}`)
	}))
	defer otherJSON.Close()

	cases := []struct {
		name string
		args []string
		code int
		out  string // in stdout (code 0) or stderr
	}{
		{"--admin: /healthz", []string{"health", "--admin", base}, 0, base + "/healthz: ok"},
		{"--admin --ready: /readyz", []string{"health", "--admin", base, "--ready"}, 0, base + "/readyz: ready"},
		{"--url --ready: /readyz", []string{"health", "--url", base, "--ready"}, 0, base + "/readyz: ready"},
		{"--url naming /readyz", []string{"health", "--url", base + "/readyz"}, 0, base + "/readyz: ready"},
		{"--url naming /healthz with --ready", []string{"health", "--url", base + "/healthz", "--ready"}, 2, "--ready asks /readyz"},
		{"--url and --admin naming two servers", []string{"health", "--url", base, "--admin", other.URL}, 2, "name two servers"},
		{"a path that is not a probe", []string{"health", "--url", base + "/"}, 0, base + "/healthz: ok"},
		{"a path that is not a probe", []string{"health", "--url", base + "/metrics"}, 2, "give the admin server's base URL"},
		{"a web page is not delaybridge", []string{"health", "--admin", other.URL}, 1, "not delaybridge's answer"},
		{"a web page is not delaybridge, --ready", []string{"health", "--url", other.URL, "--ready"}, 1, "not delaybridge's answer"},
		{"other JSON is not delaybridge", []string{"health", "--admin", otherJSON.URL, "--ready"}, 1, "not delaybridge's answer"},
		{"nothing listening", []string{"health", "--admin", "http://127.0.0.1:1"}, 1, "is the daemon running"},
		{"nothing listening, another command", []string{"list", "--admin", "http://127.0.0.1:1"}, 1, "is the daemon running"},
	}
	for _, c := range cases {
		code, out, errOut := run(t, c.args...)
		got := out
		if code != 0 {
			got = errOut
		}
		if code != c.code || !strings.Contains(got, c.out) {
			t.Errorf("%s: %q: exit %d, stdout %q, stderr %q; want exit %d and %q", c.name, c.args, code, out, errOut, c.code, c.out)
		}
	}

	notReady.Store("redis: connection refused")
	if code, _, errOut := run(t, "health", "--admin", base, "--ready"); code != 1 || !strings.Contains(errOut, "not ready: redis: connection refused") {
		t.Errorf("not ready: exit %d, %q; want 1 with the reason", code, errOut)
	}
	if code, _, _ := run(t, "health", "--admin", base); code != 0 {
		t.Errorf("/healthz while not ready: exit %d, want 0 (the process runs)", code)
	}
	notReady.Store("")

	// $DELAYBRIDGE_ADMIN is --admin's default.
	t.Setenv("DELAYBRIDGE_ADMIN", base)
	if code, out, errOut := run(t, "health", "--ready"); code != 0 || !strings.Contains(out, base+"/readyz") {
		t.Errorf("DELAYBRIDGE_ADMIN: exit %d, %q %q", code, out, errOut)
	}
}

// With --config, health asks admin.listen, over HTTPS when admin.tls is
// set, trusting exactly that certificate.
func TestHealthFromTheConfiguration(t *testing.T) {
	r := testenv.Redis(t)
	st := store.New(r.Client(), store.Options{Prefix: "health", Shards: 2})
	certs := testenv.NewCerts(t, "client")
	srv := admin.New(admin.Params{Listen: "127.0.0.1:0", Store: st, TLS: certs.ServerTLS(t, false)})
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	_, port, _ := strings.Cut(srv.Addr(), ":")

	cfg := writeConfig(t, fmt.Sprintf(`
redis: {addr: "%s"}
admin: {listen: "0.0.0.0:%s", tls: {cert_file: %q, key_file: %q}}
sinks: [{name: s, nats: {url: "nats://127.0.0.1:4222"}}]
`, r.Addr, port, certs.ServerCert, certs.ServerKey))
	if code, out, errOut := run(t, "health", "-c", cfg, "--ready"); code != 0 || out != "https://127.0.0.1:"+port+"/readyz: ready\n" {
		t.Errorf("health -c (admin.tls, listen 0.0.0.0): exit %d, %q %q; want https on loopback", code, out, errOut)
	}

	// Another certificate than the configured one is not the daemon's.
	otherCerts := testenv.NewCerts(t, "client")
	wrong := writeConfig(t, fmt.Sprintf(`
redis: {addr: "%s"}
admin: {listen: "127.0.0.1:%s", tls: {cert_file: %q, key_file: %q}}
sinks: [{name: s, nats: {url: "nats://127.0.0.1:4222"}}]
`, r.Addr, port, otherCerts.ServerCert, otherCerts.ServerKey))
	if code, _, errOut := run(t, "health", "-c", wrong); code != 1 || !strings.Contains(errOut, "not the one in admin.tls.cert_file") {
		t.Errorf("a server with another certificate: exit %d, %q", code, errOut)
	}

	// Without admin.tls the probe speaks HTTP, which this server refuses.
	plain := writeConfig(t, fmt.Sprintf(`
redis: {addr: "%s"}
admin: {listen: "127.0.0.1:%s"}
sinks: [{name: s, nats: {url: "nats://127.0.0.1:4222"}}]
`, r.Addr, port))
	if code, _, _ := run(t, "health", "-c", plain); code != 1 {
		t.Errorf("http to an https server: exit %d, want 1", code)
	}
}

func TestValidateTakesTheFileAsAnArgument(t *testing.T) {
	good := writeConfig(t, `
redis: {addr: "127.0.0.1:6379"}
sinks: [{name: s, nats: {url: "nats://127.0.0.1:4222"}}]
`)
	if code, out, errOut := run(t, "validate", good); code != 0 || out != good+" is valid\n" {
		t.Errorf("validate FILE: exit %d, %q %q", code, out, errOut)
	}
	if code, _, errOut := run(t, "validate", "-c", good, good+".other"); code != 2 || !strings.Contains(errOut, "two files given") {
		t.Errorf("validate -c A B: exit %d, %q", code, errOut)
	}
	bad := writeConfig(t, `
redis: {addr: 127.0.0.1:6379}
scheduler:
  lease: 30
sinks: [{name: kafka, kafka: {brokers: [127.0.0.1:9092]}}]
`)
	code, out, errOut := run(t, "validate", bad)
	want := `scheduler.lease: "30" is not a duration; write it with a unit, e.g. 30s, 500ms, 5m
delaybridge: ` + bad + `: 1 problem; fix it and run validate again
`
	if code != 1 || out != "" || errOut != want {
		t.Errorf("validate of a file with one problem: exit %d, stdout %q, stderr:\n%s\nwant:\n%s", code, out, errOut, want)
	}
}

// send prints the ID it sent (generated when --id is not given, and then
// the message's x-message-id) and when it is due; --delay with --at is
// refused in our own words.
func TestSendSaysWhatItSent(t *testing.T) {
	ns := testenv.NATS(t)
	_, js := ns.Client(t)
	ctx := context.Background()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "IN", Subjects: []string{"in.>"}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := writeConfig(t, fmt.Sprintf(`
redis: {addr: "127.0.0.1:6379"}
ingest:
  - name: in
    nats: {url: %q, subject: "in.>", stream: IN}
    route: {sink: s, destination: out}
sinks: [{name: s, nats: {url: %q, jetstream: true}}]
`, ns.URL, ns.URL))

	before := time.Now()
	code, out, errOut := run(t, "send", "-c", cfg, "--ingest", "in", "--delay", "30m", "--id", "order-42", `{"order":42}`)
	m := regexp.MustCompile(`^sent order-42 to ingest in \(12 bytes\), due (\S+) \(in 30m0s\)\n$`).FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("send --id --delay: exit %d, %q %q", code, out, errOut)
	}
	if due, err := time.Parse(time.RFC3339Nano, m[1]); err != nil || due.Before(before.Add(30*time.Minute).Truncate(time.Millisecond)) || due.After(time.Now().Add(30*time.Minute).Truncate(time.Millisecond).Add(time.Millisecond)) { // due times round up to the millisecond
		t.Errorf("due %s (%v): not 30m from the send", m[1], err)
	}

	code, out, errOut = run(t, "send", "-c", cfg, "--ingest", "in", "--at", "2099-12-01T10:00:00Z", "x")
	m = regexp.MustCompile(`^sent (\S+) to ingest in \(1 byte\), due 2099-12-01T10:00:00\.000Z \(in \S+\)\n$`).FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("send --at: exit %d, %q %q", code, out, errOut)
	}
	msg, err := stream.GetLastMsgForSubject(ctx, "in.send")
	if err != nil {
		t.Fatal(err)
	}
	if got := msg.Header.Get("x-message-id"); got != m[1] {
		t.Errorf("the printed ID %q is not the message's x-message-id %q", m[1], got)
	}

	code, out, errOut = run(t, "send", "-c", cfg, "--ingest", "in", "--delay", "5s", "--at", "2099-12-01T10:00:00Z", "x")
	if code != 2 || out != "" || !strings.Contains(errOut, "give --delay or --at, not both") || strings.Contains(errOut, "none of the others can be") {
		t.Errorf("send --delay --at: exit %d, %q %q", code, out, errOut)
	}
	// An ID the daemon would not take is refused before anything is sent:
	// an empty --id, and one over limits.max_id_bytes (256 by default).
	for _, id := range []string{"", strings.Repeat("i", 257)} {
		code, out, errOut = run(t, "send", "-c", cfg, "--ingest", "in", "--delay", "5s", "--id", id, "x")
		if code != 2 || out != "" || !strings.Contains(errOut, "--id") {
			t.Errorf("send --id of %d bytes: exit %d, %q %q", len(id), code, out, errOut)
		}
	}
	code, _, errOut = run(t, "send", "-c", cfg, "--ingest", "nope", "x")
	if code != 2 || !strings.Contains(errOut, `no ingest named "nope"`) || !strings.Contains(errOut, "its ingests: in") {
		t.Errorf("send to an unknown ingest: exit %d, %q", code, errOut)
	}
	code, out, errOut = run(t, "send", "-c", cfg, "--ingest", "in", "x")
	if code != 0 || !strings.Contains(out, ", not due") || !strings.Contains(errOut, "will keep it as dead") {
		t.Errorf("send without a delay to a route without default_delay: exit %d, %q %q; want a warning", code, out, errOut)
	}
}

// --admin and --token are flags of the commands that act through the
// admin API (and --admin of health), and of no other.
func TestAdminFlagsOnlyWhereTheyAct(t *testing.T) {
	a := &app{}
	root := a.rootCmd()
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			top := sub
			for top.Parent() != root {
				top = top.Parent()
			}
			uses := slices.Contains(adminCommands, top.Name())
			if has := sub.Flag("admin") != nil; has != uses {
				t.Errorf("%s: --admin listed %v, want %v", sub.CommandPath(), has, uses)
			}
			if has, want := sub.Flag("token") != nil, uses && top.Name() != "health"; has != want {
				t.Errorf("%s: --token listed %v, want %v", sub.CommandPath(), has, want)
			}
			walk(sub)
		}
	}
	walk(root)
	if code, _, errOut := run(t, "validate", "--admin", "http://127.0.0.1:7070", "x.yaml"); code != 2 || !strings.Contains(errOut, "unknown flag: --admin") {
		t.Errorf("validate --admin: exit %d, %q; want it refused", code, errOut)
	}
}

// A one-shot command against a Redis that reads no script flags (the
// in-process one of dev) prints its answer and no daemon warning.
func TestOneShotCommandsPrintNoDaemonLogLines(t *testing.T) {
	m := miniredis.RunT(t)
	cfg := writeConfig(t, fmt.Sprintf(`
redis: {addr: "%s", key_prefix: quiet, shards: 2}
sinks: [{name: s, nats: {url: "nats://127.0.0.1:4222"}}]
`, m.Addr()))
	before := slog.Default()
	code, out, errOut := run(t, "stats", "-c", cfg)
	if code != 0 || !strings.HasPrefix(out, "parked 0") || errOut != "" {
		t.Errorf("stats against miniredis: exit %d, stdout %q, stderr %q; want no log line", code, out, errOut)
	}
	if slog.Default() != before {
		t.Error("Main left its logger as the default")
	}

	var b bytes.Buffer
	log := slog.New(&cliHandler{w: &b, level: slog.LevelError}).With("ingest", "in")
	log.Warn("not shown")
	log.Error("cannot reach Redis", "addr", "127.0.0.1:1")
	if want := "delaybridge: error: cannot reach Redis ingest=\"in\" addr=\"127.0.0.1:1\"\n"; b.String() != want {
		t.Errorf("cliHandler wrote %q, want %q", b.String(), want)
	}
}

// Every --help shows an example: the root's, every command's and every
// group's, completion's too.
func TestEveryHelpHasAnExample(t *testing.T) {
	a := &app{}
	root := a.rootCmd()
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if !c.Hidden && c.Name() != "help" && c.Parent() != nil && c.Parent().Name() != "completion" && strings.TrimSpace(c.Example) == "" {
			t.Errorf("%q has no Example in its --help", c.CommandPath())
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	if strings.TrimSpace(root.Example) == "" {
		t.Error("the root --help has no example")
	}
	walk(root)
	for _, args := range [][]string{{"--help"}, {"groups", "--help"}, {"completion", "--help"}} {
		if code, out, _ := run(t, args...); code != 0 || !strings.Contains(out, "Examples:") {
			t.Errorf("%q: exit %d, no Examples: section:\n%s", args, code, out)
		}
	}
}

// send to an ingest that reads only the kafka-scheduler dialect refuses
// the delaybridge dialect's --delay, --at and --id, which the daemon would
// keep as dead, and says what to give instead; nothing is sent.
func TestSendToAKafkaSchedulerIngest(t *testing.T) {
	cfg := writeConfig(t, `
redis: {addr: "127.0.0.1:6379"}
ingest:
  - name: sched
    kafka: {brokers: ["127.0.0.1:1"], topic: schedules, group: db}
    dialects: [kafka-scheduler]
    route: {sink: s, destination: out, allow_override: true}
sinks: [{name: s, kafka: {brokers: ["127.0.0.1:1"]}}]
`)
	for _, args := range [][]string{{"--delay", "1s"}, {"--at", "2099-12-01T10:00:00Z"}, {"--id", "job-9"}} {
		code, out, errOut := run(t, append([]string{"send", "-c", cfg, "--ingest", "sched", "--key", "job-9"}, append(args, "x")...)...)
		if code != 2 || out != "" || !strings.Contains(errOut, "kafka-scheduler") || !strings.Contains(errOut, "scheduler-epoch") {
			t.Errorf("send %v to a kafka-scheduler ingest: exit %d, %q %q", args, code, out, errOut)
		}
	}
}
