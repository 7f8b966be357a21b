package cli

// The command line as a newcomer meets it, second pass (issue 43, point 7):
// the small things that cost time or trust, each with its test.

import (
	"fmt"
	"strings"
	"testing"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// A command that acts on parked messages, given neither a configuration
// nor a daemon, says both ways: --admin (DELAYBRIDGE_ADMIN, which
// `. .delaybridge-dev/env` sets) and --config. It used to name only
// --config, which a user of dev has no reason to give.
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
