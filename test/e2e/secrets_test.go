package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/cli"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// TestSecretsNeverLogged runs the daemon at debug level with a Redis
// password (from a file), a NATS user and password, and an admin token (from
// the environment), sends messages, makes requests with wrong tokens, and
// runs validate/inspect: no output of any of it contains a secret.
func TestSecretsNeverLogged(t *testing.T) {
	const (
		redisPass = "redis-Secret-8a1f"
		natsPass  = "nats-Secret-33c0"
		token     = "admin-Secret-d9e2"
	)
	secrets := []string{redisPass, natsPass, token}

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

	dir := t.TempDir()
	pwFile := filepath.Join(dir, "redis.pw")
	if err := os.WriteFile(pwFile, []byte(redisPass+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`
redis: {addr: "%s", password_file: %q, key_prefix: sec}
admin: {listen: "%%ADMIN%%", token: "${ADMIN_TOKEN}"}
log: {level: debug, format: json}
ingest:
  - name: in
    nats: {url: "%s", user: db, password: "${NATS_PASSWORD}", subject: "delayed.>", stream: DELAYED}
    route: {sink: out, destination: fired.x}
sinks:
  - name: out
    nats: {url: "%s", user: db, password: "${NATS_PASSWORD}"}
`, rs.Addr, pwFile, ns.ClientURL(), ns.ClientURL())
	env := []string{"ADMIN_TOKEN=" + token, "NATS_PASSWORD=" + natsPass}
	d := startDaemon(t, cfg, env...)

	nc, err := nats.Connect(ns.ClientURL(), nats.UserInfo("db", natsPass))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	fired := make(chan *nats.Msg, 100)
	if _, err := nc.ChanSubscribe("fired.>", fired); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	for i := 0; i < 20; i++ {
		m := nats.NewMsg("delayed.x")
		m.Header.Set("x-delay", "50")
		m.Header.Set("x-message-id", fmt.Sprint("s", i))
		if i == 0 {
			m.Header.Set("x-delay", "bad") // a rejection is logged too
		}
		if _, err := js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i < 20; i++ {
		select {
		case <-fired:
		case <-time.After(20 * time.Second):
			t.Fatal("messages did not fire")
		}
	}
	// Requests with a wrong and with the right token.
	for _, auth := range []string{"Bearer wrong-" + token, "Bearer " + token} {
		req, _ := http.NewRequest(http.MethodGet, d.admin+"/v1/stats", nil)
		req.Header.Set("Authorization", auth)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}
	d.stop()
	outputs := map[string]string{"daemon": d.proc.Output()}

	// The CLI, with a valid and an invalid configuration.
	os.Setenv("ADMIN_TOKEN", token)
	os.Setenv("NATS_PASSWORD", natsPass)
	defer os.Unsetenv("ADMIN_TOKEN")
	defer os.Unsetenv("NATS_PASSWORD")
	bad := strings.Replace(d.cfgPathContent(t), "key_prefix: sec", "key_prefix: sec, shards: 0, colour: red", 1)
	badPath := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(badPath, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, args := range map[string][]string{
		"validate":         {"validate", "-c", d.cfgPath},
		"validate invalid": {"validate", "-c", badPath},
		"inspect":          {"inspect", "-c", d.cfgPath, "s1"},
		"inspect bad id":   {"inspect", "-c", d.cfgPath, "s0"},
		"stats":            {"stats", "-c", d.cfgPath, "--json"},
		"dead list":        {"dead", "list", "-c", d.cfgPath, "--json"},
	} {
		var out bytes.Buffer
		cli.Main(args, strings.NewReader(""), &out, &out)
		outputs[name] = out.String()
	}
	for name, out := range outputs {
		if out == "" {
			t.Errorf("%s printed nothing: the check would be empty", name)
		}
		for _, s := range secrets {
			if strings.Contains(out, s) {
				t.Errorf("%s output contains a secret:\n%s", name, out)
			}
		}
	}
	if !strings.Contains(outputs["daemon"], `"level":"DEBUG"`) {
		t.Error("the daemon did not log at debug level: the check proves little")
	}
}

// cfgPathContent returns the daemon's configuration file.
func (d *daemon) cfgPathContent(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(d.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
