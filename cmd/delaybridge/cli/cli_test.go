package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/admin"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Main(args, strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestValidate(t *testing.T) {
	good := writeConfig(t, `
redis: {addr: "127.0.0.1:6379"}
sinks: [{name: s, nats: {url: "nats://127.0.0.1:4222"}}]
`)
	if code, out, _ := run(t, "validate", "-c", good); code != 0 || !strings.Contains(out, "is valid") {
		t.Fatalf("valid file: exit %d, %q", code, out)
	}
	bad := writeConfig(t, `
redis: {addr: "nohost", shards: 0}
colour: red
sinks: []
`)
	code, _, errOut := run(t, "validate", "-c", bad)
	if code == 0 {
		t.Fatal("invalid file: exit 0")
	}
	for _, want := range []string{"redis.addr:", "colour: unknown key", "sinks: at least one sink"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("validate output lacks %q:\n%s", want, errOut)
		}
	}
	// DELAYBRIDGE_CONFIG stands for --config.
	t.Setenv("DELAYBRIDGE_CONFIG", good)
	if code, _, _ := run(t, "validate"); code != 0 {
		t.Errorf("DELAYBRIDGE_CONFIG not used: exit %d", code)
	}
	if code, out, _ := run(t, "version"); code != 0 || !strings.HasPrefix(out, "delaybridge ") {
		t.Errorf("version: %d %q", code, out)
	}
}

// The message commands give the same answers directly against Redis and
// through a daemon's admin API.
func TestMessageCommandsBothWays(t *testing.T) {
	r := testenv.Redis(t)
	cfg := writeConfig(t, fmt.Sprintf(`
redis: {addr: "%s", key_prefix: cli, shards: 4}
sinks: [{name: s, nats: {url: "nats://127.0.0.1:4222"}}]
`, r.Addr))
	st := store.New(r.Client(), store.Options{Prefix: "cli", Shards: 4})
	srv := admin.New(admin.Params{Listen: "127.0.0.1:0", Token: "tok", Store: st})
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())

	ways := map[string][]string{
		"redis": {"-c", cfg},
		"api":   {"--admin", "http://" + srv.Addr(), "--token", "tok"},
	}
	for way, flags := range ways {
		t.Run(way, func(t *testing.T) {
			ctx := context.Background()
			prefix := way + "-"
			due := time.Now().Add(time.Hour).Truncate(time.Millisecond)
			msgs := []*envelope.Message{
				{ID: prefix + "a/b", DueAt: due, Sink: "s", Destination: "d", Body: []byte("x")},
				{ID: prefix + "c", DueAt: due, Sink: "s", Destination: "d"},
			}
			if _, err := st.Park(ctx, msgs); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Reject(ctx, []store.Rejected{{Message: &envelope.Message{ID: prefix + "dead", DueAt: due, Sink: "s"}, Reason: "x-delay is empty"}}); err != nil {
				t.Fatal(err)
			}
			cmd := func(args ...string) (int, string, string) { return run(t, append(args, flags...)...) }

			code, out, errOut := cmd("inspect", prefix+"a/b")
			var v admin.MessageView
			if code != 0 || json.Unmarshal([]byte(out), &v) != nil || v.State != "scheduled" || v.DueAt != envelope.FormatTime(due) {
				t.Fatalf("inspect: %d %s %s", code, out, errOut)
			}
			if code, _, _ := cmd("inspect", prefix+"nope"); code != 1 {
				t.Errorf("inspect unknown: exit %d, want 1", code)
			}
			if code, _, _ := cmd("cancel", prefix+"c"); code != 0 {
				t.Errorf("cancel: exit %d", code)
			}
			if code, _, _ := cmd("cancel", prefix+"c"); code != 1 {
				t.Errorf("cancel again: exit %d, want 1", code)
			}
			code, out, _ = cmd("stats", "--json")
			var sv admin.StatsView
			if code != 0 || json.Unmarshal([]byte(out), &sv) != nil || sv.Dead < 1 || len(sv.Shards) != 4 {
				t.Fatalf("stats: %d %s", code, out)
			}
			if code, out, _ := cmd("stats"); code != 0 || !strings.Contains(out, "parked") {
				t.Errorf("stats table: %d %q", code, out)
			}
			code, out, _ = cmd("dead", "list", "--json")
			if code != 0 || !strings.Contains(out, prefix+"dead") || !strings.Contains(out, "x-delay is empty") {
				t.Fatalf("dead list: %d %s", code, out)
			}
			if code, _, _ := cmd("dead", "retry", prefix+"dead"); code != 0 {
				t.Errorf("dead retry: exit %d", code)
			}
			if info, err := st.Inspect(ctx, prefix+"dead"); err != nil || info.State != store.StateScheduled {
				t.Errorf("after retry: %+v %v", info, err)
			}
			if code, _, _ := cmd("dead", "retry", prefix+"dead"); code != 1 {
				t.Errorf("retry of a message that is not dead: exit %d, want 1", code)
			}
		})
	}
	// Purge, and a wrong token through the API.
	if _, err := st.Reject(context.Background(), []store.Rejected{{Message: &envelope.Message{ID: "p1", Sink: "s"}, Reason: "r"}}); err != nil {
		t.Fatal(err)
	}
	if code, out, _ := run(t, "dead", "purge", "--admin", "http://"+srv.Addr(), "--token", "tok"); code != 0 || !strings.Contains(out, "deleted 1") {
		t.Errorf("purge: %d %q", code, out)
	}
	code, _, errOut := run(t, "stats", "--admin", "http://"+srv.Addr(), "--token", "wrong")
	if code == 0 || !strings.Contains(errOut, "--token") {
		t.Errorf("wrong token: exit %d, %q", code, errOut)
	}
}
