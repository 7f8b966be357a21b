package cli

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/ops"
)

// `validate --live` asks the configured Redis what the daemon would:
// without AOF or RDB it warns and names what to set (exit 0),
// with AOF it says so, and an unreachable Redis is exit 1 with what to
// check. `stats -c` reads the same into redis_persistence.
func TestValidateLiveReportsPersistence(t *testing.T) {
	config := func(addr string) string {
		return writeConfig(t, fmt.Sprintf(`
redis: {addr: "%s", key_prefix: live, dial_timeout: 500ms}
sinks: [{name: s, nats: {url: "nats://127.0.0.1:4222"}}]
`, addr))
	}
	bare := testenv.Redis(t, testenv.WithArgs("--appendonly", "no", "--save", ""))
	cfg := config(bare.Addr)
	code, out, errOut := run(t, "validate", "--live", "-c", cfg)
	if code != 0 || !strings.Contains(out, "is valid") || !strings.Contains(out, "redis "+bare.Addr+": persistence: AOF off, RDB snapshots off") {
		t.Errorf("no persistence: exit %d, stdout %q, want 0 and the settings", code, out)
	}
	if !strings.Contains(errOut, "warning: redis: "+bare.Addr+" keeps nothing on disk") ||
		!strings.Contains(errOut, "appendonly yes") || !strings.Contains(errOut, "appendfsync everysec") {
		t.Errorf("no persistence: stderr %q, want a warning naming what to set", errOut)
	}

	code, out, _ = run(t, "stats", "--json", "-c", cfg)
	var v ops.StatsView
	if err := json.Unmarshal([]byte(out), &v); code != 0 || err != nil || v.RedisPersistence == nil ||
		!strings.Contains(v.RedisPersistence.Warning, "appendonly yes") {
		t.Errorf("stats --json: exit %d, %s, want redis_persistence with the warning", code, out)
	}

	aof := testenv.Redis(t)
	code, out, errOut = run(t, "validate", "--live", "-c", config(aof.Addr))
	if code != 0 || !strings.Contains(out, "AOF on") || strings.Contains(errOut, "warning") {
		t.Errorf("AOF: exit %d, stdout %q, stderr %q, want 0, AOF on and no warning", code, out, errOut)
	}

	down := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	code, _, errOut = run(t, "validate", "--live", "-c", config(down))
	if code != 1 || !strings.Contains(errOut, "redis "+down) || !strings.Contains(errOut, "is Redis running") {
		t.Errorf("no Redis: exit %d, stderr %q, want 1 naming Redis and what to check", code, errOut)
	}
	// Without --live nothing is contacted.
	if code, out, _ := run(t, "validate", "-c", config(down)); code != 0 || strings.Contains(out, "persistence") {
		t.Errorf("validate without --live: exit %d, %q", code, out)
	}
}
