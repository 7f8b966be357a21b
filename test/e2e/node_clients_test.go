package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// The Node.js clients (testdata/node) publish and consume the way their
// users do, each against its broker's ingest and sink: what comes out is
// what went in, never before its delay. npm installs them (npm ci, from
// testdata/node/package-lock.json) once per machine, into a directory of
// the system's temporary directory named by the lock file's hash.

var nodeOnce struct {
	sync.Once
	dir string
	err error
}

// nodeClients returns the directory of the Node.js scripts with their
// node_modules installed.
func nodeClients(t *testing.T) string {
	t.Helper()
	nodeOnce.Do(func() { nodeOnce.dir, nodeOnce.err = installNodeClients() })
	if nodeOnce.err != nil {
		t.Fatalf("the Node.js clients: %v (node and npm come with Debian's nodejs and npm)", nodeOnce.err)
	}
	return nodeOnce.dir
}

func installNodeClients() (string, error) {
	src, err := filepath.Abs("testdata/node")
	if err != nil {
		return "", err
	}
	lock, err := os.ReadFile(filepath.Join(src, "package-lock.json"))
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(lock)
	dir := filepath.Join(os.TempDir(), "delaybridge-e2e-node-"+hex.EncodeToString(sum[:8]))
	if _, err := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json")); err != nil {
		// Installed apart, then moved into place: two runs at once do not
		// share a half-installed directory.
		tmp, err := os.MkdirTemp(os.TempDir(), "delaybridge-e2e-node-install-")
		if err != nil {
			return "", err
		}
		defer os.RemoveAll(tmp)
		for _, f := range []string{"package.json", "package-lock.json"} {
			if err := copyFile(filepath.Join(src, f), filepath.Join(tmp, f)); err != nil {
				return "", err
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts")
		cmd.Dir = tmp
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("npm ci: %v\n%s", err, out)
		}
		if err := os.Rename(tmp, dir); err != nil {
			if _, serr := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json")); serr != nil {
				return "", err
			}
		}
	}
	// The scripts next to their node_modules (ES modules resolve imports
	// from their own directory), copied on each run.
	scripts, err := filepath.Glob(filepath.Join(src, "*.mjs"))
	if err != nil {
		return "", err
	}
	for _, s := range scripts {
		if err := copyFile(s, filepath.Join(dir, filepath.Base(s))); err != nil {
			return "", err
		}
	}
	return dir, nil
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o644)
}

// runNode runs a script of nodeClients with args and returns the JSON
// lines it printed, each decoded into a map.
func runNode(t *testing.T, script string, args ...string) []map[string]any {
	t.Helper()
	dir := nodeClients(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append([]string{filepath.Join(dir, script)}, args...)...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node %s: %v\n%s%s", script, err, out, stderr.String())
	}
	var lines []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("node %s printed %q: %v", script, sc.Text(), err)
		}
		lines = append(lines, m)
	}
	return lines
}

// checkArrivals checks that each line, found by key, came no sooner than
// its delay (the script's "after" counts from before its first publish)
// and once, with the fields want gives it (a JSON path of maps, "." apart,
// to its value as JSON decodes it; nil: null).
func checkArrivals(t *testing.T, lines []map[string]any, key string, delays map[string]time.Duration, want map[string]map[string]any) {
	t.Helper()
	seen := map[string]bool{}
	for _, l := range lines {
		k := fmt.Sprint(l[key])
		if seen[k] {
			t.Errorf("%s %q arrived twice", key, k)
		}
		seen[k] = true
		d, ok := delays[k]
		if !ok {
			t.Errorf("an arrival with %s %q, which was not sent: %v", key, k, l)
			continue
		}
		if after := time.Duration(l["after"].(float64)) * time.Millisecond; after < d {
			t.Errorf("%s %q arrived %v after the publish, before its delay %v", key, k, after, d)
		}
		for path, v := range want[k] {
			var got any = l
			for _, step := range strings.Split(path, ".") {
				m, _ := got.(map[string]any)
				got = m[step]
			}
			if !reflect.DeepEqual(got, v) {
				t.Errorf("%s %q: %s is %#v, want %#v", key, k, path, got, v)
			}
		}
		if h, _ := l["headers"].(map[string]any); h != nil {
			for name := range h {
				if strings.EqualFold(name, "x-delay") {
					t.Errorf("%s %q still carries %s", key, k, name)
				}
			}
		}
	}
	for k := range delays {
		if !seen[k] {
			t.Errorf("%s %q did not arrive", key, k)
		}
	}
}

// TestNodeKafkaJS: kafkajs 2.2.4 publishes to a Kafka ingest and reads the
// sink's topic: a null value stays null (a tombstone), a record without a
// key has none, a binary header keeps its bytes, X-Delay is x-delay.
func TestNodeKafkaJS(t *testing.T) {
	t.Parallel() // servers of its own, no timing bound (harness_test.go)
	nodeClients(t)
	kc := testenv.Kafka(t, testenv.WithTopic("js-in", 1), testenv.WithTopic("js-out", 1))
	rs := testenv.Redis(t)
	d := startDaemon(t, fmt.Sprintf(`
redis: {addr: %q, key_prefix: kafkajs}
admin: {listen: "%%ADMIN%%"}
scheduler: {max_sleep: 250ms}
ingest:
  - name: in
    kafka: {brokers: [%q], topic: js-in, group: kafkajs, session_timeout: 6s}
    route: {sink: out, destination: js-out}
sinks:
  - name: out
    kafka: {brokers: [%[2]q]}
`, rs.Addr, kc.Brokers[0]))
	t.Cleanup(d.stop)
	lines := runNode(t, "kafkajs.mjs", kc.Brokers[0], "js-in", "js-out")
	checkArrivals(t, lines, "value", map[string]time.Duration{
		"cancel order 1": 1500 * time.Millisecond, "cancel order 2": time.Second, "<nil>": 1200 * time.Millisecond, "no key": 800 * time.Millisecond,
	}, map[string]map[string]any{
		"cancel order 1": {"key": "order-1"},
		"cancel order 2": {"key": "order-2", "headers.x-message-id": "js-2", "headers.trace": "\x00\x01\x02"},
		"<nil>":          {"key": "order-3", "value": nil},
		"no key":         {"key": nil},
	})
}

// TestNodeAmqplib: amqplib 2.3.1 publishes to a RabbitMQ ingest queue and
// consumes the sink's queue: x-delay as amqplib types a number (by its
// value) or as a long; other headers keep their values and types; the
// properties come back as properties.
func TestNodeAmqplib(t *testing.T) {
	t.Parallel() // servers of its own, no timing bound (harness_test.go)
	nodeClients(t)
	rb := testenv.RabbitMQ(t)
	rs := testenv.Redis(t)
	d := startDaemon(t, fmt.Sprintf(`
redis: {addr: %q, key_prefix: amqplib}
admin: {listen: "%%ADMIN%%"}
scheduler: {max_sleep: 250ms}
ingest:
  - name: in
    rabbitmq: {url: %q, queue: amqplib-in}
    route: {sink: out, destination: amqplib-out}
sinks:
  - name: out
    rabbitmq: {url: %[2]q, exchange: ""}
`, rs.Addr, rb.URL))
	t.Cleanup(d.stop)
	lines := runNode(t, "amqplib.mjs", rb.URL, "amqplib-in", "amqplib-out")
	checkArrivals(t, lines, "body", map[string]time.Duration{
		"small int": 900 * time.Millisecond, "typed": 1100 * time.Millisecond, "properties": time.Second, "long": 1200 * time.Millisecond,
	}, map[string]map[string]any{
		"typed": {"headers.n": 70000.0, "headers.f": 1.5, "headers.neg": -3.0, "headers.flag": true,
			"headers.nested": map[string]any{"a": 1.0}, "headers.list": []any{1.0, "x"}},
		"properties": {"props.contentType": "application/json", "props.correlationId": "c1", "props.replyTo": "r1",
			"props.messageId": "amqp-3", "props.priority": 2.0, "props.deliveryMode": 2.0, "headers.x-message-id": "amqp-3"},
	})
}

// TestNodeNATS: nats.js 2.29.3 publishes to a JetStream ingest with header
// names as its users write them and subscribes to the sink's subject.
func TestNodeNATS(t *testing.T) {
	t.Parallel() // servers of its own, no timing bound (harness_test.go)
	nodeClients(t)
	ns := testenv.NATS(t)
	rs := testenv.Redis(t)
	d := startDaemon(t, fmt.Sprintf(`
redis: {addr: %q, key_prefix: natsjs}
admin: {listen: "%%ADMIN%%"}
scheduler: {max_sleep: 250ms}
ingest:
  - name: in
    nats: {url: %q, stream: NATSJS, subject: "natsjs.in.>"}
    route: {sink: out, destination: natsjs.out}
sinks:
  - name: out
    nats: {url: %[2]q}
`, rs.Addr, ns.URL))
	t.Cleanup(d.stop)
	lines := runNode(t, "natsjs.mjs", ns.URL, "natsjs.in.x", "natsjs.out")
	checkArrivals(t, lines, "body", map[string]time.Duration{
		"lower": 1500 * time.Millisecond, "mixed case": 1200 * time.Millisecond, "milliseconds": 900 * time.Millisecond, "with id": time.Second,
	}, map[string]map[string]any{
		"with id": {"headers.x-message-id": "js-4", "headers.Content-Type": "application/json"},
	})
}
