package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
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
			if _, err := st.Reject(ctx, []store.Rejected{{Message: &envelope.Message{ID: prefix + "dead", DueAt: due, Sink: "s", Destination: "d"}, Reason: "x-delay is empty"}}); err != nil {
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

// TestContentAndIDs: inspect shows the key and headers only
// with --body, both against Redis and through the API; an ID with a C1
// control or a bidi override is refused before anything is done; one stored
// before that rule is printed escaped, in text and in JSON.
func TestContentAndIDs(t *testing.T) {
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
	due := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	m := &envelope.Message{ID: "with-content", DueAt: due, Sink: "s", Destination: "d", Key: []byte("customer-7"),
		Headers: envelope.Headers{{Key: "authorization", Value: "Bearer for-the-consumer"}}, Body: []byte("the body")}
	legacy := "paid-\u202e0001"
	if _, err := st.Park(context.Background(), []*envelope.Message{m}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Reject(context.Background(), []store.Rejected{{Message: &envelope.Message{ID: legacy, DueAt: due, Sink: "s"}, Reason: "old\tone"}}); err != nil {
		t.Fatal(err)
	}
	for way, flags := range map[string][]string{"redis": {"-c", cfg}, "api": {"--admin", "http://" + srv.Addr(), "--token", "tok"}} {
		t.Run(way, func(t *testing.T) {
			cmd := func(args ...string) (int, string, string) { return run(t, append(args, flags...)...) }
			code, out, _ := cmd("inspect", "with-content")
			if code != 0 || strings.Contains(out, "customer-7") || strings.Contains(out, "for-the-consumer") || strings.Contains(out, "the body") {
				t.Errorf("inspect without --body: %d %s", code, out)
			}
			for _, k := range []string{`"id"`, `"state"`, `"due_at"`, `"sink"`, `"destination"`, `"attempts"`} {
				if !strings.Contains(out, k) {
					t.Errorf("inspect lacks %s: %s", k, out)
				}
			}
			code, out, _ = cmd("inspect", "--body", "with-content")
			if code != 0 || !strings.Contains(out, "customer-7") || !strings.Contains(out, "for-the-consumer") || !strings.Contains(out, "the body") {
				t.Errorf("inspect --body: %d %s", code, out)
			}
			for _, args := range [][]string{{"inspect", "a\u202eb"}, {"cancel", "x\u0085"}, {"dead", "retry", "ok", "\u2066y\u2069"}} {
				code, out, errOut := cmd(args...)
				if code != 2 || !strings.Contains(errOut, "control character U+") || out != "" {
					t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 naming the character", args, code, out, errOut)
				}
			}
			code, out, _ = cmd("dead", "list")
			if code != 0 || strings.ContainsRune(out, '\u202e') || !strings.Contains(out, `paid-\u202e0001`) || !strings.Contains(out, `old\u0009one`) {
				t.Errorf("dead list shows the override raw or the tab: %d %q", code, out)
			}
			code, out, _ = cmd("dead", "list", "--json")
			var list []admin.DeadView
			if code != 0 || strings.ContainsRune(out, '\u202e') || json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 || list[0].ID != legacy {
				t.Errorf("dead list --json: %d %q", code, out)
			}
		})
	}
	if code, _, errOut := run(t, "send", "-c", cfg, "--ingest", "x", "--id", "a\u202eb", "body"); code != 2 || !strings.Contains(errOut, "U+202E") {
		t.Errorf("send --id with an override: exit %d, %q", code, errOut)
	}
}

// The completion scripts cobra writes for bash, zsh and fish come out and
// each shell parses its own (TestEveryHelpHasAnExample checks the
// examples).
func TestHelpExamplesAndCompletion(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish"} {
		var out, errb bytes.Buffer
		if code := Main([]string{"completion", shell}, strings.NewReader(""), &out, &errb); code != 0 || out.Len() < 1000 {
			t.Fatalf("completion %s: exit %d, %d bytes, %s", shell, code, out.Len(), errb.String())
		}
		// Each shell parses its script without running it (scripts/test-deps.sh
		// installs zsh and fish; -short needs only bash).
		if shell != "bash" && testing.Short() {
			continue
		}
		check := map[string][]string{"bash": {"bash", "-n"}, "zsh": {"zsh", "-n"}, "fish": {"fish", "--no-execute"}}[shell]
		cmd := exec.Command(check[0], check[1:]...)
		cmd.Stdin = &out
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s on the %s completion: %v %s", strings.Join(check, " "), shell, err, b)
		}
	}
}

// A command that only groups others is a usage error alone (exit 2, as
// the reference says), naming its subcommands.
func TestGroupingCommandAloneIsAUsageError(t *testing.T) {
	for _, c := range []string{"dead", "groups", "migrate", "completion"} {
		code, out, errOut := run(t, c)
		if code != 2 || !strings.Contains(errOut, "needs a subcommand") || out != "" {
			t.Errorf("%s alone: exit %d, stdout %q, stderr %q, want 2 naming its subcommands", c, code, out, errOut)
		}
	}
	if code, out, _ := run(t, "dead", "--help"); code != 0 || !strings.Contains(out, "Available Commands") {
		t.Errorf("dead --help: exit %d, %q", code, out)
	}
	if code, _, errOut := run(t, "dead", "lsit"); code != 2 || !strings.Contains(errOut, `unknown command "lsit"`) {
		t.Errorf("dead lsit: exit %d, %q, want 2 naming the unknown command", code, errOut)
	}
}
