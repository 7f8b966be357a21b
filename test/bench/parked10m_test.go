//go:build bench

package bench

import (
	"context"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// The ten-million scenario (-only parked10m): -parked10m messages of -body
// bytes parked in a Redis of their own (AOF everysec), due times spread
// evenly over -parked10m-window starting 1 h ahead (so that none fires
// while it is measured), then:
//
//   - Redis memory per message (INFO used_memory over the park), the AOF's
//     size after a rewrite, and how long Redis takes to stop and to start
//     again and load it;
//   - the daemon's start to /readyz, and the time of GET /v1/stats and
//     GET /metrics, with the messages parked and with an empty Redis;
//   - the maximum-rate run (new parks/s, end-to-end/s) and a same-instant
//     burst (firing/s) with the messages parked, alternated with the same
//     runs on the benchmark's other, empty, Redis.
//
// The messages are parked directly with store.Park from this process (the
// daemon's park script and layout, 4096 messages per call, two calls in
// flight): through an ingest 10M would take minutes of the two cores. Then
// -parked10m-1k messages of 1 KB replace them for the 1 KB point of the
// sizing table (memory, AOF, load time).

var (
	flagBigN       = flag.Int("parked10m", 10_000_000, "messages parked for the ten-million scenario (-only parked10m); 1000000 for a quick run")
	flagBigWindow  = flag.Duration("parked10m-window", 24*time.Hour, "the parked messages' due times spread evenly over this window, from 1 h ahead")
	flagBigKB      = flag.Int("parked10m-1k", 1_000_000, "messages with 1 KB bodies parked afterwards for the 1 KB point of the sizing table; 0: skip")
	flagBigBurst   = flag.Int("parked10m-burst", 200_000, "size of the same-instant burst run with and without the parked messages (firing rate)")
	flagBigRepeat  = flag.Int("parked10m-repeat", 1, "passes over the empty / parked run pairs")
	flagBigSamples = flag.Int("scrape-samples", 20, "GET /v1/stats and GET /metrics samples per daemon")
)

// BigParked is what the ten-million scenario measured.
type BigParked struct {
	Points []BigPoint `json:"points"` // -parked10m x -body, then -parked10m-1k x 1024
	// Probes: the daemon's start and the scrapes, on an empty Redis and
	// with Points[0] parked.
	Empty  *Probe   `json:"empty"`
	Parked *Probe   `json:"parked"`
	Notes  []string `json:"notes,omitempty"`
}

// BigPoint is one parked data set: its memory, AOF and load time.
type BigPoint struct {
	Messages     int     `json:"messages"`
	BodyBytes    int     `json:"body_bytes"`
	IDBytes      int     `json:"id_bytes"`
	Window       string  `json:"due_window"`
	ParkSeconds  float64 `json:"park_seconds"` // store.Park from this process
	ParkRate     float64 `json:"park_rate"`
	UsedMemory0  float64 `json:"used_memory_before"`
	UsedMemory1  float64 `json:"used_memory_after"`
	BytesPerMsg  float64 `json:"bytes_per_msg"`
	RSSBytes     float64 `json:"used_memory_rss_after"`
	RewriteSecs  float64 `json:"aof_rewrite_seconds"`
	AOFBytes     int64   `json:"aof_bytes"` // appendonlydir after the rewrite
	AOFPerMsg    float64 `json:"aof_bytes_per_msg"`
	StopSecs     float64 `json:"redis_stop_seconds"` // SIGTERM to exit
	LoadSecs     float64 `json:"redis_start_seconds"`
	LoadLogSecs  float64 `json:"redis_load_seconds_logged,omitempty"` // "DB loaded from append only file: X seconds"
	ParkedAfter  int64   `json:"parked_after_restart"`
	UsedMemAfter float64 `json:"used_memory_after_restart"`
}

// Probe is the daemon's start and its scrapes on one data set.
type Probe struct {
	Parked       int64     `json:"parked"`
	ReadySeconds []float64 `json:"daemon_ready_seconds"` // exec -> /readyz 200, one per start
	Stats        *Timing   `json:"get_v1_stats"`
	Metrics      *Timing   `json:"get_metrics"`
	// The Redis parts of a scrape, called from this process: store.Stats
	// (one script per shard, pipelined) and INFO memory.
	StatsScript *Timing `json:"store_stats"`
	InfoMemory  *Timing `json:"info_memory"`
}

// Timing is a sample of durations in milliseconds.
type Timing struct {
	Samples  int     `json:"samples"`
	MedianMS float64 `json:"median_ms"`
	P99MS    float64 `json:"p99_ms"`
	MaxMS    float64 `json:"max_ms"`
	MinMS    float64 `json:"min_ms"`
	Bytes    int     `json:"response_bytes,omitempty"`
	// Errors counts the requests that failed or did not answer 200 (not
	// among the samples).
	Errors int `json:"errors,omitempty"`
}

func timing(ds []time.Duration) *Timing {
	if len(ds) == 0 {
		return nil
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	p99 := s[min(max(int(0.99*float64(len(s))+0.5)-1, 0), len(s)-1)] // as summarize
	return &Timing{Samples: len(s), MedianMS: ms(s[len(s)/2]), P99MS: ms(p99), MaxMS: ms(s[len(s)-1]), MinMS: ms(s[0])}
}

// bigEnough checks that memory and disk hold bytes of data set (Redis's
// memory, the AOF, and the old and new AOF side by side during a rewrite)
// and says what is missing.
func bigEnough(dir string, bytes float64) string {
	var avail float64
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "MemAvailable:"); ok {
				kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
				avail = kb * 1024
			}
		}
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return err.Error()
	}
	disk := float64(st.Bavail) * float64(st.Bsize)
	switch {
	case avail < 1.5*bytes+2e9:
		return fmt.Sprintf("%.1f GB of memory available, %.1f GB wanted (1.5 x the data set + 2 GB)", avail/1e9, (1.5*bytes+2e9)/1e9)
	case disk < 2.5*bytes+2e9:
		return fmt.Sprintf("%.1f GB of disk free in %s, %.1f GB wanted (2.5 x the data set + 2 GB)", disk/1e9, dir, (2.5*bytes+2e9)/1e9)
	}
	return ""
}

// runParked10M runs the ten-million scenario (see the top of this file).
func runParked10M(t *testing.T, e *env, rep *Report) {
	n, body := *flagBigN, *flagBody
	big := &BigParked{}
	rep.Parked10M = big
	r := testenv.Redis(t, testenv.WithReadyTimeout(15*time.Minute)) // an AOF of gigabytes loads for minutes on a busy machine
	if why := bigEnough(r.Dir, float64(n)*float64(body+250)); why != "" {
		big.Notes = append(big.Notes, fmt.Sprintf("not run with %d messages: %s (lower -parked10m)", n, why))
		t.Logf("parked10m skipped: %s", big.Notes[0])
		r.Kill()
		return
	}
	be := &env{nats: e.nats, redis: r, rdb: r.Client(), bin: e.bin}

	t.Log("== parked10m: the daemon's start and scrapes on an empty Redis")
	big.Empty = be.probe(t)

	t.Logf("== parked10m: parking %d messages of %d B, due over %s from +1h", n, body, *flagBigWindow)
	p := be.parkPoint(t, n, body, "p")
	be.restartPoint(t, &p)
	big.Points = append(big.Points, p)

	t.Log("== parked10m: the daemon's start and scrapes with the messages parked")
	big.Parked = be.probe(t)

	// The runs, alternated: empty (the benchmark's Redis), parked (this one).
	for pass := 0; pass < max(1, *flagBigRepeat); pass++ {
		for _, l := range []natsLoad{
			{kind: "max", n: *flagN, delay: *flagDelay, group: "parked10m"},
			{kind: "burst", n: *flagBigBurst, lead: burstLead(*flagBigBurst), group: "parked10m"},
		} {
			rep.add(t, e.runDaemonNATS(t, l))
			l.kept = n
			rep.add(t, be.runDaemonNATS(t, l))
		}
	}

	if m := *flagBigKB; m > 0 {
		flushAll(t, r.Addr)   // gigabytes
		rewriteAOF(t, be.rdb) // an empty base: the old data set's files go
		t.Logf("== parked10m: parking %d messages of 1 KB", m)
		p := be.parkPoint(t, m, 1024, "k")
		be.restartPoint(t, &p)
		big.Points = append(big.Points, p)
	}
	r.Kill()
	if err := os.RemoveAll(r.Dir); err != nil {
		t.Logf("remove %s: %v", r.Dir, err)
	}
}

// parkPoint parks n messages of body bytes (IDs prefix-0000001..) due over
// -parked10m-window from 1 h ahead, then rewrites the AOF, and measures.
func (e *env) parkPoint(t *testing.T, n, body int, prefix string) BigPoint {
	ctx := context.Background()
	p := BigPoint{Messages: n, BodyBytes: body, IDBytes: len(fmt.Sprintf("%s-%07d", prefix, n)), Window: flagBigWindow.String()}
	_ = e.rdb.Do(ctx, "MEMORY", "PURGE").Err()
	p.UsedMemory0 = redisUsedMemory(t, e.rdb)
	st := store.New(e.rdb, store.Options{Prefix: "bench", Shards: 16})
	from := time.Now().Add(time.Hour)
	step := *flagBigWindow / time.Duration(max(1, n))
	start := time.Now()
	parkMessages(t, st, n, body, prefix, func(i int) time.Time { return from.Add(time.Duration(i) * step) })
	p.ParkSeconds = time.Since(start).Seconds()
	p.ParkRate = float64(n) / p.ParkSeconds
	info, err := e.rdb.Info(ctx, "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	p.UsedMemory1 = infoFloat(info, "used_memory")
	p.RSSBytes = infoFloat(info, "used_memory_rss")
	p.BytesPerMsg = (p.UsedMemory1 - p.UsedMemory0) / float64(n)
	t.Logf("   parked in %.1f s (%.0f/s); used_memory +%.0f MB = %.1f B/msg", p.ParkSeconds, p.ParkRate, (p.UsedMemory1-p.UsedMemory0)/1e6, p.BytesPerMsg)
	start = time.Now()
	rewriteAOF(t, e.rdb)
	p.RewriteSecs = time.Since(start).Seconds()
	p.AOFBytes = dirSize(filepath.Join(e.redis.Dir, "appendonlydir"))
	p.AOFPerMsg = float64(p.AOFBytes) / float64(n)
	t.Logf("   AOF rewritten in %.1f s: %.0f MB (%.1f B/msg)", p.RewriteSecs, float64(p.AOFBytes)/1e6, p.AOFPerMsg)
	return p
}

// restartPoint stops Redis (SIGTERM), starts it again on the same AOF and
// measures both, checking that every message is back.
func (e *env) restartPoint(t *testing.T, p *BigPoint) {
	ctx := context.Background()
	st := store.New(e.rdb, store.Options{Prefix: "bench", Shards: 16})
	before, err := st.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	e.redis.Stop()
	p.StopSecs = time.Since(start).Seconds()
	start = time.Now()
	e.redis.Start() // returns at the first PONG (no longer LOADING)
	p.LoadSecs = time.Since(start).Seconds()
	p.LoadLogSecs = loadedSeconds(e.redis.LogFile)
	after, err := st.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p.ParkedAfter = after.Parked
	p.UsedMemAfter = redisUsedMemory(t, e.rdb)
	if after.Parked != before.Parked {
		t.Errorf("parked before the Redis restart %d, after %d", before.Parked, after.Parked)
	}
	t.Logf("   Redis stopped in %.1f s, started and loaded in %.1f s (log: %.1f s); %d parked after", p.StopSecs, p.LoadSecs, p.LoadLogSecs, p.ParkedAfter)
}

var loadedRe = regexp.MustCompile(`DB loaded from append only file: ([0-9.]+) seconds`)

// loadedSeconds is the load time of the last start in Redis's log (after
// the lines of the base and the incr file, Redis 7 logs their total).
func loadedSeconds(logFile string) float64 {
	b, err := os.ReadFile(logFile)
	if err != nil {
		return 0
	}
	m := loadedRe.FindAllStringSubmatch(string(b), -1)
	if len(m) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(m[len(m)-1][1], 64)
	return v
}

func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// probe starts the daemon three times on e's Redis (NATS -> NATS config)
// and times each start to /readyz; on the last it times -scrape-samples
// GET /v1/stats and GET /metrics, 50 ms apart.
func (e *env) probe(t *testing.T) *Probe {
	ctx := context.Background()
	p := &Probe{}
	st := store.New(e.rdb, store.Options{Prefix: "bench", Shards: 16})
	if s, err := st.Stats(ctx); err == nil {
		p.Parked = s.Parked
	}
	_, js := e.connect(t, "bench probe")
	freshStream(t, js, jetstream.StreamConfig{Name: "DELAYED", Subjects: []string{"delayed.>"}, Storage: jetstream.FileStorage})
	freshStream(t, js, jetstream.StreamConfig{Name: "FIRED", Subjects: []string{"fired.>"}, Storage: jetstream.FileStorage})
	defer func() {
		_ = js.DeleteStream(ctx, "DELAYED")
		_ = js.DeleteStream(ctx, "FIRED")
	}()
	for i := range 3 {
		d, out := e.startDaemon(t, fmt.Sprintf(natsDaemonConfig, e.redis.Addr, e.nats.URL, e.nats.URL))
		if d == nil {
			t.Fatalf("daemon exited at start: %s", lastBytes(out, 500))
		}
		p.ReadySeconds = append(p.ReadySeconds, d.ready.Seconds())
		if i == 2 {
			p.Stats = scrape(t, d.admin+"/v1/stats")
			p.Metrics = scrape(t, d.admin+"/metrics")
		}
		d.stop(t)
	}
	p.StatsScript = sample(func() error { _, err := st.Stats(ctx); return err })
	p.InfoMemory = sample(func() error { return e.rdb.Info(ctx, "memory").Err() })
	t.Logf("   %d parked: daemon ready in %v s; GET /v1/stats median %.1f ms (max %.1f); GET /metrics median %.1f ms (max %.1f); store.Stats median %.1f ms; INFO memory median %.1f ms",
		p.Parked, p.ReadySeconds, p.Stats.MedianMS, p.Stats.MaxMS, p.Metrics.MedianMS, p.Metrics.MaxMS, p.StatsScript.MedianMS, p.InfoMemory.MedianMS)
	return p
}

// sample times -scrape-samples calls of f, 50 ms apart.
func sample(f func() error) *Timing {
	var ds []time.Duration
	for range max(1, *flagBigSamples) {
		t0 := time.Now()
		if err := f(); err != nil {
			return nil
		}
		ds = append(ds, time.Since(t0))
		time.Sleep(50 * time.Millisecond) // spacing of the samples, as a scraper's interval
	}
	return timing(ds)
}

// scrape times -scrape-samples GETs of url (request to the last byte of
// the body), 50 ms apart.
func scrape(t *testing.T, url string) *Timing {
	var ds []time.Duration
	size := 0
	for range max(1, *flagBigSamples) {
		t0 := time.Now()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
		}
		ds = append(ds, time.Since(t0))
		size = len(b)
		time.Sleep(50 * time.Millisecond) // spacing of the samples, as a scraper's interval
	}
	tm := timing(ds)
	tm.Bytes = size
	return tm
}

// parked10mPairs returns the parked10m runs of kind: those on the empty
// Redis and those with the messages parked.
func (r *Report) parked10mPairs(kind string) (empty, parked []*Scenario) {
	for _, s := range r.Scenarios {
		if s.Group != "parked10m" || s.Kind != kind || s.Status != "ok" {
			continue
		}
		if s.ParkedBefore > 0 {
			parked = append(parked, s)
		} else {
			empty = append(empty, s)
		}
	}
	return empty, parked
}

func meanOf(ss []*Scenario, f func(*Scenario) float64) float64 {
	var sum float64
	for _, s := range ss {
		sum += f(s)
	}
	return sum / float64(len(ss))
}

// parked10mTargets: parks/s, end-to-end/s and firing/s with the messages
// parked >= 90% of empty; GET /v1/stats and GET /metrics under 50 ms
// (median of the samples; the max is shown).
func (r *Report) parked10mTargets(yes func(bool) *bool) {
	big := r.Parked10M
	if big == nil || len(big.Points) == 0 {
		return
	}
	size := humanCount(float64(big.Points[0].Messages))
	ratio := func(name, kind string, f func(*Scenario) float64) {
		t := Target{Name: fmt.Sprintf("%s with %s parked vs empty", name, size), Goal: ">= 90% of empty"}
		empty, parked := r.parked10mPairs(kind)
		if len(empty) > 0 && len(parked) > 0 {
			a, b := meanOf(empty, f), meanOf(parked, f)
			t.Measured = fmt.Sprintf("%.0f vs %.0f msg/s = %.0f%%", b, a, 100*b/a)
			if len(empty) > 1 {
				t.Measured += fmt.Sprintf(" (means of %d runs each)", len(empty))
			}
			t.Met = yes(b >= 0.9*a)
		}
		r.Targets = append(r.Targets, t)
	}
	ratio("new parks/s (max-rate run)", "max", func(s *Scenario) float64 { return s.ParkRate })
	ratio("end-to-end/s (max-rate run)", "max", func(s *Scenario) float64 { return s.Throughput })
	ratio("firing/s (same-instant burst drain)", "burst", func(s *Scenario) float64 {
		if s.Burst == nil {
			return 0
		}
		return s.Burst.DrainRate
	})
	for _, c := range []struct {
		name string
		tm   *Timing
	}{{"GET /v1/stats", big.Parked.Stats}, {"GET /metrics", big.Parked.Metrics}} {
		t := Target{Name: fmt.Sprintf("%s with %s parked", c.name, size), Goal: "< 50 ms (median)"}
		if c.tm != nil {
			t.Measured = fmt.Sprintf("median %.1f ms, max %.1f ms (%d samples)", c.tm.MedianMS, c.tm.MaxMS, c.tm.Samples)
			t.Met = yes(c.tm.MedianMS < 50)
		}
		r.Targets = append(r.Targets, t)
	}
}

// parked10mMarkdown renders the ten-million section.
func (r *Report) parked10mMarkdown(w func(string, ...any)) {
	big := r.Parked10M
	if big == nil {
		return
	}
	w("\n### Ten million parked\n\n")
	for _, n := range big.Notes {
		w("%s\n\n", n)
	}
	if len(big.Points) == 0 {
		return
	}
	w("Parked with store.Park from the benchmark process (the daemon's park script, 4096 per call, two calls in flight) into a Redis of their own (AOF everysec), ")
	w("due times spread evenly over the window from 1 h ahead. B/msg: INFO used_memory delta / messages. AOF: appendonlydir after BGREWRITEAOF (an RDB preamble). ")
	w("Restart: SIGTERM to exit, then start to the first PONG (no longer LOADING); \"logged\" is Redis's own \"DB loaded\" time.\n\n")
	w("| messages | body B | ID B | due over | park s (msg/s) | B/msg | RSS after | AOF rewrite s | AOF MB (B/msg) | Redis stop s | Redis start + load s (logged) | parked after restart |\n")
	w("|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range big.Points {
		w("| %d | %d | %d | %s | %.1f (%.0f) | %.1f | %.0f MB | %.1f | %.0f (%.1f) | %.1f | %.1f (%.1f) | %d |\n", p.Messages, p.BodyBytes, p.IDBytes, p.Window,
			p.ParkSeconds, p.ParkRate, p.BytesPerMsg, p.RSSBytes/1e6, p.RewriteSecs, float64(p.AOFBytes)/1e6, p.AOFPerMsg, p.StopSecs, p.LoadSecs, p.LoadLogSecs, p.ParkedAfter)
	}
	w("\nThe daemon (NATS -> NATS config) started three times on each data set: exec to the first /readyz 200. Scrapes: %d GETs 50 ms apart, request to the last byte. ", *flagBigSamples)
	w("The Redis parts of both, called from the benchmark process: store.Stats (one script per shard, pipelined) and INFO memory.\n\n")
	w("| data set | daemon ready s | GET /v1/stats ms median / max | GET /metrics ms median / max (bytes) | store.Stats ms median / max | INFO memory ms median / max |\n|---|---|---|---|---|---|\n")
	tm := func(x *Timing) string {
		if x == nil {
			return "-"
		}
		return fmt.Sprintf("%.1f / %.1f", x.MedianMS, x.MaxMS)
	}
	for _, c := range []struct {
		name string
		p    *Probe
	}{{"empty", big.Empty}, {humanCount(float64(big.Points[0].Messages)) + " parked", big.Parked}} {
		if c.p == nil {
			continue
		}
		var ready []string
		for _, v := range c.p.ReadySeconds {
			ready = append(ready, fmt.Sprintf("%.2f", v))
		}
		w("| %s (%d parked) | %s | %s | %s (%d) | %s | %s |\n", c.name, c.p.Parked, strings.Join(ready, ", "),
			tm(c.p.Stats), tm(c.p.Metrics), c.p.Metrics.Bytes, tm(c.p.StatsScript), tm(c.p.InfoMemory))
	}
	w("\nRuns with the messages parked, alternated with the same runs on the benchmark's empty Redis (NATS -> NATS; burst drain = n / (last stored - due instant)):\n\n")
	w("| load | parked | published/s | parked/s | end-to-end/s | burst drain/s | p99 ms | max ms | daemon CPU s/10k | Redis CPU s/10k | status |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, s := range r.Scenarios {
		if s.Group != "parked10m" {
			continue
		}
		p99, mx, drain := "-", "-", "-"
		if l := s.Lateness; l != nil {
			p99, mx = f1(l.P99), f1(l.Max)
		}
		if s.Burst != nil {
			drain = f0(s.Burst.DrainRate)
		}
		w("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", s.Load, s.ParkedBefore, f0(s.PublishRate), f0(s.ParkRate), f0(s.Throughput), drain,
			p99, mx, f2(s.DaemonCPUPer10k), f2(s.RedisCPUPer10k), s.Status)
	}
}
