package e2e

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// The hardening tests that need the daemon itself; the admin server's own
// guards are tested in pkg/admin/hardening_test.go and from a browser in
// test/ui/crosssite_test.go.

// TestStartWarnings: a daemon whose admin API has no token, and one with a
// core NATS sink (jetstream: false), say so at start.
func TestStartWarnings(t *testing.T) {
	ns, rs := testenv.NATS(t), testenv.Redis(t)
	d := startDaemon(t, fmt.Sprintf(`
redis: {addr: %q, key_prefix: warn}
admin: {listen: "%%ADMIN%%"}
ingest:
  - name: in
    nats: {url: %q, subject: "warn.>", stream: WARN, durable: delaybridge}
    route: {sink: core, destination: fired.x}
sinks:
  - name: core
    nats: {url: %q, jetstream: false}
`, rs.Addr, ns.URL, ns.URL))
	out := d.proc.Output()
	for _, want := range []string{
		`the admin API has no token`,
		`core NATS sink (jetstream: false): a publish is not confirmed`,
		`sink=core`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("start output lacks %q:\n%s", want, out)
		}
	}
	d.stop()
	// With a token and a JetStream sink, neither warning.
	d = startDaemon(t, fmt.Sprintf(`
redis: {addr: %q, key_prefix: warn2}
admin: {listen: "%%ADMIN%%", token: tok}
ingest:
  - name: in
    nats: {url: %q, subject: "warn.>", stream: WARN, durable: delaybridge2}
    route: {sink: js, destination: fired.x}
sinks:
  - name: js
    nats: {url: %q, jetstream: true}
`, rs.Addr, ns.URL, ns.URL))
	if out := d.proc.Output(); strings.Contains(out, "no token") || strings.Contains(out, "core NATS sink") {
		t.Errorf("warnings without cause:\n%s", out)
	}
}

// TestPprofNeedsTokenInValidate: admin.pprof without a token is a
// configuration error for validate and for run.
func TestPprofNeedsTokenInValidate(t *testing.T) {
	bin := testenv.Build(t)
	write := func(admin string) string {
		p := filepath.Join(t.TempDir(), "config.yaml")
		cfg := "redis: {addr: \"127.0.0.1:1\"}\nadmin: " + admin + "\nsinks: [{name: s, nats: {url: \"nats://127.0.0.1:1\"}}]\n"
		if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	bad := write(`{listen: "127.0.0.1:0", pprof: true}`)
	for _, cmd := range []string{"validate", "run"} {
		p := testenv.StartProcess(t, bin, cmd, "--config", bad)
		if code := p.Wait(30 * time.Second); code == 0 {
			t.Errorf("%s with pprof and no token: exit 0", cmd)
		}
		if out := p.Output(); !strings.Contains(out, "admin.pprof: requires admin.token") {
			t.Errorf("%s output does not name the problem:\n%s", cmd, out)
		}
	}
	good := write(`{listen: "127.0.0.1:0", pprof: true, token: "t0k"}`)
	p := testenv.StartProcess(t, bin, "validate", "--config", good)
	if code := p.Wait(30 * time.Second); code != 0 {
		t.Errorf("validate with pprof and a token: exit %d:\n%s", code, p.Output())
	}
}

// TestReadyzHidesAddressesWithoutToken: when Redis is down, /readyz says
// so to everyone, with Redis's address only to a caller with the token.
func TestReadyzHidesAddressesWithoutToken(t *testing.T) {
	ns, rs := testenv.NATS(t), testenv.Redis(t)
	d := startDaemon(t, fmt.Sprintf(`
redis: {addr: %q, key_prefix: ready, dial_timeout: 200ms}
admin: {listen: "%%ADMIN%%", token: tok}
ingest:
  - name: in
    nats: {url: %q, subject: "ready.>", stream: READY, durable: delaybridge}
    route: {sink: js, destination: fired.x}
sinks:
  - name: js
    nats: {url: %q, jetstream: true}
`, rs.Addr, ns.URL, ns.URL))
	rs.Stop()
	readyz := func(auth string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, d.admin+"/readyz", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		var b strings.Builder
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			b.WriteString(sc.Text())
		}
		return resp.StatusCode, b.String()
	}
	port := fmt.Sprint(rs.Port)
	var body string
	testenv.Eventually(t, 20*time.Second, func() bool {
		var code int
		code, body = readyz("")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "redis")
	}, "/readyz does not report Redis down")
	for _, auth := range []string{"", "Bearer wrong"} {
		_, body = readyz(auth)
		if !strings.Contains(body, "redis") || strings.Contains(body, port) || strings.Contains(body, "127.0.0.1") {
			t.Errorf("Authorization %q: /readyz shows an address or lost the reason: %s", auth, body)
		}
	}
	code, body := readyz("Bearer tok")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, rs.Addr) {
		t.Errorf("with the token: %d %s; want Redis's address %s", code, body, rs.Addr)
	}
	rs.Start()
	testenv.Eventually(t, 30*time.Second, func() bool { c, _ := readyz(""); return c == http.StatusOK }, "not ready again after Redis came back")
}

// rawNATSPublish sends HPUB frames ({header block, body}) over a plain TCP
// connection: nats.go cannot send a header block that does not decode.
func rawNATSPublish(t *testing.T, port int, subject string, frames ...[2]string) {
	t.Helper()
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if _, err := r.ReadString('\n'); err != nil { // INFO
		t.Fatal(err)
	}
	fmt.Fprintf(c, "CONNECT {\"verbose\":false,\"headers\":true,\"protocol\":1}\r\n")
	for _, f := range frames {
		fmt.Fprintf(c, "HPUB %s %d %d\r\n%s%s\r\n", subject, len(f[0]), len(f[0])+len(f[1]), f[0], f[1])
	}
	fmt.Fprintf(c, "PING\r\n")
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "PONG") {
		t.Fatalf("raw publish: %q %v", line, err)
	}
}

// TestNATSUndecodableHeaders: a JetStream message whose header block does
// not decode goes dead saying so, under its stream position, and the
// messages around it are delivered.
func TestNATSUndecodableHeaders(t *testing.T) {
	e := newNATSEnv(t, "", "")
	e.publish("delayed.b", []byte("ok"), "x-delay", "10", "x-message-id", "before")
	rawNATSPublish(t, e.nats.Port, "delayed.b",
		[2]string{"GARBAGE\r\nx-delay: 10\r\n\r\n", "bad-1"},
		[2]string{"NATS/1.0\r\nx-delay 10\r\n\r\n", "bad-2"},
		[2]string{"NATS/1.0\r\nx-delay: 10\r\nx-message-id: bad-3\r\n", "bad-3"},
	)
	e.publish("delayed.b", []byte("ok"), "x-delay", "10", "x-message-id", "after")
	e.waitFired(30*time.Second, "before", "after")
	var dead []deadMessage
	testenv.Eventually(t, 10*time.Second, func() bool { dead = e.d.dead(); return len(dead) >= 3 }, "the undecodable messages are not dead")
	for _, m := range dead {
		if !strings.Contains(m.Reason, "the message's headers could not be decoded") || strings.Contains(m.Reason, "no x-delay") {
			t.Errorf("dead %s: reason %q", m.ID, m.Reason)
		}
		if !strings.HasPrefix(m.ID, "DELAYED/") {
			t.Errorf("dead ID %q, want the stream position", m.ID)
		}
	}
	if n, _ := metricValue(e.d.metrics(), "delaybridge_ingest_rejected_total", map[string]string{"reason": "undecodable_headers"}); n != 3 {
		t.Errorf("rejected{reason=undecodable_headers} = %v, want 3", n)
	}
}
