//go:build bench

package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// env holds the servers every scenario shares: one redis-server (AOF
// everysec, as the README recommends) and one embedded nats-server with
// JetStream running in this process, as the tests do.
type env struct {
	nats  *testenv.NATSServer
	redis *testenv.RedisServer
	rdb   *redis.Client
	bin   string // the daemon, built without -race
}

func newEnv(t *testing.T) *env {
	e := &env{nats: testenv.NATS(t), redis: testenv.Redis(t)}
	e.rdb = e.redis.Client()
	if *flagBin != "" {
		t.Logf("the daemon: %s (-bin)", *flagBin)
		e.bin = *flagBin
		return e
	}
	t.Log("building the daemon")
	e.bin = testenv.Build(t)
	return e
}

func (e *env) redisVersion() string {
	info, _ := e.rdb.Info(context.Background(), "server").Result()
	return infoField(info, "redis_version")
}

// connect returns a new NATS connection and its JetStream context, closed at
// the end of the test.
func (e *env) connect(t *testing.T, name string) (*nats.Conn, jetstream.JetStream) {
	return e.connectPending(t, name, 4096)
}

// connectPending is connect with at most pending asynchronous publishes in
// flight.
func (e *env) connectPending(t *testing.T, name string, pending int) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(e.nats.URL, nats.Name(name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(pending),
		jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *nats.Msg, error) { asyncPubErrs.Add(1) }))
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// errCodeStreamStoreFailed is nats-server's JSStreamStoreFailedF, which
// nats.go does not name.
const errCodeStreamStoreFailed jetstream.ErrorCode = 10049

// freshStream deletes stream name if it exists and creates it anew.
//
// A stream of the same name deleted a moment before may still be removing
// its files: the server then refuses the new one ("error creating store for
// stream", err_code 10049, once in a make bench run, the SCHED stream of
// native schedules' second run), so that is tried again for up to 10 s.
func freshStream(t *testing.T, js jetstream.JetStream, cfg jetstream.StreamConfig) jetstream.Stream {
	t.Helper()
	ctx := context.Background()
	_ = js.DeleteStream(ctx, cfg.Name)
	var s jetstream.Stream
	var err error
	testenv.Poll(10*time.Second, func() bool { // the server's deletion is not observable: poll
		s, err = js.CreateStream(ctx, cfg)
		var apiErr *jetstream.APIError
		return err == nil || !errors.As(err, &apiErr) || apiErr.ErrorCode != errCodeStreamStoreFailed
	})
	if err != nil {
		t.Fatalf("create stream %s: %v", cfg.Name, err)
	}
	return s
}

// ---- the daemon ----

type daemon struct {
	proc  *testenv.Process
	admin string
	// ready is how long the daemon took from exec to its first /readyz 200
	// (polled every 5 ms).
	ready time.Duration
}

// startDaemon writes cfg (admin.listen is %ADMIN%) and runs `delaybridge run`
// until /readyz answers 200. It returns nil and the process output when the
// daemon exits at start (e.g. an adapter missing from this build).
func (e *env) startDaemon(t *testing.T, cfg string) (*daemon, string) {
	return e.startDaemonBin(t, e.bin, cfg)
}

// startDaemonBin is startDaemon with another daemon binary.
func (e *env) startDaemonBin(t *testing.T, bin, cfg string) (*daemon, string) {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	cfg = strings.ReplaceAll(cfg, "%ADMIN%", addr)
	if *flagPprof != "" {
		cfg = strings.Replace(cfg, "admin: {listen: ", "admin: {pprof: true, token: "+pprofToken+", listen: ", 1)
	}
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	d := &daemon{admin: "http://" + addr}
	start := time.Now()
	d.proc = testenv.StartProcess(t, bin, "run", "--config", path)
	ready := false
	for deadline := start.Add(60 * time.Second); !d.proc.Exited() && time.Now().Before(deadline); {
		resp, err := http.Get(d.admin + "/readyz")
		if err == nil {
			drain(resp.Body)
			if resp.StatusCode == http.StatusOK {
				ready = true
				d.ready = time.Since(start)
				break
			}
		}
		time.Sleep(5 * time.Millisecond) // pacing of the poll; the start time is measured to this resolution
	}
	switch {
	case d.proc.Exited():
		return nil, d.proc.Output()
	case !ready:
		t.Fatalf("delaybridge not ready after 60s:\n%s", d.proc.Output())
	}
	return d, ""
}

// stop sends SIGTERM and waits for the exit.
func (d *daemon) stop(t *testing.T) {
	t.Helper()
	d.proc.Signal(syscall.SIGTERM)
	if code := d.proc.Wait(60 * time.Second); code != 0 {
		t.Errorf("delaybridge exit code %d after SIGTERM; output tail:\n%s", code, lastBytes(d.proc.Output(), 3000))
	}
}

func lastBytes(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// metrics scrapes /metrics and returns a few aggregates that explain where
// the time goes: mean batch sizes, mean script round trips, wake-up causes,
// ingest results.
func (d *daemon) metrics(t *testing.T) map[string]float64 {
	out := map[string]float64{}
	resp, err := http.Get(d.admin + "/metrics")
	if err != nil {
		t.Logf("scrape metrics: %v", err)
		return out
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Logf("parse metrics: %v", err)
		return out
	}
	mean := func(name, key string, label string) {
		f, ok := fams[name]
		if !ok {
			return
		}
		for _, m := range f.GetMetric() {
			h := m.GetHistogram()
			if h == nil || h.GetSampleCount() == 0 {
				continue
			}
			k := key
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					k = key + "." + l.GetValue()
				}
			}
			out[k+".count"] += float64(h.GetSampleCount())
			out[k+".mean"] = h.GetSampleSum() / float64(h.GetSampleCount())
		}
	}
	// The daemon's own lateness: its fire lateness histogram summed over
	// sinks, p50 and p99 interpolated within buckets as Prometheus's
	// histogram_quantile does (what a dashboard shows).
	if f, ok := fams["delaybridge_fire_lateness_seconds"]; ok {
		var bounds []float64
		cum := map[float64]float64{}
		var total float64
		for _, m := range f.GetMetric() {
			h := m.GetHistogram()
			if h == nil {
				continue
			}
			total += float64(h.GetSampleCount())
			for _, b := range h.GetBucket() {
				if _, seen := cum[b.GetUpperBound()]; !seen {
					bounds = append(bounds, b.GetUpperBound())
				}
				cum[b.GetUpperBound()] += float64(b.GetCumulativeCount())
			}
		}
		if total > 0 {
			sort.Float64s(bounds)
			counts := make([]float64, len(bounds))
			for i, b := range bounds {
				counts[i] = cum[b]
			}
			out["fire_lateness.count"] = total
			out["fire_lateness.p50"] = histogramQuantile(0.5, bounds, counts, total)
			out["fire_lateness.p99"] = histogramQuantile(0.99, bounds, counts, total)
			for i, b := range bounds {
				if b == 0.001 {
					out["fire_lateness.within_1ms"] = counts[i] / total
				}
			}
		}
	}
	mean("delaybridge_park_batch_size", "park_batch_size", "")
	mean("delaybridge_claim_batch_size", "claim_batch_size", "")
	mean("delaybridge_park_duration_seconds", "park_seconds", "")
	mean("delaybridge_sink_publish_duration_seconds", "sink_publish_seconds", "")
	mean("delaybridge_redis_script_duration_seconds", "script_seconds", "script")
	for _, c := range []struct{ name, key, label string }{
		{"delaybridge_scheduler_wakeups_total", "wakeups", "cause"},
		{"delaybridge_ingest_messages_total", "ingest", "result"},
		{"delaybridge_sink_publish_errors_total", "publish_errors", "sink"},
		{"delaybridge_retries_total", "retries", "sink"},
		{"delaybridge_sink_published_total", "published", "-"}, // summed over sinks
	} {
		f, ok := fams[c.name]
		if !ok {
			continue
		}
		for _, m := range f.GetMetric() {
			k := c.key
			for _, l := range m.GetLabel() {
				if l.GetName() == c.label {
					k += "." + l.GetValue()
				}
			}
			out[k] += m.GetCounter().GetValue()
		}
	}
	return out
}

// startPerf runs `perf record -g` on pids while a run lasts when -perf is
// set; the returned function stops it (SIGINT, as perf expects).
func startPerf(t *testing.T, name string, pids ...int) func() {
	if *flagPerf == "" {
		return func() {}
	}
	if err := os.MkdirAll(*flagPerf, 0o755); err != nil {
		t.Fatal(err)
	}
	var ps []string
	for _, p := range pids {
		ps = append(ps, strconv.Itoa(p))
	}
	out := filepath.Join(*flagPerf, "perf-"+name+".data")
	cmd := exec.Command("perf", "record", "-F", "499", "-g", "-o", out, "-p", strings.Join(ps, ","))
	log, _ := os.Create(out + ".log")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Logf("perf: %v", err)
		return func() {}
	}
	t.Logf("perf recording pids %v to %s", ps, out)
	return func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		log.Close()
	}
}

// pprofToken is the admin token of a daemon run with -pprof: pprof is
// served only behind the token.
const pprofToken = "bench-pprof-token"

// startProfile fetches a 5 s CPU profile of the daemon when -pprof is set;
// the returned function waits for it.
func startProfile(t *testing.T, name string, d *daemon) func() {
	if *flagPprof == "" {
		return func() {}
	}
	if err := os.MkdirAll(*flagPprof, 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(*flagPprof, "cpu-"+name+".pprof")
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, err := http.NewRequest(http.MethodGet, d.admin+"/debug/pprof/profile?seconds=5", nil)
		if err != nil {
			t.Logf("pprof: %v", err)
			return
		}
		req.Header.Set("Authorization", "Bearer "+pprofToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Logf("pprof: %v", err)
			return
		}
		defer resp.Body.Close()
		f, err := os.Create(out)
		if err != nil {
			t.Logf("pprof: %v", err)
			return
		}
		defer f.Close()
		_, _ = io.Copy(f, resp.Body)
		t.Logf("daemon CPU profile in %s", out)
	}()
	return func() { <-done }
}

// redisPid is the redis-server's process ID (INFO server).
func redisPid(rdb *redis.Client) int {
	info, _ := rdb.Info(context.Background(), "server").Result()
	return int(infoFloat(info, "process_id"))
}

// ---- /proc and INFO: CPU and memory ----

const clockTicks = 100 // USER_HZ on Linux

// procCPU returns utime+stime of pid in seconds (pid 0: this process).
func procCPU(pid int) float64 {
	p := "/proc/self/stat"
	if pid > 0 {
		p = fmt.Sprintf("/proc/%d/stat", pid)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return -1
	}
	s := string(b)
	s = s[strings.LastIndexByte(s, ')')+2:] // fields from 3 (state) on
	f := strings.Fields(s)
	ut, _ := strconv.ParseFloat(f[11], 64) // field 14
	st, _ := strconv.ParseFloat(f[12], 64) // field 15
	return (ut + st) / clockTicks
}

// procHWM returns VmHWM (peak RSS) of pid in MB.
func procHWM(pid int) float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if kb, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			v, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(kb), "kB")), 64)
			return v / 1024
		}
	}
	return -1
}

func infoField(info, name string) string {
	for _, l := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(l, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func infoFloat(info, name string) float64 {
	v, _ := strconv.ParseFloat(infoField(info, name), 64)
	return v
}

// redisCPU returns used_cpu_user+used_cpu_sys of the Redis server.
func redisCPU(rdb *redis.Client) float64 {
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		return -1
	}
	return infoFloat(info, "used_cpu_user") + infoFloat(info, "used_cpu_sys")
}

// flushAll empties the Redis at addr with a patient client: FLUSHALL of
// millions of keys takes longer than a client's default 3 s read timeout.
func flushAll(t *testing.T, addr string) {
	t.Helper()
	slow := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 10 * time.Minute})
	defer slow.Close()
	if err := slow.FlushAll(context.Background()).Err(); err != nil {
		t.Fatalf("FLUSHALL: %v", err)
	}
}

func redisUsedMemory(t *testing.T, rdb *redis.Client) float64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	return infoFloat(info, "used_memory")
}

// cpuMeter measures the CPU used by the daemon, Redis and this process (the
// embedded nats-server, the load generator and the consumer) over a run.
type cpuMeter struct {
	pid                           int
	rdb                           *redis.Client
	daemon0, redis0, self0, busy0 float64
	forks0                        float64
	reads0                        float64
	cmds0                         map[string]testenv.CommandStat
	wall0                         time.Time
}

// redisCmds returns INFO commandstats by command (empty when Redis does
// not answer: the note then says nothing of it).
func redisCmds(rdb *redis.Client) map[string]testenv.CommandStat {
	out, _ := testenv.CommandStats(rdb)
	return out
}

// cmdNote says where Redis's time went between two readings of
// commandstats, per message: in scripts (EVALSHA, and FCALL of the hot
// path's functions, with the commands they run), and the commands that
// took most, run by a script or not (Redis's own I/O, AOF and expiry are
// the rest of its CPU).
func cmdNote(before, after map[string]testenv.CommandStat, messages int) string {
	type row struct {
		name        string
		calls, usec float64
	}
	var rows []row
	for name, a := range after {
		b := before[name]
		if r := (row{name, a.Calls - b.Calls, a.Usec - b.Usec}); r.calls > 0 && name != "evalsha" && name != "fcall" {
			rows = append(rows, r)
		}
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].usec > rows[j].usec })
	n := float64(max(messages, 1))
	var ev testenv.CommandStat
	for _, name := range []string{"evalsha", "fcall"} {
		ev.Calls += after[name].Calls - before[name].Calls
		ev.Usec += after[name].Usec - before[name].Usec
	}
	parts := []string{fmt.Sprintf("scripts %.1f us/msg (%.2f calls/msg, %.1f us each)", ev.Usec/n, ev.Calls/n, ev.Usec/max(ev.Calls, 1))}
	for i, r := range rows {
		if i == 5 {
			break
		}
		parts = append(parts, fmt.Sprintf("%s %.1f us/msg (%.2f calls/msg, %.1f us each)", r.name, r.usec/n, r.calls/n, r.usec/r.calls))
	}
	return "Redis commandstats: " + strings.Join(parts, ", ")
}

// redisReads is how many reads Redis's event loop has made from its clients
// (INFO stats total_reads_processed): one per round trip a client makes, so
// its growth per message says how many round trips a message costs.
func redisReads(rdb *redis.Client) float64 {
	info, _ := rdb.Info(context.Background(), "stats").Result()
	return infoFloat(info, "total_reads_processed")
}

func redisForks(rdb *redis.Client) float64 {
	info, _ := rdb.Info(context.Background(), "stats").Result()
	return infoFloat(info, "total_forks")
}

func startCPU(pid int, rdb *redis.Client) *cpuMeter {
	return &cpuMeter{pid: pid, rdb: rdb, daemon0: procCPU(pid), redis0: redisCPU(rdb), self0: procCPU(0), busy0: machineBusy(), forks0: redisForks(rdb),
		reads0: redisReads(rdb), cmds0: redisCmds(rdb), wall0: time.Now()}
}

// machineBusy returns the CPU seconds all CPUs spent not idle since boot
// (/proc/stat), to tell how much other processes took during a run.
func machineBusy() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)[1:]
	var busy float64
	for i, v := range f {
		x, _ := strconv.ParseFloat(v, 64)
		if i != 3 && i != 4 && i < 8 { // skip idle, iowait; guest is inside user
			busy += x
		}
	}
	return busy / clockTicks
}

func (c *cpuMeter) stop(s *Scenario) {
	s.WallSeconds = time.Since(c.wall0).Seconds()
	if c.pid > 0 {
		s.DaemonCPUSeconds = procCPU(c.pid) - c.daemon0
		s.DaemonPeakRSSMB = procHWM(c.pid)
	}
	s.RedisCPUSeconds = redisCPU(c.rdb) - c.redis0
	s.HarnessCPUSeconds = procCPU(0) - c.self0
	s.OtherCPUSeconds = machineBusy() - c.busy0 - s.HarnessCPUSeconds - s.RedisCPUSeconds - max(s.DaemonCPUSeconds, 0)
	s.MachineCPUs = runtime.NumCPU()
	if f := redisForks(c.rdb) - c.forks0; f > 0 {
		s.note("Redis forked %.0f time(s) during the run (AOF rewrite)", f)
	}
	if s.Messages > 0 {
		s.note("%s; %.1f Redis reads (round trips) per message", cmdNote(c.cmds0, redisCmds(c.rdb), s.Messages), (redisReads(c.rdb)-c.reads0)/float64(s.Messages))
	}
}

// drain returns what the meter measured so far as a DrainCPU (the meter
// goes on).
func (c *cpuMeter) drain() *DrainCPU {
	var s Scenario
	c.stop(&s)
	return &DrainCPU{Wall: s.WallSeconds, Available: float64(s.MachineCPUs) * s.WallSeconds, Daemon: max(s.DaemonCPUSeconds, 0),
		Redis: s.RedisCPUSeconds, Harness: s.HarnessCPUSeconds, Other: s.OtherCPUSeconds}
}

// ---- load ----

// natsLoad describes one end-to-end run.
type natsLoad struct {
	kind      string        // "max": as fast as possible; "rate": paced; "spread": as fast as possible, due times spread; "burst": as fast as possible, all due at one instant
	n         int           // messages
	rate      float64       // msg/s for "rate"
	delay     time.Duration // x-delay for "max" and "rate"
	window    time.Duration // "spread": due times cover [t0+lead, t0+lead+window)
	lead      time.Duration // "burst": the instant all are due is the start + lead
	preParked int           // far-future messages parked before the run

	// How the run is set up, for the groups that compare setups (parked10m,
	// features); zero values are the defaults of the classic runs.
	group   string // Scenario.Group
	kept    int    // messages the caller parked already: Redis is not flushed
	cfg     string // YAML added to the daemon's config (e.g. a scheduler: block)
	variant string // what cfg or bin change, for the scenario's System
	bin     string // daemon binary; empty: the one built from this tree
}

func (l natsLoad) name() string {
	switch l.kind {
	case "rate":
		return fmt.Sprintf("rate %s/s, delay %s", humanCount(l.rate), l.delay)
	case "spread":
		return fmt.Sprintf("%s due over %s", humanCount(float64(l.n)), l.window)
	}
	var s string
	if l.kind == "burst" {
		s = fmt.Sprintf("burst, %s msgs due at one instant", humanCount(float64(l.n)))
	} else {
		s = fmt.Sprintf("max rate, %s msgs, delay %s", humanCount(float64(l.n)), l.delay)
	}
	if p := max(l.preParked, l.kept); p > 0 {
		s += fmt.Sprintf(", %s parked", humanCount(float64(p)))
	}
	return s
}

// burstLead is how far ahead of the start of publishing a burst is due:
// -burst-lead, or when that is 0 enough for the ingest to park n messages
// on a busy machine (2 s + 1 s per 8k: parking ran at 9k-16k msg/s while
// other test suites took most of the two cores, 40k-60k on a quiet one).
func burstLead(n int) time.Duration {
	if *flagBurstLead > 0 {
		return *flagBurstLead
	}
	return 2*time.Second + time.Duration(n)*time.Second/8_000
}

func humanCount(v float64) string {
	switch {
	case v >= 1e6 && int(v)%100_000 == 0:
		return strconv.FormatFloat(v/1e6, 'f', -1, 64) + "M"
	case v >= 1e3 && int(v)%100 == 0:
		return strconv.FormatFloat(v/1e3, 'f', -1, 64) + "k"
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// spreadLead is how far after the start the first due time of a spread run
// lies.
const spreadLead = 2 * time.Second

// asyncPubErrs counts failed asynchronous publishes (no PubAck, or an
// error PubAck) of every JetStream context made by env.connect.
var asyncPubErrs atomic.Int64

type pubResult struct {
	first, last time.Time // first publish call, last PubAck
	errs        int64     // failed publishes (those messages are missing)
}

// publish publishes n messages built by mk with PublishMsgAsync, as fast as
// possible (rate 0) or paced at rate msg/s, and waits for every PubAck.
func publish(t *testing.T, js jetstream.JetStream, n int, rate float64, mk func(i int) *nats.Msg) *pubResult {
	t.Helper()
	r := &pubResult{}
	errs0 := asyncPubErrs.Load()
	r.first = time.Now()
	for i := 0; i < n; {
		if rate > 0 && float64(i) >= rate*time.Since(r.first).Seconds()+1 {
			time.Sleep(500 * time.Microsecond)
			continue
		}
		if _, err := js.PublishMsgAsync(mk(i)); err != nil {
			time.Sleep(time.Millisecond)
			continue // e.g. too many pending: retried, every message must go out
		}
		i++
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(2 * time.Minute):
		t.Errorf("publish: PubAcks missing after 2 minutes")
	}
	r.last = time.Now()
	r.errs = asyncPubErrs.Load() - errs0
	return r
}

// ---- the receiving side ----

// recorder collects what a consumer receives: one lateness sample per
// message (arrival minus due), duplicates, and the arrival span.
type recorder struct {
	n      int
	prefix string // x-message-id is prefix + 7-digit index

	mu          sync.Mutex
	seen        []bool
	lat         []time.Duration
	dues        []time.Time // due time of lat[i]
	order       []int32     // message indexes in the order they were recorded
	dups, alien int
	first, last time.Time
	count       atomic.Int64
}

func newRecorder(n int, prefix string) *recorder {
	return &recorder{n: n, prefix: prefix, seen: make([]bool, n), lat: make([]time.Duration, 0, n), dues: make([]time.Time, 0, n), order: make([]int32, 0, n)}
}

func msgID(prefix string, i int) string {
	b := make([]byte, 0, len(prefix)+8)
	b = append(b, prefix...)
	b = append(b, '-')
	s := strconv.Itoa(i)
	for k := len(s); k < 7; k++ {
		b = append(b, '0')
	}
	return string(append(b, s...))
}

// record notes one arrival at time at of the message id due at due.
func (r *recorder) record(id string, at, due time.Time) {
	i := -1
	if rest, ok := strings.CutPrefix(id, r.prefix+"-"); ok {
		if v, err := strconv.Atoi(rest); err == nil && v >= 0 && v < r.n {
			i = v
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case i < 0:
		r.alien++
		return
	case r.seen[i]:
		r.dups++
		return
	}
	r.seen[i] = true
	r.order = append(r.order, int32(i))
	r.lat = append(r.lat, at.Sub(due))
	r.dues = append(r.dues, due)
	if r.first.IsZero() || at.Before(r.first) {
		r.first = at
	}
	if at.After(r.last) {
		r.last = at
	}
	r.count.Add(1)
}

// wait waits until every message arrived, or nothing arrived for stall, or
// max passed. It reports whether all arrived.
func (r *recorder) wait(stall, max time.Duration) bool {
	deadline := time.Now().Add(max)
	last, lastChange := int64(-1), time.Now()
	for time.Now().Before(deadline) {
		c := r.count.Load()
		if int(c) >= r.n {
			return true
		}
		if c != last {
			last, lastChange = c, time.Now()
		} else if time.Since(lastChange) > stall {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

func (r *recorder) fill(s *Scenario) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s.Received = len(r.lat)
	s.Duplicates = r.dups
	s.Missing = r.n - len(r.lat)
	s.Lateness = summarize(r.lat)
	if s.Kind == "max" || s.Kind == "burst" || s.Kind == "million" || len(r.lat) == 0 {
		return
	}
	// Worst lateness per second of due time: tells a steady tail from a
	// few bursts (a GC, an fsync, another process taking the CPUs).
	t0 := r.dues[0]
	for _, d := range r.dues {
		if d.Before(t0) {
			t0 = d
		}
	}
	for i, d := range r.dues {
		sec := int(d.Sub(t0) / time.Second)
		for len(s.MaxLatenessPerSecond) <= sec {
			s.MaxLatenessPerSecond = append(s.MaxLatenessPerSecond, 0)
		}
		if ms := float64(r.lat[i].Microseconds()) / 1000; ms > s.MaxLatenessPerSecond[sec] {
			s.MaxLatenessPerSecond[sec] = ms
		}
	}
	var over []string
	for sec, v := range s.MaxLatenessPerSecond {
		if v > 50 {
			over = append(over, fmt.Sprintf("s%d: %.0f ms", sec, v))
		}
	}
	if len(over) > 0 {
		s.note("seconds (of due time) whose worst lateness exceeded 50 ms: %d of %d (%s)", len(over), len(s.MaxLatenessPerSecond), strings.Join(over, ", "))
	}
}

// consumeFired records the messages of an ordered consumer on stream
// (filter subjects) with arrival = the stream's timestamp (when the sink's
// publish was stored) and due = dueOf(message).
func consumeFired(t *testing.T, js jetstream.JetStream, stream string, filter string, rec *recorder, dueOf func(nats.Header) (time.Time, bool)) jetstream.ConsumeContext {
	t.Helper()
	ctx := context.Background()
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		md, err := m.Metadata()
		if err != nil {
			return
		}
		due, ok := dueOf(m.Headers())
		if !ok {
			rec.mu.Lock()
			rec.alien++
			rec.mu.Unlock()
			return
		}
		rec.record(m.Headers().Get("x-message-id"), md.Timestamp, due)
	}, jetstream.PullMaxMessages(2000))
	if err != nil {
		t.Fatal(err)
	}
	return cc
}

// ---- statistics ----

// Lateness is a distribution in milliseconds.
type Lateness struct {
	N    int     `json:"n"`
	Min  float64 `json:"min_ms"`
	Mean float64 `json:"mean_ms"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	P999 float64 `json:"p999_ms"`
	Max  float64 `json:"max_ms"`
}

func summarize(d []time.Duration) *Lateness {
	if len(d) == 0 {
		return nil
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	ms := func(x time.Duration) float64 { return float64(x.Microseconds()) / 1000 }
	q := func(p float64) float64 {
		i := int(p*float64(len(s))+0.5) - 1
		return ms(s[min(max(i, 0), len(s)-1)])
	}
	var sum time.Duration
	for _, x := range s {
		sum += x
	}
	return &Lateness{N: len(s), Min: ms(s[0]), Mean: ms(sum / time.Duration(len(s))), P50: q(.50), P90: q(.90), P99: q(.99), P999: q(.999), Max: ms(s[len(s)-1])}
}

// drain reads and discards a response body.
func drain(r io.ReadCloser) { _, _ = io.Copy(io.Discard, r); r.Close() }

// histogramQuantile is Prometheus's histogram_quantile for one histogram:
// bounds are the buckets' upper bounds in order, counts their cumulative
// counts, total the sample count (the +Inf bucket). The quantile is
// interpolated linearly within its bucket (from 0 for the first); one past
// the last finite bound is that bound.
func histogramQuantile(q float64, bounds, counts []float64, total float64) float64 {
	rank := q * total
	lower, below := 0.0, 0.0
	for i, b := range bounds {
		if counts[i] >= rank {
			if counts[i] == below {
				return b
			}
			return lower + (b-lower)*(rank-below)/(counts[i]-below)
		}
		lower, below = b, counts[i]
	}
	return lower
}
