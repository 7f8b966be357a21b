//go:build bench

package bench

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Scenario is one measured run. Times are seconds, rates msg/s, lateness
// milliseconds.
type Scenario struct {
	Pairing string `json:"pairing"` // "NATS -> NATS"
	System  string `json:"system"`  // "delaybridge", "raw JetStream", "NATS schedules"
	// Group is the -only group of the runs reported in a section of their
	// own (burst, parked10m, features); empty for the classic runs.
	Group        string  `json:"group,omitempty"`
	Load         string  `json:"load"`
	Kind         string  `json:"kind"` // max, rate, spread
	Messages     int     `json:"messages"`
	TargetRate   float64 `json:"target_rate,omitempty"`
	Delay        string  `json:"delay"`
	BodyBytes    int     `json:"body_bytes"`
	ParkedBefore int     `json:"parked_before,omitempty"`
	Status       string  `json:"status"` // ok, incomplete, failed, pending

	PublishSeconds float64 `json:"publish_seconds"` // first publish to last PubAck
	PublishRate    float64 `json:"publish_rate"`
	PublishErrors  int64   `json:"publish_errors"`
	ParkSeconds    float64 `json:"park_seconds,omitempty"` // first publish to all parked (ingest consumer ack floor)
	ParkRate       float64 `json:"park_rate,omitempty"`
	EndToEnd       float64 `json:"end_to_end_seconds"`  // first publish to last arrival at the sink
	Throughput     float64 `json:"throughput"`          // received / EndToEnd
	FireRate       float64 `json:"fire_rate,omitempty"` // spread: received / (last arrival - first due time)
	Received       int     `json:"received"`
	Duplicates     int     `json:"duplicates"`
	Missing        int     `json:"missing"`

	Lateness *Lateness `json:"lateness_ms"` // sink stream timestamp - due time
	// MaxLatenessPerSecond[i] is the worst lateness of the messages due in
	// the i-th second of the run (rate and spread runs).
	MaxLatenessPerSecond []float64 `json:"max_lateness_ms_per_second,omitempty"`

	WallSeconds       float64 `json:"wall_seconds"`
	DaemonCPUSeconds  float64 `json:"daemon_cpu_seconds,omitempty"`
	DaemonCPUPer10k   float64 `json:"daemon_cpu_seconds_per_10k,omitempty"`
	DaemonPeakRSSMB   float64 `json:"daemon_peak_rss_mb,omitempty"`
	RedisCPUSeconds   float64 `json:"redis_cpu_seconds"`
	RedisCPUPer10k    float64 `json:"redis_cpu_seconds_per_10k"`
	HarnessCPUSeconds float64 `json:"harness_cpu_seconds"` // this process: nats-server, load generator, consumer
	HarnessCPUPer10k  float64 `json:"harness_cpu_seconds_per_10k"`
	// DaemonRedisCPUMicrosPerMsg is (daemon + Redis CPU) / received, in
	// CPU-microseconds per delivered message: the figure two builds are
	// compared by (runs with a daemon only).
	DaemonRedisCPUMicrosPerMsg float64 `json:"daemon_redis_cpu_us_per_msg,omitempty"`
	// OtherCPUSeconds is what every other process of the machine used
	// during the run (noise: other work on a shared machine); out of
	// MachineCPUs * WallSeconds available.
	OtherCPUSeconds float64 `json:"other_processes_cpu_seconds"`
	MachineCPUs     int     `json:"machine_cpus"`

	DaemonMetrics map[string]float64 `json:"daemon_metrics,omitempty"`
	Notes         []string           `json:"notes,omitempty"`

	// DaemonReadySeconds is how long the daemon took from exec to /readyz.
	DaemonReadySeconds float64 `json:"daemon_ready_seconds,omitempty"`
	// Burst: the same-instant burst runs only (and the million group's
	// drains).
	Burst *Burst `json:"burst,omitempty"`
	// Million: the million group only.
	Million *Million `json:"million,omitempty"`

	// Scale-out runs (-only scale) only: the topology, and per daemon (in
	// start order) its CPU seconds, peak RSS, messages parked by its ingest
	// and published by its scheduler, and its /metrics aggregates
	// (DaemonMetrics then holds their sums and count-weighted means).
	Setup             string               `json:"setup,omitempty"` // "3 daemons, Redis Cluster (3 masters)"
	Daemons           int                  `json:"daemons,omitempty"`
	RedisNodes        int                  `json:"redis_nodes,omitempty"`
	Pass              int                  `json:"pass,omitempty"` // -scale-repeat pass, from 1
	DaemonCPUEach     []float64            `json:"daemon_cpu_seconds_each,omitempty"`
	DaemonRSSEach     []float64            `json:"daemon_peak_rss_mb_each,omitempty"`
	DaemonParked      []float64            `json:"daemon_parked_each,omitempty"`
	DaemonPublished   []float64            `json:"daemon_published_each,omitempty"`
	ExtraPublishes    int                  `json:"extra_publishes,omitempty"` // sum of published counters - received
	DaemonMetricsEach []map[string]float64 `json:"daemon_metrics_each,omitempty"`
	LoadAvgBefore     string               `json:"loadavg_before,omitempty"` // /proc/loadavg 1 5 15
	LoadAvgAfter      string               `json:"loadavg_after,omitempty"`
}

// groupLoad is the load, after the group and pass of a run reported in a
// section of its own.
func (s *Scenario) groupLoad() string {
	switch {
	case s.Group == "":
		return s.Load
	case s.Pass > 0:
		return fmt.Sprintf("[%s, pass %d] %s", s.Group, s.Pass, s.Load)
	}
	return fmt.Sprintf("[%s] %s", s.Group, s.Load)
}

func (s *Scenario) note(format string, args ...any) {
	s.Notes = append(s.Notes, fmt.Sprintf(format, args...))
}

func (s *Scenario) setPublish(pr *pubResult) {
	s.PublishSeconds = pr.last.Sub(pr.first).Seconds()
	if s.PublishSeconds > 0 {
		s.PublishRate = float64(s.Messages) / s.PublishSeconds
	}
}

func (s *Scenario) setEndToEnd(first time.Time, rec *recorder) {
	rec.mu.Lock()
	last := rec.last
	rec.mu.Unlock()
	if s.Received == 0 || last.IsZero() {
		return
	}
	s.EndToEnd = last.Sub(first).Seconds()
	s.Throughput = float64(s.Received) / s.EndToEnd
}

func (s *Scenario) finish(all bool) {
	if s.Received > 0 {
		per := 10_000 / float64(s.Received)
		s.DaemonCPUPer10k = s.DaemonCPUSeconds * per
		s.RedisCPUPer10k = s.RedisCPUSeconds * per
		s.HarnessCPUPer10k = s.HarnessCPUSeconds * per
		if s.DaemonCPUSeconds > 0 {
			s.DaemonRedisCPUMicrosPerMsg = (s.DaemonCPUSeconds + s.RedisCPUSeconds) * 1e6 / float64(s.Received)
		}
	}
	if s.Status != "" {
		return
	}
	s.Status = "ok"
	if !all || s.Missing > 0 {
		s.Status = "incomplete"
		s.note("%d of %d messages did not arrive before the wait ended", s.Missing, s.Messages)
	}
}

// Report is everything the run measured.
type Report struct {
	Command      string         `json:"command"`
	Date         string         `json:"date"`
	TotalSeconds float64        `json:"total_seconds"`
	Machine      Machine        `json:"machine"`
	Params       map[string]any `json:"params"`
	Targets      []Target       `json:"targets"`
	Scenarios    []*Scenario    `json:"scenarios"`
	Memory       []MemResult    `json:"redis_memory"`
	Parked10M    *BigParked     `json:"parked10m,omitempty"`
}

// Target is one performance goal and whether this run met it.
type Target struct {
	Name     string `json:"name"`
	Goal     string `json:"goal"`
	Measured string `json:"measured"`
	Met      *bool  `json:"met"` // null: not measured in this run
}

func (r *Report) add(t *testing.T, s *Scenario) {
	r.Scenarios = append(r.Scenarios, s)
	if s.Status == "pending" {
		t.Logf("   pending: %s", strings.Join(s.Notes, "; "))
		return
	}
	lat := "-"
	if s.Lateness != nil {
		lat = fmt.Sprintf("p50 %.1f p99 %.1f p99.9 %.1f max %.1f ms", s.Lateness.P50, s.Lateness.P99, s.Lateness.P999, s.Lateness.Max)
	}
	t.Logf("   %s: received %d/%d (dups %d), publish %.0f/s, parked %.0f/s, end-to-end %.0f/s; lateness %s; daemon CPU %.2fs/10k, daemon + Redis %.1f CPU-µs/msg, RSS %.0f MB",
		s.Status, s.Received, s.Messages, s.Duplicates, s.PublishRate, s.ParkRate, s.Throughput, lat, s.DaemonCPUPer10k, s.DaemonRedisCPUMicrosPerMsg, s.DaemonPeakRSSMB)
	if b := s.Burst; b != nil {
		t.Logf("   drain from T: %.0f msg/s in %.3f s, first +%.1f ms, last +%.1f ms", b.DrainRate, b.DrainSeconds, b.FirstMS, b.LastMS)
	}
	if m := s.Million; m != nil {
		t.Logf("   %s", m.summary(s))
	}
}

func (r *Report) find(system, kind string, rate float64, parked bool) *Scenario {
	for _, s := range r.Scenarios {
		if s.System == system && s.Kind == kind && s.Pairing == "NATS -> NATS" && s.Setup == "" && s.Group == "" && (kind != "rate" || s.TargetRate == rate) &&
			(s.ParkedBefore > 0) == parked && s.Status != "pending" && s.Status != "failed" {
			return s
		}
	}
	return nil
}

func (r *Report) evaluateTargets() {
	yes := func(b bool) *bool { return &b }
	db := r.find("delaybridge", "max", 0, false)
	raw := r.find("raw JetStream", "max", 0, false)
	native := r.find("NATS schedules", "max", 0, false)
	parked := r.find("delaybridge", "max", 0, true)

	t := Target{Name: "NATS->NATS throughput vs raw JetStream", Goal: ">= 50% of raw publish->consume"}
	if db != nil && raw != nil && raw.Throughput > 0 {
		p := 100 * db.Throughput / raw.Throughput
		t.Measured = fmt.Sprintf("%.0f vs %.0f msg/s = %.0f%%", db.Throughput, raw.Throughput, p)
		t.Met = yes(p >= 50)
	}
	r.Targets = append(r.Targets, t)

	t = Target{Name: "NATS->NATS throughput vs NATS native schedules", Goal: ">= native schedules, same load"}
	if db != nil && native != nil && native.Throughput > 0 {
		t.Measured = fmt.Sprintf("%.0f vs %.0f msg/s = %.0f%%", db.Throughput, native.Throughput, 100*db.Throughput/native.Throughput)
		t.Met = yes(db.Throughput >= native.Throughput)
	}
	r.Targets = append(r.Targets, t)

	for _, c := range []struct {
		rate, goal float64
	}{{1000, 10}, {10000, 50}} {
		t = Target{Name: fmt.Sprintf("fire lateness p99 at %s msg/s", humanCount(c.rate)), Goal: fmt.Sprintf("<= %.0f ms", c.goal)}
		if s := r.find("delaybridge", "rate", c.rate, false); s != nil && s.Lateness != nil {
			t.Measured = fmt.Sprintf("%.1f ms (p50 %.1f, p99.9 %.1f, max %.1f)", s.Lateness.P99, s.Lateness.P50, s.Lateness.P999, s.Lateness.Max)
			t.Met = yes(s.Lateness.P99 <= c.goal && s.Status == "ok")
		}
		r.Targets = append(r.Targets, t)
	}

	// Precision: at the sink (the sink stream's timestamp, read
	// by the consumer) and by the daemon (its fire lateness histogram).
	for _, c := range []struct {
		rate, p50, p99 float64
	}{{1000, 1, 3}, {10000, 0, 10}} {
		s := r.find("delaybridge", "rate", c.rate, false)
		goal := fmt.Sprintf("p99 <= %.0f ms", c.p99)
		if c.p50 > 0 {
			goal = fmt.Sprintf("p50 <= %.0f ms, p99 <= %.0f ms", c.p50, c.p99)
		}
		at := Target{Name: fmt.Sprintf("precision at %s msg/s, due to confirmed, at the sink", humanCount(c.rate)), Goal: goal}
		by := Target{Name: fmt.Sprintf("precision at %s msg/s, due to confirmed, by the daemon's histogram", humanCount(c.rate)), Goal: goal}
		if s != nil && s.Lateness != nil {
			at.Measured = fmt.Sprintf("p50 %.2f ms, p99 %.2f ms", s.Lateness.P50, s.Lateness.P99)
			at.Met = yes(s.Status == "ok" && (c.p50 == 0 || s.Lateness.P50 <= c.p50) && s.Lateness.P99 <= c.p99)
		}
		if s != nil && s.DaemonMetrics["fire_lateness.count"] > 0 {
			p50, p99 := 1000*s.DaemonMetrics["fire_lateness.p50"], 1000*s.DaemonMetrics["fire_lateness.p99"]
			by.Measured = fmt.Sprintf("p50 %.2f ms, p99 %.2f ms (%.0f%% within 1 ms)", p50, p99, 100*s.DaemonMetrics["fire_lateness.within_1ms"])
			by.Met = yes(s.Status == "ok" && (c.p50 == 0 || p50 <= c.p50) && p99 <= c.p99)
		}
		r.Targets = append(r.Targets, at, by)
	}

	for _, m := range r.Memory {
		r.Targets = append(r.Targets, Target{
			Name:     fmt.Sprintf("Redis overhead per parked message, %d-byte body", m.BodyBytes),
			Goal:     fmt.Sprintf("<= %d B beyond the body", memTarget),
			Measured: fmt.Sprintf("%.0f B (%.0f B/msg in all, %s messages)", m.OverheadBytes, m.BytesPerMsg, humanCount(float64(m.Messages))),
			Met:      yes(m.Met),
		})
	}

	t = Target{Name: "throughput with parked messages vs empty", Goal: ">= 90% of the empty run"}
	if db != nil && parked != nil && db.Throughput > 0 {
		p := 100 * parked.Throughput / db.Throughput
		t.Name = fmt.Sprintf("throughput with %s parked vs empty", humanCount(float64(parked.ParkedBefore)))
		t.Measured = fmt.Sprintf("%.0f vs %.0f msg/s = %.0f%%", parked.Throughput, db.Throughput, p)
		t.Met = yes(p >= 90)
	}
	r.Targets = append(r.Targets, t)

	// The CPU a delivered message costs at the maximum rate,
	// compared across builds (-bin) by -cpu-baseline-us.
	t = Target{Name: "daemon + Redis CPU per delivered message at the maximum rate, NATS->NATS", Goal: "-30% vs today's build (its figure: -cpu-baseline-us)"}
	if db != nil && db.DaemonRedisCPUMicrosPerMsg > 0 {
		x := db.DaemonRedisCPUMicrosPerMsg
		t.Measured = fmt.Sprintf("%.1f CPU-µs/msg (daemon %.1f + Redis %.1f)", x, db.DaemonCPUSeconds*1e6/float64(db.Received), db.RedisCPUSeconds*1e6/float64(db.Received))
		if base := *flagCPUBase; base > 0 {
			t.Measured += fmt.Sprintf(" vs %.1f = %+.0f%%", base, 100*(x-base)/base)
			t.Met = yes(x <= 0.7*base && db.Status == "ok")
		} else {
			t.Measured += "; not compared: no -cpu-baseline-us"
		}
	}
	r.Targets = append(r.Targets, t)

	r.burstTargets(yes)
	r.parked10mTargets(yes)
	r.featuresTargets(yes)
	r.millionTargets(yes)
}

func f0(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", v)
}

func f2(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", v)
}

func f1(v float64) string { return fmt.Sprintf("%.1f", v) }

// f1or is f1, or "-" for 0 (not measured).
func f1or(v float64) string {
	if v == 0 {
		return "-"
	}
	return f1(v)
}

// Markdown renders the report.
func (r *Report) Markdown() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	m := r.Machine
	w("## Results of `make bench`\n\n")
	w("- command: `%s`\n", r.Command)
	w("- date: %s, total %.0f s\n", r.Date, r.TotalSeconds)
	w("- machine: %d CPUs (%s), %d MB RAM, Linux %s, %s, redis-server %s, nats-server embedded in the benchmark process; load average %.2f at start. Everything (daemon, Redis, NATS, load generator, consumer) shares these CPUs.\n\n",
		m.CPUs, m.CPUModel, m.MemTotalMB, m.Kernel, m.GoVersion, m.RedisVersion, m.LoadAvg1)

	w("### Targets\n\n| target | goal | measured | met |\n|---|---|---|---|\n")
	for _, t := range r.Targets {
		met := "not measured"
		switch {
		case t.Met != nil:
			met = map[bool]string{true: "**yes**", false: "**no**"}[*t.Met]
		case t.Measured != "":
			met = "-" // measured, nothing to compare with
		}
		meas := t.Measured
		if meas == "" {
			meas = "-"
		}
		w("| %s | %s | %s | %s |\n", t.Name, t.Goal, meas, met)
	}

	w("\n### Throughput and fire lateness\n\n")
	w("Rates in msg/s; lateness in ms = sink stream timestamp - due time (raw JetStream: consume time - stream timestamp).\n\n")
	w("| pairing | system | load | msgs | published/s | parked/s | end-to-end/s | p50 | p99 | p99.9 | max | status |\n")
	w("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, s := range r.Scenarios {
		if s.Setup != "" || s.Group != "" {
			continue // in the section of their group
		}
		if s.Status == "pending" {
			w("| %s | %s | %s | - | - | - | - | - | - | - | - | pending |\n", s.Pairing, s.System, s.Load)
			continue
		}
		p50, p99, p999, mx := "-", "-", "-", "-"
		if l := s.Lateness; l != nil {
			p50, p99, p999, mx = f1(l.P50), f1(l.P99), f1(l.P999), f1(l.Max)
		}
		e2e := f0(s.Throughput)
		if s.FireRate > 0 {
			e2e += fmt.Sprintf(" (fired %.0f/s in the window)", s.FireRate)
		}
		status := s.Status
		if s.Duplicates > 0 {
			status += fmt.Sprintf(", %d dup", s.Duplicates)
		}
		w("| %s | %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s |\n", s.Pairing, s.System, s.Load, s.Messages,
			f0(s.PublishRate), f0(s.ParkRate), e2e, p50, p99, p999, mx, status)
	}

	w("\n### CPU and memory\n\n")
	w("CPU seconds per 10,000 messages (utime+stime from /proc, Redis from INFO cpu; \"harness\" is this process: embedded nats-server, load generator and consumer), over the whole run. ")
	w("daemon + Redis CPU-µs per delivered message: (daemon + Redis CPU) / messages received, the figure to compare builds by (-bin). Peak RSS is the daemon's VmHWM.\n\n")
	w("| system | load | daemon CPU s/10k | Redis CPU s/10k | daemon + Redis CPU-µs per delivered message | harness CPU s/10k | daemon peak RSS MB | wall s | CPU used: daemon / Redis / harness / other processes (s) |\n|---|---|---:|---:|---:|---:|---:|---:|---|\n")
	for _, s := range r.Scenarios {
		if s.Status == "pending" || s.Setup != "" {
			continue
		}
		w("| %s | %s | %s | %s | %s | %s | %s | %.1f | %.1f / %.1f / %.1f / %.1f of %.0f |\n", s.System, s.groupLoad(), f2(s.DaemonCPUPer10k), f2(s.RedisCPUPer10k), f1or(s.DaemonRedisCPUMicrosPerMsg),
			f2(s.HarnessCPUPer10k), f0(s.DaemonPeakRSSMB), s.WallSeconds, s.DaemonCPUSeconds, s.RedisCPUSeconds, s.HarnessCPUSeconds, s.OtherCPUSeconds, float64(s.MachineCPUs)*s.WallSeconds)
	}

	if len(r.Memory) > 0 {
		w("\n### Redis memory per parked message\n\n")
		w("INFO used_memory delta over messages parked with store.Park (IDs like `m-0000001`, far-future due times, no persistence), 16 shards.\n\n")
		w("| body B | messages | B/msg | overhead B/msg | envelope header B | pool (shard 0) | due (shard 0) | met (<= %d) |\n|---:|---:|---:|---:|---:|---|---|---|\n", memTarget)
		for _, x := range r.Memory {
			w("| %d | %d | %.1f | %.1f | %d | %s, %.1f B/entry | %s, %.1f B/entry | %s |\n", x.BodyBytes, x.Messages, x.BytesPerMsg, x.OverheadBytes,
				x.EnvelopeBytes, x.PoolEncoding, x.PoolBytesPerEntry, x.DueEncoding, x.DueBytesPerEntry, map[bool]string{true: "yes", false: "**no**"}[x.Met])
		}
		w("\nAlternative layouts measured on scratch keys (proposals; the store is unchanged):\n\n| body B | layout | messages | B/msg | overhead B/msg |\n|---:|---|---:|---:|---:|\n")
		for _, x := range r.Memory {
			for _, a := range x.Alternatives {
				w("| %d | %s | %d | %.1f | %.1f |\n", x.BodyBytes, a.Name, a.Messages, a.BytesPerMsg, a.OverheadBytes)
			}
		}
	}

	w("\n### Inside the daemon (its /metrics at the end of each run)\n\n")
	w("| load | park batch | park ms | claim batch | claim ms | ack ms | sink publish ms | wake-ups timer/notify/batch |\n|---|---:|---:|---:|---:|---:|---:|---|\n")
	for _, s := range r.Scenarios {
		dm := s.DaemonMetrics
		if !strings.HasPrefix(s.System, "delaybridge") || dm == nil || s.Setup != "" {
			continue
		}
		ms := func(k string) string { return f2(dm[k] * 1000) }
		label := s.groupLoad()
		if s.System != "delaybridge" {
			label = s.System + ": " + label
		}
		w("| %s %s | %s | %s | %s | %s | %s | %s | %.0f/%.0f/%.0f |\n", s.Pairing, label, f1(dm["park_batch_size.mean"]), ms("park_seconds.mean"),
			f1(dm["claim_batch_size.mean"]), ms("script_seconds.claim.mean"), ms("script_seconds.ack.mean"), ms("sink_publish_seconds.mean"),
			dm["wakeups.timer"], dm["wakeups.notify"], dm["wakeups.batch"])
	}

	r.burstMarkdown(w)
	r.parked10mMarkdown(w)
	r.featuresMarkdown(w)
	r.millionMarkdown(w)
	r.scaleMarkdown(w)

	var notes []string
	for _, s := range r.Scenarios {
		for _, n := range s.Notes {
			sys := s.System
			if s.Setup != "" {
				sys = fmt.Sprintf("scale-out pass %d, %s", s.Pass, s.Setup)
			}
			notes = append(notes, fmt.Sprintf("- %s %s, %s: %s", s.Pairing, sys, s.groupLoad(), n))
		}
	}
	if len(notes) > 0 {
		w("\n### Notes\n\n%s\n", strings.Join(notes, "\n"))
	}
	return b.String()
}
