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

// TestUnknownLayoutWhileRunningStopsTheWork: a running daemon that finds
// Redis recording a layout it does not know (a newer delaybridge's
// migrate, beginning) parks, claims and changes nothing in the store until
// the layout is one it knows again: /readyz 503 with what to do, a message
// read meanwhile is not parked (nor acknowledged), one parked before and
// due meanwhile is not claimed, an admin change is a 503; once the layout
// is known again both are delivered, once. It went on parking and
// publishing before.
func TestUnknownLayoutWhileRunningStopsTheWork(t *testing.T) {
	t.Parallel()
	rs, ns := testenv.Redis(t), testenv.NATS(t)
	ctx := context.Background()
	rdb := rs.Client()
	keys := store.NewKeys("running")
	js, fired := streamsAndFired(t, ns, map[string]string{"DELAYED": "delayed.>"})
	d := startDaemon(t, fmt.Sprintf(`
redis: {addr: %q, key_prefix: running, shards: 2}
admin: {listen: "%%ADMIN%%"}
scheduler: {max_sleep: 100ms}
ingest:
  - name: in
    nats: {url: %q, subject: "delayed.>", stream: DELAYED}
    route: {sink: out, destination: fired.x}
sinks:
  - name: out
    nats: {url: %q}
`, rs.Addr, ns.URL, ns.URL))
	known, _ := rdb.HGet(ctx, keys.Config(), "layout").Result()
	publishDelayed(t, js, "delayed.x", "before")
	if id := nextFired(t, fired, d.proc, "a message before the change"); id != "before" {
		t.Fatalf("fired %s", id)
	}
	// Parked before the change, due after it.
	publishDelayed(t, js, "delayed.x", "parked", "x-delay", "2s")
	testenv.Eventually(t, 10*time.Second, func() bool { return rdb.HExists(ctx, keys.Pool(store.ShardOf("parked", 2)), "parked").Val() },
		"the message due in 2 s not parked")
	newer := fmt.Sprint(store.LayoutNewest + 1)
	if err := rdb.HSet(ctx, keys.Config(), "layout", newer).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		code, body := d.get("/readyz", nil)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "migrate down")
	}, "/readyz not 503 with what to do")
	publishDelayed(t, js, "delayed.x", "meanwhile", "x-delay", "0s")
	testenv.Eventually(t, 20*time.Second, func() bool {
		return strings.Contains(d.proc.Output(), "cannot park; retrying") && strings.Contains(d.proc.Output(), "layout \\\""+newer+"\\\"")
	}, "the ingest did not say it cannot park, and why")
	if code, body := d.do(http.MethodDelete, "/v1/messages/parked", nil); code != http.StatusServiceUnavailable {
		t.Errorf("DELETE while the layout is unknown: %d %s, want 503", code, body)
	}
	if code, body := d.do(http.MethodPost, "/v1/sinks/out/pause", nil); code != http.StatusServiceUnavailable {
		t.Errorf("pause while the layout is unknown: %d %s, want 503", code, body)
	}
	if code, body := d.do(http.MethodPost, "/v1/messages/nope/fire", nil); code != http.StatusServiceUnavailable {
		t.Errorf("fire of an unknown ID while the layout is unknown: %d %s, want 503 (not a 404 read in a layout it does not know)", code, body)
	}
	// The parked message's due time passes, and a second more, ten times
	// scheduler.max_sleep: it stays in its due set.
	dueSet := keys.Due(store.ShardOf("parked", 2))
	score, err := rdb.ZScore(ctx, dueSet, "parked").Result()
	if err != nil {
		t.Fatalf("the parked message is not in its due set: %v", err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return time.Now().After(time.UnixMilli(int64(score)).Add(time.Second)) }, "its due time")
	if _, err := rdb.ZScore(ctx, dueSet, "parked").Result(); err != nil {
		t.Fatalf("the parked message left its due set while the layout was unknown: %v", err)
	}
	if m, err := fired.NextMsg(time.Second); err == nil {
		t.Fatalf("%s fired while the layout was unknown", m.Header.Get("x-message-id"))
	}
	if rdb.HExists(ctx, keys.Pool(store.ShardOf("meanwhile", 2)), "meanwhile").Val() {
		t.Fatal("a message read while the layout was unknown was parked")
	}
	if err := rdb.HSet(ctx, keys.Config(), "layout", known).Err(); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for range 2 {
		got[nextFired(t, fired, d.proc, "the messages once the layout is known again")]++
	}
	if got["parked"] != 1 || got["meanwhile"] != 1 {
		t.Fatalf("fired %v once the layout was known again, want parked and meanwhile once each", got)
	}
	if m, err := fired.NextMsg(time.Second); err == nil {
		t.Fatalf("%s fired again", m.Header.Get("x-message-id"))
	}
}
