package cli

// The command line as a newcomer meets it: the small things that cost time
// or trust, each with its test.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/brokers"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/daemon"
	"github.com/delaybridge/delaybridge/pkg/ops"
)

// runningDaemon runs the daemon of the configuration file path in this
// process until the test ends, and returns its admin API's base URL once
// it is ready.
func runningDaemon(t *testing.T, path string) string {
	t.Helper()
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	d, err := daemon.New(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		stop()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("daemon: %v", err)
		}
	})
	testenv.Eventually(t, 30*time.Second, func() bool {
		addr := d.AdminAddr()
		if addr == "" || strings.HasSuffix(addr, ":0") {
			return false
		}
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, "the daemon is not ready")
	return "http://" + d.AdminAddr()
}

// A command that acts on parked messages, given neither a configuration
// nor a daemon, says both ways: --admin (DELAYBRIDGE_ADMIN, which
// `. .delaybridge-dev/env` sets) and --config, not --config alone, which a
// user of dev has no reason to give.
func TestNoTargetNamesAdmin(t *testing.T) {
	t.Setenv("DELAYBRIDGE_CONFIG", "")
	t.Setenv("DELAYBRIDGE_ADMIN", "")
	for _, args := range [][]string{{"stats"}, {"inspect", "order-42"}, {"sinks"}, {"dead", "list"}} {
		code, _, errOut := run(t, args...)
		if code != 2 || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: exit %d, %q; want exit 2 and one line", args, code, errOut)
		}
		for _, want := range []string{"--admin URL", "DELAYBRIDGE_ADMIN", ". .delaybridge-dev/env", "--config FILE", "DELAYBRIDGE_CONFIG"} {
			if !strings.Contains(errOut, want) {
				t.Errorf("%v: %q does not mention %s", args, errOut, want)
			}
		}
	}
}

// DELAYBRIDGE_ADMIN (set by `. .delaybridge-dev/env`) is --admin's default;
// a -c given on the command line still acts on the Redis of that file, as
// the README's commands do, rather than on a daemon the environment names.
func TestConfigFlagWinsOverTheAdminVariable(t *testing.T) {
	rs := testenv.Redis(t)
	cfg := writeConfig(t, fmt.Sprintf(`
redis: {addr: "%s", key_prefix: flagwins, shards: 2}
sinks: [{name: s, nats: {url: "nats://127.0.0.1:4222"}}]
`, rs.Addr))
	t.Setenv("DELAYBRIDGE_CONFIG", "")
	t.Setenv("DELAYBRIDGE_ADMIN", "http://127.0.0.1:1") // nothing listens there
	if code, out, errOut := run(t, "stats", "-c", cfg); code != 0 || !strings.HasPrefix(out, "parked 0") {
		t.Errorf("stats -c with DELAYBRIDGE_ADMIN set: exit %d, %q %q; want the Redis of -c", code, out, errOut)
	}
	if code, _, errOut := run(t, "stats"); code != 1 || !strings.Contains(errOut, "127.0.0.1:1") {
		t.Errorf("stats with only DELAYBRIDGE_ADMIN: exit %d, %q; want the daemon it names asked", code, errOut)
	}
	if code, _, errOut := run(t, "stats", "-c", cfg, "--admin", "http://127.0.0.1:1"); code != 1 || !strings.Contains(errOut, "127.0.0.1:1") {
		t.Errorf("stats -c --admin: exit %d, %q; want --admin asked", code, errOut)
	}
}

// A dead retry that is refused is said once, not twice ("not retried: X"
// and then "delaybridge: X").
func TestDeadRetryRefusalSaidOnce(t *testing.T) {
	rs := testenv.Redis(t)
	cfg := writeConfig(t, fmt.Sprintf(`
redis: {addr: "%s", key_prefix: retryonce, shards: 2}
sinks: [{name: s, nats: {url: "nats://127.0.0.1:4222"}}]
`, rs.Addr))
	code, out, errOut := run(t, "dead", "retry", "-c", cfg, "nope-1", "nope-2")
	if code != 1 || out != "" {
		t.Fatalf("dead retry of unknown IDs: exit %d, stdout %q; want exit 1", code, out)
	}
	lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "delaybridge: not retried: ") || !strings.Contains(lines[0], "nope-1") ||
		!strings.Contains(lines[1], "nope-2") || strings.Count(errOut, "nope-1") != 1 {
		t.Errorf("dead retry of two unknown IDs printed:\n%s\nwant one line for each", errOut)
	}
}

// send prints the due time the daemon stores: a delay counts from the
// message's publish time as the broker records it (a JetStream message's
// time, a Kafka record's timestamp), and send read the clock before it
// even connected, a few milliseconds early. Each of several sends to each
// broker prints exactly what inspect then shows.
func TestSendPrintsTheStoredDueTime(t *testing.T) {
	rs, ns := testenv.Redis(t), testenv.NATS(t)
	kc := testenv.Kafka(t, testenv.WithTopic("send-in", 1))
	path := writeConfig(t, fmt.Sprintf(`
redis: {addr: "%s", key_prefix: sendexact, shards: 2}
admin: {listen: "127.0.0.1:0"}
ingest:
  - name: js
    nats: {url: "%s", subject: "send.>", stream: SEND_IN}
    route: {sink: out, destination: fired.out}
  - name: kafka
    kafka: {brokers: ["%s"], topic: send-in, group: sendexact, session_timeout: 2s}
    route: {sink: out, destination: fired.out}
sinks: [{name: out, nats: {url: "%s", jetstream: false}}]
`, rs.Addr, ns.URL, kc.Brokers[0], ns.URL))
	runningDaemon(t, path)
	t.Setenv("DELAYBRIDGE_ADMIN", "")
	printed := regexp.MustCompile(`^sent (\S+) to ingest \S+ \(\d+ bytes?\), due (\S+) \(in 1h0m0s\)\n$`)
	for _, ingest := range []string{"js", "kafka"} {
		for i := range 5 {
			id := fmt.Sprintf("%s-%d", ingest, i)
			code, out, errOut := run(t, "send", "-c", path, "--ingest", ingest, "--delay", "1h", "--id", id, "x")
			m := printed.FindStringSubmatch(out)
			if code != 0 || m == nil {
				t.Fatalf("send to %s: exit %d, %q %q", ingest, code, out, errOut)
			}
			var stored struct {
				DueAt string `json:"due_at"`
			}
			testenv.Eventually(t, 15*time.Second, func() bool {
				code, out, _ := run(t, "inspect", "-c", path, id)
				return code == 0 && json.Unmarshal([]byte(out), &stored) == nil
			}, "%s was not parked", id)
			if m[2] != stored.DueAt {
				t.Errorf("send to %s printed due %s, the daemon stored %s", ingest, m[2], stored.DueAt)
			}
		}
	}
}

// The due time send prints counts from the broker's publish time, rounded
// up to the millisecond as the daemon rounds it; where the broker records
// none (RabbitMQ, core NATS) it says "due about": the daemon counts from
// when it reads the message.
func TestSendSaysWhenItsDueIsAnEstimate(t *testing.T) {
	in := &config.Ingest{Name: "q", Dialects: []string{"delaybridge"}}
	now := time.Date(2026, 12, 1, 10, 0, 0, 123_456_789, time.UTC)
	if due, _ := dueOf(brokers.SendRequest{Delay: "3s"}, in, time.Time{}, now); due != "due about 2026-12-01T10:00:03.124Z (in 3s; counted from when the daemon reads it)" {
		t.Errorf("without a publish time: %q", due)
	}
	stored := time.Date(2026, 12, 1, 10, 0, 0, 120_000_500, time.UTC) // a JetStream time, in nanoseconds
	if due, _ := dueOf(brokers.SendRequest{Delay: "3s"}, in, stored, now); due != "due 2026-12-01T10:00:03.121Z (in 3s)" {
		t.Errorf("with the stream's time: %q", due)
	}
}

// After `sinks` showed a due message held for a paused sink, `sinks
// resume` said "held: 0": it read the held count after the resume had
// released them, which was true and told nothing. It says what it
// released.
func TestSinksResumeSaysWhatItReleased(t *testing.T) {
	rs, ns := testenv.Redis(t), testenv.NATS(t)
	path := writeConfig(t, fmt.Sprintf(`
redis: {addr: "%s", key_prefix: resume, shards: 2}
admin: {listen: "127.0.0.1:0"}
scheduler: {max_sleep: 100ms}
ingest:
  - name: js
    nats: {url: "%s", subject: "resume.>", stream: RESUME_IN}
    route: {sink: out, destination: fired.out}
sinks: [{name: out, nats: {url: "%s", jetstream: false}}]
`, rs.Addr, ns.URL, ns.URL))
	base := runningDaemon(t, path)
	t.Setenv("DELAYBRIDGE_ADMIN", "")
	sink := func() ops.SinkView {
		code, out, errOut := run(t, "sinks", "--admin", base, "--json")
		var views []ops.SinkView
		if code != 0 || json.Unmarshal([]byte(out), &views) != nil || len(views) != 1 {
			t.Fatalf("sinks: exit %d, %q %q", code, out, errOut)
		}
		return views[0]
	}
	due := func() int64 { return sink().Due }
	for _, via := range [][]string{{"--admin", base}, {"-c", path}} {
		if code, out, errOut := run(t, append([]string{"sinks", "pause", "out"}, via...)...); code != 0 || !strings.HasPrefix(out, "paused out") {
			t.Fatalf("sinks pause %v: exit %d, %q %q", via, code, out, errOut)
		}
		// Through Redis the daemon applies the pause at its next refresh.
		testenv.Eventually(t, 15*time.Second, func() bool { return sink().Status == "paused" }, "the daemon does not apply the pause")
		for i := range 2 {
			if code, out, errOut := run(t, "send", "-c", path, "--ingest", "js", "--delay", "1ms", "--id", fmt.Sprintf("held-%s-%d", via[0], i), "x"); code != 0 {
				t.Fatalf("send: exit %d, %q %q", code, out, errOut)
			}
		}
		testenv.Eventually(t, 15*time.Second, func() bool { return due() == 2 }, "the paused sink does not show its 2 due messages held")

		code, out, errOut := run(t, append([]string{"sinks", "resume", "out"}, via...)...)
		want := "resumed out for every instance: 2 held messages released, firing by priority, then in due order\n"
		if via[0] == "-c" {
			want = "resumed out for every instance: 2 held messages released, to fire by priority, then in due order, within each shard at the daemons' next refresh (within scheduler.max_sleep)\n"
		}
		if code != 0 || out != want {
			t.Errorf("sinks resume %v: exit %d, %q %q; want %q", via, code, out, errOut, want)
		}
		testenv.Eventually(t, 15*time.Second, func() bool { return due() == 0 }, "the released messages are still held")
	}
	if code, out, _ := run(t, "sinks", "resume", "out", "--admin", base); code != 0 || out != "resumed out for every instance (no messages were held)\n" {
		t.Errorf("sinks resume of a sink not paused: exit %d, %q", code, out)
	}
}
