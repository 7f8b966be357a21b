//go:build bench

// Package bench measures the real delaybridge binary against real servers on
// loopback (redis-server, embedded nats-server, kfake, RabbitMQ) and compares
// it with baselines run in the same process on the same servers: raw
// JetStream publish->consume and NATS's native message schedules.
//
// It is behind the build tag "bench" so that `go test ./...` (CI) skips it:
//
//	make bench
//	go test -tags bench -run TestBench -timeout 60m -v ./test/bench/ -args -out bench.json
//
// It prints a markdown table, writes every number as JSON (-out) and, with
// -doc, replaces the generated section of docs/performance.md.
package bench

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

var (
	flagOut   = flag.String("out", "", "write every number as JSON to this file (relative to test/bench/ unless absolute; make bench: bench.json); empty: do not write, so that a partial run leaves make bench's file alone")
	flagDoc   = flag.String("doc", "", "markdown file whose generated section (between bench markers) is replaced, e.g. docs/performance.md; empty: do not write")
	flagOnly  = flag.String("only", "", "comma-separated scenario groups to run (mem, raw, native, nats, parked, kafka-rabbit, rabbit-kafka, burst, parked10m, features, million, scale); empty: all")
	flagN     = flag.Int("n", 200_000, "messages of the maximum-rate runs (published as fast as possible)")
	flagBody  = flag.Int("body", 100, "message body size in bytes for the end-to-end runs")
	flagDelay = flag.Duration("delay", time.Second, "delay of the maximum-rate and fixed-rate runs")
	flagRates = flag.String("rates", "1000,10000", "fixed publish rates (msg/s) of the lateness runs")
	flagRateD = flag.Duration("rate-duration", 20*time.Second, "duration of each fixed-rate run")

	flagSpreadN = flag.Int("spread-n", 200_000, "messages of the spread run: published as fast as possible, due times spread evenly over -spread-window")
	flagSpreadW = flag.Duration("spread-window", 20*time.Second, "window the spread run's due times cover")

	flagParked  = flag.Int("parked", 2_000_000, "far-future messages parked before the 'parked' rerun of the maximum-rate run")
	flagMemN    = flag.Int("mem-n", 1_000_000, "messages parked per body size for the Redis memory figure")
	flagMemBody = flag.String("mem-bodies", "100,1024", "body sizes (bytes) of the Redis memory figure")
	flagPprof   = flag.String("pprof", "", "directory: save a 5 s CPU profile of the daemon (admin.pprof) during each maximum-rate, fixed-rate and burst NATS run (cpu-<load>.pprof)")
	flagBin     = flag.String("bin", "", "run this daemon binary instead of building one from the checkout (to compare builds scenario by scenario)")
	flagNATSCfg = flag.String("nats-config", "", "YAML added to the daemon's config in the NATS runs that set none of their own (nats, parked), e.g. 'scheduler: {fire_ahead: 0s}': to compare a setting run by run")
	flagPerf    = flag.String("perf", "", "directory: record the daemon and redis-server with `perf record -g` during each maximum-rate run (perf-<load>.data)")
	flagCPUBase = flag.Float64("cpu-baseline-us", 0, "daemon + Redis CPU-µs per delivered message of the maximum-rate NATS run measured with another build (e.g. today's, run with -bin): the CPU target compares with it; 0: reported, not compared")
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

func want(group string) bool {
	if *flagOnly == "" {
		return true
	}
	for _, g := range strings.Split(*flagOnly, ",") {
		if strings.TrimSpace(g) == group {
			return true
		}
	}
	return false
}

// TestBench runs every scenario in sequence (they share the machine, so
// they must not overlap) and reports.
func TestBench(t *testing.T) {
	if raceEnabled {
		t.Fatal("run the benchmark without -race (make bench does)")
	}
	start := time.Now()
	rep := &Report{
		Command: "go test -tags bench -run TestBench -timeout 60m -v ./test/bench/ -args " + strings.Join(os.Args[1+countTestFlags():], " "),
		Date:    start.UTC().Format(time.RFC3339),
		Machine: machineInfo(),
		Params: map[string]any{
			"n": *flagN, "body_bytes": *flagBody, "delay": flagDelay.String(), "rates": *flagRates,
			"rate_duration": flagRateD.String(), "spread_n": *flagSpreadN, "spread_window": flagSpreadW.String(),
			"parked": *flagParked, "mem_n": *flagMemN, "mem_bodies": *flagMemBody,
			"burst": *flagBurst, "burst_native": *flagBurstNative, "burst_lead": flagBurstLead.String(),
			"parked10m": *flagBigN, "parked10m_window": flagBigWindow.String(), "parked10m_1k": *flagBigKB, "parked10m_burst": *flagBigBurst, "parked10m_repeat": *flagBigRepeat,
			"features_repeat": *flagFeatRepeat, "features_baseline_bin": *flagFeatBin,
			"million": *flagMillion, "million_lead": flagMillionLead.String(), "million_max_rate": *flagMillionRate, "million_rated_n": *flagMillionRatedN,
			"million_stats_every": flagMillionPoll.String(), "million_pairings": *flagMillionPairs, "cpu_baseline_us": *flagCPUBase, "nats_config": *flagNATSCfg,
			"scale_rate": *flagScaleRate, "scale_n": *flagScaleN, "scale_setups": *flagScaleSetups, "scale_loads": *flagScaleLoads, "scale_repeat": *flagScaleRepeats,
		},
	}
	defer func() {
		rep.TotalSeconds = time.Since(start).Seconds()
		rep.evaluateTargets()
		md := rep.Markdown()
		t.Logf("\n%s", md)
		fmt.Println(md)
		if *flagOut != "" {
			b, _ := json.MarshalIndent(rep, "", "  ")
			if err := os.WriteFile(*flagOut, append(b, '\n'), 0o644); err != nil {
				t.Errorf("write %s: %v", *flagOut, err)
			} else {
				abs, _ := filepath.Abs(*flagOut)
				t.Logf("JSON written to %s", abs)
			}
		}
		if *flagDoc != "" {
			if err := writeDoc(*flagDoc, md); err != nil {
				t.Errorf("write %s: %v", *flagDoc, err)
			}
		}
	}()

	env := newEnv(t)
	rep.Machine.RedisVersion = env.redisVersion()

	if want("mem") {
		rep.Memory = runMemory(t, env)
	}
	if want("raw") {
		rep.add(t, env.runRawJetStream(t, *flagN))
	}
	if want("nats") {
		for _, r := range parseRates(t) {
			rep.add(t, env.runDaemonNATS(t, natsLoad{kind: "rate", n: int(r * flagRateD.Seconds()), rate: r, delay: *flagDelay}))
		}
		rep.add(t, env.runDaemonNATS(t, natsLoad{kind: "max", n: *flagN, delay: *flagDelay}))
		rep.add(t, env.runDaemonNATS(t, natsLoad{kind: "spread", n: *flagSpreadN, window: *flagSpreadW}))
	}
	if want("parked") {
		rep.add(t, env.runDaemonNATS(t, natsLoad{kind: "max", n: *flagN, delay: *flagDelay, preParked: *flagParked}))
	}
	if want("native") {
		for _, r := range parseRates(t) {
			rep.add(t, env.runNativeSchedules(t, natsLoad{kind: "rate", n: int(r * flagRateD.Seconds()), rate: r, delay: *flagDelay}))
		}
		rep.add(t, env.runNativeSchedules(t, natsLoad{kind: "max", n: *flagN, delay: *flagDelay}))
	}
	for _, p := range brokerPairings {
		if want(p.group) {
			p.runGroup(t, env, rep)
		}
	}
	if want("burst") {
		runBursts(t, env, rep)
	}
	if want("parked10m") {
		runParked10M(t, env, rep)
	}
	if want("features") {
		runFeatures(t, env, rep)
	}
	if want("million") {
		runMillion(t, env, rep)
	}
	if want("scale") {
		runScale(t, env, rep)
	}
}

func parseRates(t *testing.T) []float64 {
	var out []float64
	for _, s := range strings.Split(*flagRates, ",") {
		var r float64
		if _, err := fmt.Sscan(strings.TrimSpace(s), &r); err != nil || r <= 0 {
			t.Fatalf("-rates: bad rate %q", s)
		}
		out = append(out, r)
	}
	return out
}

// countTestFlags is how many of os.Args[1:] are the test binary's own
// -test.* flags (they come before -args' arguments).
func countTestFlags() int {
	n := 0
	for _, a := range os.Args[1:] {
		if strings.HasPrefix(a, "-test.") {
			n++
		}
	}
	return n
}

// Machine describes where the numbers were taken.
type Machine struct {
	CPUs         int     `json:"cpus"`
	CPUModel     string  `json:"cpu_model"`
	MemTotalMB   int     `json:"mem_total_mb"`
	Kernel       string  `json:"kernel"`
	GoVersion    string  `json:"go_version"`
	RedisVersion string  `json:"redis_version"`
	LoadAvg1     float64 `json:"loadavg_1m_at_start"`
}

func machineInfo() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				if i := strings.IndexByte(l, ':'); i > 0 {
					m.CPUModel = strings.TrimSpace(l[i+1:])
				}
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int
		fmt.Sscanf(string(b), "MemTotal: %d kB", &kb)
		m.MemTotalMB = kb / 1024
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Sscan(string(b), &m.LoadAvg1)
	}
	return m
}

const (
	docBegin = "<!-- bench:begin (generated by `make bench`; edits between these markers are overwritten) -->"
	docEnd   = "<!-- bench:end -->"
)

// writeDoc replaces the generated section of path (between docBegin and
// docEnd) with md, keeping the hand-written text around it; a file without
// markers gets the section appended.
func writeDoc(path, md string) error {
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	section := docBegin + "\n" + md + "\n" + docEnd
	s := string(old)
	i, j := strings.Index(s, docBegin), strings.Index(s, docEnd)
	switch {
	case i >= 0 && j > i:
		s = s[:i] + section + s[j+len(docEnd):]
	case s == "":
		s = "# Performance\n\n" + section + "\n"
	default:
		s = strings.TrimRight(s, "\n") + "\n\n" + section + "\n"
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(s), 0o644)
}
