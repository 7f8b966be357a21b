//go:build bench

package bench

import (
	"flag"
	"fmt"
	"testing"
)

// The features runs (-only features): what the scheduling features
// (recurring schedules, replace, groups, pause, throttle, the dedupe window)
// cost at the maximum rate when a user does not use them. The maximum-rate
// NATS -> NATS run (-n, -delay) with
//
//   - the defaults: every feature unused except the dedupe window, which is
//     on by default (scheduler.dedupe_window 2m: one key per delivered
//     message, checked at every park);
//   - scheduler.dedupe_window: 0, nothing on;
//   - -features-baseline-bin, a daemon built before the features (optional;
//     e.g. `git archive 4c54501 | tar -x -C DIR && go build -o DIR/delaybridge
//     ./cmd/delaybridge` in DIR), with the same config;
//   - NATS's native schedules, the same load: the reference that compares
//     this run with runs on other days.
//
// in alternating order, -features-repeat passes.

var (
	flagFeatRepeat = flag.Int("features-repeat", 2, "passes over the features runs; every second pass runs them in reverse order")
	flagFeatBin    = flag.String("features-baseline-bin", "", "a daemon binary built before the features, run beside with the same config (features group)")
)

const dedupeOff = "scheduler: {dedupe_window: 0s}\n"

func runFeatures(t *testing.T, e *env, rep *Report) {
	base := natsLoad{kind: "max", n: *flagN, delay: *flagDelay, group: "features"}
	off, def, old := base, base, base
	off.cfg, off.variant = dedupeOff, "dedupe_window 0"
	def.variant = "defaults: dedupe_window 2m"
	old.cfg, old.variant, old.bin = dedupeOff, "baseline build", *flagFeatBin
	runs := []func() *Scenario{
		func() *Scenario { return e.runNativeSchedules(t, base) },
		func() *Scenario { return e.runDaemonNATS(t, def) },
		func() *Scenario { return e.runDaemonNATS(t, off) },
	}
	if *flagFeatBin != "" {
		// The baseline predates scheduler.dedupe_window: its config has no
		// scheduler block.
		old.cfg = ""
		runs = append(runs, func() *Scenario { return e.runDaemonNATS(t, old) })
	}
	for pass := 0; pass < max(1, *flagFeatRepeat); pass++ {
		order := append([]func() *Scenario(nil), runs...)
		if pass%2 == 1 {
			for i, j := 0, len(order)-1; i < j; i, j = i+1, j-1 {
				order[i], order[j] = order[j], order[i]
			}
		}
		for _, run := range order {
			s := run()
			s.Pass = pass + 1
			rep.add(t, s)
		}
	}
}

// featureRuns returns the features group's ok runs of system.
func (r *Report) featureRuns(system string) []*Scenario {
	var out []*Scenario
	for _, s := range r.Scenarios {
		if s.Group == "features" && s.System == system && s.Status == "ok" {
			out = append(out, s)
		}
	}
	return out
}

// featuresTargets: the dedupe window on (the default) vs off, and this
// build vs the baseline build, both >= 90% of maximum throughput.
func (r *Report) featuresTargets(yes func(bool) *bool) {
	off := r.featureRuns("delaybridge (dedupe_window 0)")
	if len(off) == 0 {
		return
	}
	tput := func(s *Scenario) float64 { return s.Throughput }
	for _, c := range []struct {
		name, goal string
		a, b       []*Scenario
	}{
		{"max-rate throughput with the default dedupe window (2m) vs dedupe_window 0", ">= 90% (costs <= 10%)", r.featureRuns("delaybridge (defaults: dedupe_window 2m)"), off},
		{"max-rate throughput, features unused (dedupe_window 0) vs a build before the features", ">= 90% (costs <= 10%)", off, r.featureRuns("delaybridge (baseline build)")},
	} {
		t := Target{Name: c.name, Goal: c.goal}
		if len(c.a) > 0 && len(c.b) > 0 {
			a, b := meanOf(c.a, tput), meanOf(c.b, tput)
			t.Measured = fmt.Sprintf("%.0f vs %.0f msg/s = %.0f%% (means of %d and %d runs)", a, b, 100*a/b, len(c.a), len(c.b))
			t.Met = yes(a >= 0.9*b)
		} else if len(c.b) == 0 {
			continue // no baseline build given
		}
		r.Targets = append(r.Targets, t)
	}
}

// featuresMarkdown renders the features section.
func (r *Report) featuresMarkdown(w func(string, ...any)) {
	var ss []*Scenario
	for _, s := range r.Scenarios {
		if s.Group == "features" {
			ss = append(ss, s)
		}
	}
	if len(ss) == 0 {
		return
	}
	native := map[int]float64{}
	for _, s := range ss {
		if s.System == "NATS schedules" {
			native[s.Pass] = s.Throughput
		}
	}
	w("\n### The features when unused (maximum rate, NATS -> NATS)\n\n")
	w("The same load with the defaults (every feature unused but the dedupe window, on by default), with `scheduler.dedupe_window: 0`, ")
	w("with a daemon built before the features (when -features-baseline-bin is given), and through native schedules, alternating. ")
	w("vs native: end-to-end/s over native schedules' in the same pass.\n\n")
	w("| pass | system | published/s | parked/s | end-to-end/s | vs native | p99 ms | daemon CPU s/10k | Redis CPU s/10k | other CPU s of available | status |\n")
	w("|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---|\n")
	for _, s := range ss {
		vs, p99 := "-", "-"
		if n := native[s.Pass]; n > 0 && s.System != "NATS schedules" {
			vs = fmt.Sprintf("%.0f%%", 100*s.Throughput/n)
		}
		if s.Lateness != nil {
			p99 = f1(s.Lateness.P99)
		}
		w("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %.1f of %.0f | %s |\n", s.Pass, s.System, f0(s.PublishRate), f0(s.ParkRate), f0(s.Throughput), vs, p99,
			f2(s.DaemonCPUPer10k), f2(s.RedisCPUPer10k), s.OtherCPUSeconds, float64(s.MachineCPUs)*s.WallSeconds, s.Status)
	}
}
