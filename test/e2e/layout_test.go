package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// TestUnknownLayoutRefused: a Redis that records a layout newer than this
// build knows (written by a newer delaybridge) is never read as another:
// the daemon does not run, says why in its log and on /readyz (503), keeps
// answering /healthz, and stops cleanly; nothing in Redis is changed.
func TestUnknownLayoutRefused(t *testing.T) {
	t.Parallel()
	rs, ns := testenv.Redis(t), testenv.NATS(t)
	ctx := context.Background()
	rdb := rs.Client()
	cfgKey := store.NewKeys("newer").Config()
	newer := fmt.Sprint(store.LayoutNewest + 1)
	if err := rdb.HSet(ctx, cfgKey, "shards", 16, "layout", newer).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, "newer:{0}:pool", "m", "a message of that layout").Err(); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	cfg := fmt.Sprintf(`
redis: {addr: %q, key_prefix: newer}
admin: {listen: %q}
ingest:
  - name: in
    nats: {url: %q, subject: "delayed.>", stream: DELAYED}
    route: {sink: out, destination: fired.x}
sinks:
  - name: out
    nats: {url: %q}
`, rs.Addr, addr, ns.URL, ns.URL)
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	d := &daemon{t: t, bin: testenv.Build(t), cfgPath: path, admin: "http://" + addr}
	d.proc = testenv.StartProcess(t, d.bin, "run", "--config", d.cfgPath)
	testenv.Eventually(t, 30*time.Second, func() bool {
		code, _ := d.get("/healthz", nil)
		return code == http.StatusOK
	}, "no /healthz")
	code, body := d.get("/readyz", nil)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "layout") || !strings.Contains(body, "migrate down") {
		t.Fatalf("/readyz: %d %s", code, body)
	}
	if code, _ := d.get("/v1/stats", nil); code != http.StatusServiceUnavailable {
		t.Fatalf("/v1/stats: %d, want 503", code)
	}
	d.proc.Signal(syscall.SIGTERM)
	if code := d.proc.Wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d; output:\n%s", code, d.proc.Output())
	}
	if out := d.proc.Output(); !strings.Contains(out, "not running") || !strings.Contains(out, "layout \\\""+newer+"\\\"") {
		t.Errorf("the log does not say why:\n%s", out)
	}
	if v, _ := rdb.HGet(ctx, cfgKey, "layout").Result(); v != newer {
		t.Errorf("the layout was changed to %q", v)
	}
	if keys, _ := rdb.Keys(ctx, "newer:*").Result(); len(keys) != 2 {
		t.Errorf("keys %v, want the two written", keys)
	}
}
