package daemon_test

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

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/daemon"
	"github.com/delaybridge/delaybridge/pkg/ops"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// basicTime is a time in ISO 8601's basic format, as /readyz shows when
// Redis lost its data.
var basicTime = regexp.MustCompile(`\d{8}T\d{6}Z`)

// noPersistence are the arguments of a Redis that keeps nothing on disk.
var noPersistence = testenv.WithArgs("--appendonly", "no", "--save", "")

// A daemon on a Redis without AOF or RDB says so: a
// WARN at start that names what to set, again when Redis restarted (a
// reconnect to another run of it), a warning in /readyz's detail that keeps
// it 200, "redis_persistence" in GET /v1/stats and the gauges; once Redis
// has AOF (CONFIG SET, then a reconnect) the warning is gone everywhere.
func TestRedisWithoutPersistenceIsSaid(t *testing.T) {
	rs := testenv.Redis(t, noPersistence)
	ns := testenv.NATS(t)
	cfg, err := config.Parse(fmt.Appendf(nil, `
redis: {addr: "%s", key_prefix: p, shards: 2}
admin: {listen: "127.0.0.1:0"}
sinks: [{name: s, nats: {url: "%s"}}]
`, rs.Addr, ns.URL), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := context.WithCancel(context.Background())
	d, err := daemon.New(ctx, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	testenv.Eventually(t, 20*time.Second, func() bool { return d.AdminAddr() != "" && !strings.HasSuffix(d.AdminAddr(), ":0") },
		"the admin server did not start")
	base := "http://" + d.AdminAddr()

	warns := func() []string {
		var out []string
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "level=WARN") && strings.Contains(line, "keeps nothing on disk") {
				out = append(out, line)
			}
		}
		return out
	}
	if w := warns(); len(w) != 1 || !strings.Contains(w[0], rs.Addr) ||
		!strings.Contains(w[0], "appendonly yes") || !strings.Contains(w[0], "appendfsync everysec") {
		t.Fatalf("at start, want one WARN naming %s and what to set (appendonly yes, appendfsync everysec); the log:\n%s", rs.Addr, logs.String())
	}

	var ready struct {
		Status   string   `json:"status"`
		Warnings []string `json:"warnings"`
	}
	code := getJSON(t, base+"/readyz", &ready)
	if code != http.StatusOK || ready.Status != "ready" || len(ready.Warnings) != 1 ||
		!strings.Contains(ready.Warnings[0], "appendonly yes") {
		t.Errorf("/readyz: %d %+v, want 200 ready with the warning", code, ready)
	}
	if strings.Contains(strings.Join(ready.Warnings, " "), rs.Addr) {
		t.Errorf("/readyz names Redis's address to a caller without the token: %q", ready.Warnings)
	}

	stats := func() ops.PersistenceView {
		var v ops.StatsView
		if code := getJSON(t, base+"/v1/stats", &v); code != http.StatusOK || v.RedisPersistence == nil {
			t.Fatalf("GET /v1/stats: %d, redis_persistence %+v", code, v.RedisPersistence)
		}
		return *v.RedisPersistence
	}
	p := stats()
	if p.AOF == nil || *p.AOF || p.RDB == nil || *p.RDB || !strings.Contains(p.Warning, "appendonly yes") || p.CheckedAt == "" {
		t.Errorf("redis_persistence %s, want aof and rdb false, the warning, checked_at", jsonOf(p))
	}
	metrics := func() string {
		resp, err := http.Get(base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	for _, want := range []string{`delaybridge_redis_persistence{kind="aof"} 0`, `delaybridge_redis_persistence{kind="rdb"} 0`} {
		if m := metrics(); !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// A restart of Redis is a reconnect to another run of it: said again.
	rs.Kill()
	rs.Start()
	testenv.Eventually(t, 20*time.Second, func() bool { return len(warns()) == 2 },
		"no second WARN after Redis restarted and the daemon reconnected; the log:\n%s", lazy(logs.String))
	// The restarted Redis is empty: the daemon records the store's shard
	// count and layout again, so that an instance with another shard count
	// is refused as it was before.
	cfgKey := store.NewKeys("p").Config()
	testenv.Eventually(t, 20*time.Second, func() bool {
		v, _ := rs.Client().HMGet(context.Background(), cfgKey, "shards", "layout").Result()
		shards, _ := v[0].(string)
		return len(v) == 2 && strings.HasPrefix(shards, "2 (store layout") && v[1] == fmt.Sprint(store.LayoutNewest)
	}, "%s not recorded again after Redis restarted empty", cfgKey)
	// And says that Redis lost its data: an ERROR, and /readyz's warning
	// (still 200). It said nothing before: every parked message gone in
	// silence.
	lostLines := func() int {
		n := 0
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "level=ERROR") && strings.Contains(line, "Redis lost its data") && strings.Contains(line, "lost_at=") {
				n++
			}
		}
		return n
	}
	testenv.Eventually(t, 20*time.Second, func() bool { return lostLines() == 1 }, "no ERROR that Redis lost its data; the log:\n%s", lazy(logs.String))
	lostWarning := func(ws []string) bool {
		for _, w := range ws {
			// The time is shown whole to a caller without the token.
			if strings.Contains(w, "lost its data") && !strings.Contains(w, "<address>") && basicTime.MatchString(w) {
				return true
			}
		}
		return false
	}
	ready.Warnings = nil
	if code := getJSON(t, base+"/readyz", &ready); code != http.StatusOK || !lostWarning(ready.Warnings) {
		t.Errorf("/readyz after Redis lost its data: %d %+v, want 200 with a warning that says so", code, ready)
	}
	// A record another instance wrote meanwhile, with another shard count:
	// /readyz says so (503) at the next reading, and is ready again once
	// it matches.
	kick := func() {
		if err := rs.Client().Do(context.Background(), "CLIENT", "KILL", "TYPE", "normal").Err(); err != nil {
			t.Fatal(err)
		}
	}
	rs.Client().HSet(context.Background(), cfgKey, "shards", 8)
	kick()
	testenv.Eventually(t, 20*time.Second, func() bool {
		code, _ := getBody(t, base+"/readyz")
		return code == http.StatusServiceUnavailable
	}, "/readyz not 503 with redis.shards 2 against a record of 8")
	rs.Client().HSet(context.Background(), cfgKey, "shards", 2)
	kick()
	testenv.Eventually(t, 20*time.Second, func() bool {
		code, _ := getBody(t, base+"/readyz")
		return code == http.StatusOK
	}, "/readyz not 200 again once the record matches")

	// AOF on, then a reconnect (every client connection closed by Redis):
	// the warning is gone.
	rdb := rs.Client()
	if err := rdb.ConfigSet(context.Background(), "appendonly", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Do(context.Background(), "CLIENT", "KILL", "TYPE", "normal").Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		p := stats()
		return p.AOF != nil && *p.AOF && p.Warning == ""
	}, "redis_persistence after CONFIG SET appendonly yes and a reconnect: %s", lazy(func() string { return jsonOf(stats()) }))
	ready.Warnings = nil
	if code := getJSON(t, base+"/readyz", &ready); code != http.StatusOK || len(ready.Warnings) != 1 || !lostWarning(ready.Warnings) {
		t.Errorf("/readyz with AOF on: %d %+v, want only the warning that Redis lost its data (said for an hour)", code, ready)
	}
	if n := lostLines(); n != 1 {
		t.Errorf("%d ERRORs that Redis lost its data, want 1: said once", n)
	}
	if m := metrics(); !strings.Contains(m, `delaybridge_redis_persistence{kind="aof"} 1`) {
		t.Errorf("/metrics with AOF on lacks delaybridge_redis_persistence{kind=\"aof\"} 1")
	}
	if !strings.Contains(logs.String(), "persistence on now") {
		t.Errorf("the log does not say persistence is on now:\n%s", logs.String())
	}
	if len(warns()) != 2 {
		t.Errorf("%d WARNs, want 2: the reconnect with AOF on warned:\n%s", len(warns()), logs.String())
	}
}

// ReadPersistence reads every kind of Redis: one without persistence, with
// AOF, with RDB snapshots only, one that refuses CONFIG (unknown, no
// error), each master of a Cluster (naming only the one without), and the
// master a Sentinel names.
func TestReadPersistence(t *testing.T) {
	ctx := context.Background()
	open := func(t *testing.T, redisYAML string) *store.Store {
		t.Helper()
		cfg, err := config.Parse(fmt.Appendf(nil, `
redis: {%s}
sinks: [{name: s, nats: {url: "nats://127.0.0.1:1"}}]
`, redisYAML), func(string) (string, bool) { return "", false })
		if err != nil {
			t.Fatal(err)
		}
		st, err := daemon.OpenStore(ctx, cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Client().Close() })
		return st
	}
	for _, c := range []struct {
		name     string
		args     []string
		user     string // redis.username/password
		aof, rdb string // "true", "false", "null"
		warning  bool
		unknown  bool
	}{
		{"nothing on disk", []string{"--appendonly", "no", "--save", ""}, "", "false", "false", true, false},
		{"AOF", nil, "", "true", "false", false, false},
		{"RDB snapshots only", []string{"--appendonly", "no", "--save", "3600 1"}, "", "false", "true", false, false},
		{"CONFIG refused", []string{"--appendonly", "no", "--save", "", "--user", "app", "on", ">pw", "~*", "&*", "+@all", "-config"}, "app", "null", "null", false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			rs := testenv.Redis(t, testenv.WithArgs(c.args...))
			yaml := fmt.Sprintf("addr: %q", rs.Addr)
			if c.user != "" {
				yaml += fmt.Sprintf(", username: %s, password: pw", c.user)
			}
			p, err := daemon.ReadPersistence(ctx, open(t, yaml), "")
			if err != nil {
				t.Fatal(err)
			}
			v := p.View()
			if got := jsonOf(v.AOF) + " " + jsonOf(v.RDB); got != c.aof+" "+c.rdb {
				t.Errorf("aof rdb %s, want %s %s", got, c.aof, c.rdb)
			}
			if (v.Warning != "") != c.warning || (c.warning && !strings.Contains(v.Warning, rs.Addr)) {
				t.Errorf("warning %q, want one naming %s: %v", v.Warning, rs.Addr, c.warning)
			}
			if (v.Unknown != "") != c.unknown {
				t.Errorf("unknown %q, want it said: %v", v.Unknown, c.unknown)
			}
			if len(p.Masters) != 1 || p.Masters[0].RunID == "" {
				t.Errorf("masters %+v, want one with its run_id", p.Masters)
			}
		})
	}

	t.Run("Cluster", func(t *testing.T) {
		cl := testenv.RedisCluster(t, 3)
		bare := cl.Nodes[1]
		if err := bare.Client().ConfigSet(ctx, "appendonly", "no").Err(); err != nil {
			t.Fatal(err)
		}
		st := open(t, fmt.Sprintf("cluster: true, addrs: [%q]", cl.Addrs[0]))
		if cc, ok := st.Client().(*redis.ClusterClient); !ok || cc.Options().ClusterStateReloadInterval != daemon.ClusterReload {
			t.Errorf("the cluster client %T does not read the slots again every %s", st.Client(), daemon.ClusterReload)
		}
		p, err := daemon.ReadPersistence(ctx, st, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Masters) != 3 {
			t.Fatalf("read %d masters, want 3: %+v", len(p.Masters), p.Masters)
		}
		v := p.View()
		if !strings.Contains(v.Warning, bare.Addr) || strings.Contains(v.Warning, cl.Addrs[0]) || strings.Contains(v.Warning, cl.Addrs[2]) {
			t.Errorf("warning %q, want it to name %s only", v.Warning, bare.Addr)
		}
		if jsonOf(v.AOF) != "false" {
			t.Errorf("aof %s, want false: one master has none", jsonOf(v.AOF))
		}
	})

	t.Run("Sentinel", func(t *testing.T) {
		master := testenv.Redis(t, noPersistence)
		sentinel := testenv.RedisSentinel(t, "mymaster", master.Addr)
		p, err := daemon.ReadPersistence(ctx, open(t, fmt.Sprintf("sentinel_addrs: [%q], master_name: mymaster", sentinel.Addr)), `master "mymaster"`)
		if err != nil {
			t.Fatal(err)
		}
		runID, err := master.Client().Info(ctx, "server").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Masters) != 1 || p.Masters[0].RunID == "" || !strings.Contains(runID, "run_id:"+p.Masters[0].RunID) || !strings.Contains(p.Warning(), `master "mymaster"`) {
			t.Errorf("through Sentinel read %+v (warning %q), want the master's settings and run_id", p.Masters, p.Warning())
		}
	})
}

// getJSON GETs url and decodes its JSON into v, whatever the status.
func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: %d %s: %v", url, resp.StatusCode, b, err)
	}
	return resp.StatusCode
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// lazy formats as the func's result at the time it is formatted.
type lazy func() string

func (l lazy) String() string { return l() }

// syncBuffer is what a logger writes while the test reads it.
type syncBuffer = testenv.Output

// getBody fetches url and returns its status and body.
func getBody(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestReadyzAnswersWhileRedisAnswersNothing: a Redis that takes the PING
// and answers nothing (kill -STOP, a network cut) held /readyz for
// redis.read_timeout (go-redis bounds a reply by it, not by the ping's
// second), past a readiness probe's timeout: the probe then blamed the
// daemon. /readyz answers 503 naming Redis after about a second.
func TestReadyzAnswersWhileRedisAnswersNothing(t *testing.T) {
	rs := testenv.Redis(t)
	px := testenv.NewProxy(t, rs.Addr)
	ns := testenv.NATS(t)
	cfg, err := config.Parse(fmt.Appendf(nil, `
redis: {addr: "%s", key_prefix: p, shards: 2, read_timeout: 60s}
admin: {listen: "127.0.0.1:0"}
sinks: [{name: s, nats: {url: "%s"}}]
`, px.Addr, ns.URL), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	d, err := daemon.New(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		px.Flow()
		stop()
		<-done
	})
	testenv.Eventually(t, 20*time.Second, func() bool { return d.AdminAddr() != "" && !strings.HasSuffix(d.AdminAddr(), ":0") },
		"the admin server did not start")
	base := "http://" + d.AdminAddr()
	testenv.Eventually(t, 20*time.Second, func() bool { code, _ := getBody(t, base+"/readyz"); return code == http.StatusOK }, "ready")
	px.Stall()
	for range 2 { // the first PING, and one asked while it still waits
		start := time.Now()
		code, body := getBody(t, base+"/readyz")
		took := time.Since(start)
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "redis") || took > 5*time.Second {
			t.Errorf("/readyz while Redis answers nothing: %d %s after %v; want 503 naming redis within about a second (read_timeout is 60 s)",
				code, body, took.Round(10*time.Millisecond))
		}
	}
	px.Flow()
	testenv.Eventually(t, 30*time.Second, func() bool { code, _ := getBody(t, base+"/readyz"); return code == http.StatusOK }, "ready again")
}
