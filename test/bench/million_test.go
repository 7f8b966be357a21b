//go:build bench

package bench

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// The million group (-only million): -million messages due
// within one second (due times spread evenly over T..T+1s), parked
// beforehand directly with store.Park (the daemon's park script and layout;
// through an ingest a million would take a minute or more of the two
// cores), then the daemon is started and measured as it drains them, NATS
// -> NATS and Kafka -> Kafka:
//
//   - every message delivered exactly once: duplicates and missing at the
//     consumer, and the daemon's published counter beyond the messages
//     received (the sink stream's duplicate window would hide a repeat);
//   - the first message's lateness after T, the drain rate n / (last
//     stored - T), the last message after T+1s, the per-message lateness;
//   - GET /v1/stats polled one request at a time from T to the end of the
//     drain: its latency p50/p99/max and the number of samples;
//   - a second run with the sink's max_rate set (-million-max-rate, on
//     -million-rated-n messages): the release rate, messages / (last -
//     first arrival), and its deviation from max_rate.
//
// Arrival is as in the burst runs: the sink stream's timestamp (NATS), the
// consumer's receive time (Kafka, a reader per partition, 10 ms fetch wait).

var (
	flagMillion       = flag.Int("million", 1_000_000, "messages due within one second in the million group (-only million); 100000 for a quick run")
	flagMillionLead   = flag.Duration("million-lead", 0, "how far ahead of the start of parking the first due time T lies; 0: 5 s + 1.5 x the park time at the rate of a trial park of 20k messages")
	flagMillionRate   = flag.Float64("million-max-rate", 50_000, "sinks[].max_rate (msg/s) of the million group's throttled runs; 0: no throttled runs")
	flagMillionRatedN = flag.Int("million-rated-n", 200_000, "messages of the million group's throttled runs (due within one second too)")
	flagMillionPoll   = flag.Duration("million-stats-every", 10*time.Millisecond, "pause between the GET /v1/stats polls during the drain (one request at a time; 0: back to back)")
	flagMillionPairs  = flag.String("million-pairings", "nats,kafka", "pairings of the million group: nats (NATS -> NATS), kafka (Kafka -> Kafka)")
)

// millionWindow is what the million group's due times cover.
const millionWindow = time.Second

// Million is what a run of the million group measured beyond its drain
// (Scenario.Burst).
type Million struct {
	MaxRate float64 `json:"max_rate,omitempty"` // the sink's max_rate; 0: none
	// ReleaseRate is received / (last arrival - first arrival).
	ReleaseRate float64 `json:"release_rate"`
	// ReleaseDeviation is 100 x (ReleaseRate - MaxRate) / MaxRate, with a
	// max_rate.
	ReleaseDeviation *float64 `json:"release_deviation_percent,omitempty"`
	// Stats: GET /v1/stats, one request at a time from T to the end of the
	// drain (-million-stats-every apart).
	Stats *Timing `json:"get_v1_stats_during_drain"`
	// ReadyFromDue is when the daemon answered /readyz, seconds from T
	// (negative: before T).
	ReadyFromDue float64 `json:"daemon_ready_seconds_from_due"`
}

func (m *Million) summary(s *Scenario) string {
	out := fmt.Sprintf("released %.0f msg/s", m.ReleaseRate)
	if m.ReleaseDeviation != nil {
		out += fmt.Sprintf(" (max_rate %.0f: %+.1f%%)", m.MaxRate, *m.ReleaseDeviation)
	}
	if st := m.Stats; st != nil {
		out += fmt.Sprintf("; GET /v1/stats during the drain p50 %.1f p99 %.1f max %.1f ms (%d samples, %d errors)", st.MedianMS, st.P99MS, st.MaxMS, st.Samples, st.Errors)
	}
	return out + fmt.Sprintf("; %d missing, %d duplicates, %d published beyond received", s.Missing, s.Duplicates, s.ExtraPublishes)
}

// millionLead is -million-lead, or when that is 0 enough to park n
// messages with store.Park, rewrite the AOF and start the daemon: 5 s + 1.5
// x n at the rate of a trial park of 20k far-future messages, removed
// after (store.Park ran at 50k-70k msg/s on a quiet machine, 14k-33k on a
// busy one).
func (e *env) millionLead(t *testing.T, st *store.Store, n int) time.Duration {
	if *flagMillionLead > 0 {
		return *flagMillionLead
	}
	m := min(n, 20_000)
	start := time.Now()
	parkMessages(t, st, m, *flagBody, "trial", func(int) time.Time { return start.Add(30 * 24 * time.Hour) })
	took := time.Since(start)
	flushAll(t, e.redis.Addr)
	return 5*time.Second + (took*time.Duration(n)/time.Duration(m))*3/2
}

// runMillion runs, for each of -million-pairings, -million messages and
// then (with -million-max-rate) -million-rated-n messages throttled.
func runMillion(t *testing.T, e *env, rep *Report) {
	for _, p := range strings.Split(*flagMillionPairs, ",") {
		p = strings.TrimSpace(p)
		if p != "nats" && p != "kafka" {
			t.Fatalf("-million-pairings: unknown pairing %q (nats, kafka)", p)
		}
		rep.add(t, e.runMillion(t, p, *flagMillion, 0))
		if *flagMillionRate > 0 {
			rep.add(t, e.runMillion(t, p, *flagMillionRatedN, *flagMillionRate))
		}
	}
}

// runMillion parks n messages due over T..T+1s, starts the daemon (with
// maxRate as its sink's max_rate when > 0) and measures the drain.
func (e *env) runMillion(t *testing.T, pairing string, n int, maxRate float64) *Scenario {
	flushAll(t, e.redis.Addr)
	st := store.New(e.rdb, store.Options{Prefix: "bench", Shards: 16})
	lead := e.millionLead(t, st, n).Truncate(100 * time.Millisecond)
	s := &Scenario{System: "delaybridge", Group: "million", Kind: "million", Messages: n, BodyBytes: *flagBody,
		Load:    fmt.Sprintf("%s due within %s", humanCount(float64(n)), millionWindow),
		Delay:   fmt.Sprintf("due over %s from +%s, parked beforehand", millionWindow, lead),
		Million: &Million{MaxRate: maxRate}}
	if maxRate > 0 {
		s.Load += fmt.Sprintf(", max_rate %s/s", humanCount(maxRate))
	}
	ctx := context.Background()
	prefix := nextPrefix("million")
	rec := newRecorder(n, prefix)
	var (
		cfg, sink, dest string
		keyOf, shardOf  func(int) int
	)
	switch pairing {
	case "nats":
		s.Pairing = "NATS -> NATS"
		_, js := e.connect(t, "bench million consumer")
		freshStream(t, js, jetstream.StreamConfig{Name: "DELAYED", Subjects: []string{"delayed.>"}, Storage: jetstream.FileStorage})
		freshStream(t, js, jetstream.StreamConfig{Name: "FIRED", Subjects: []string{"fired.>"}, Storage: jetstream.FileStorage})
		defer func() {
			_ = js.DeleteStream(ctx, "DELAYED")
			_ = js.DeleteStream(ctx, "FIRED")
		}()
		cfg = fmt.Sprintf(natsDaemonConfig, e.redis.Addr, e.nats.URL, e.nats.URL)
		sink, dest = "out", "fired.bench"
		shardOf = benchShardOf(prefix)
		cc := consumeFired(t, js, "FIRED", "fired.>", rec, dueAtHeader)
		defer cc.Stop()
	case "kafka":
		s.Pairing = "Kafka -> Kafka"
		kc := sharedKafka(t)
		in, out := "delayed-"+prefix, "fired-"+prefix
		kc.CreateTopic(t, in, 4)
		kc.CreateTopic(t, out, 4)
		cfg = kafkaToKafkaConfig(e, kc, in, out, prefix)
		sink, dest = "kafka", out
		keys := max(1, *flagBurstKeys)
		keyOf = func(i int) int { return i % keys }
		defer readKafka(kc, out, 4, rec, false)()
	}
	if maxRate > 0 {
		// The sink is the last item of both configs.
		cfg += "    max_rate: " + strconv.FormatFloat(maxRate, 'f', -1, 64) + "\n"
	}
	t.Logf("== %s %s: %s", s.Pairing, s.System, s.Load)

	body := make([]byte, *flagBody)
	t0 := time.Now()
	at := t0.Add(lead).Truncate(time.Millisecond)
	ingested := t0.Truncate(time.Millisecond)
	parkEach(t, st, n, func(i int) *envelope.Message {
		m := &envelope.Message{ID: msgID(prefix, i), DueAt: at.Add(time.Duration(int64(millionWindow) * int64(i) / int64(n))).Truncate(time.Millisecond),
			Sink: sink, Destination: dest, Ingest: "in", IngestedAt: ingested, Body: body}
		if keyOf != nil {
			m.Key = []byte("k" + strconv.Itoa(keyOf(i)))
		}
		return m
	})
	parkedAt := time.Now()
	s.ParkSeconds = parkedAt.Sub(t0).Seconds()
	s.ParkRate = float64(n) / s.ParkSeconds
	t.Logf("   parked with store.Park in %.1f s (%.0f/s), %.1f s before T", s.ParkSeconds, s.ParkRate, at.Sub(parkedAt).Seconds())
	// The park grew the AOF past Redis's auto-rewrite threshold: let that
	// rewrite (a fork writing the whole data set) happen now, not during
	// the drain.
	rewriteAOF(t, e.rdb)

	d := startPairingDaemon(t, e, cfg, s)
	if d == nil {
		return s
	}
	s.DaemonReadySeconds = d.ready.Seconds()
	s.Million.ReadyFromDue = time.Since(at).Seconds()
	if s.Million.ReadyFromDue > 0 {
		s.note("the daemon was ready %.2f s after T: the drain includes its start (raise -million-lead)", s.Million.ReadyFromDue)
	}
	cpu := startCPU(d.proc.Pid, e.rdb)
	drainCPU := cpuFrom(at, d.proc.Pid, e.rdb)
	stopStats := pollStats(d.admin+"/v1/stats", at, *flagMillionPoll)
	<-time.After(time.Until(at)) // T: the recording and the profile cover the drain
	name := "million-" + pairing
	if maxRate > 0 {
		name += "-max-rate"
	}
	stopPerf := startPerf(t, name, d.proc.Pid, redisPid(e.rdb))
	stopProfile := startProfile(t, name, d)
	all := rec.wait(30*time.Second, time.Duration(n/500)*time.Second+2*time.Minute)
	dcpu := drainCPU()
	stats, statsErr := stopStats()
	cpu.stop(s)
	stopPerf()
	stopProfile()
	s.DaemonMetrics = d.metrics(t)
	d.stop(t)

	rec.fill(s)
	s.setBurst(t0, at, millionWindow, parkedAt, rec, shardOf, keyOf)
	s.Burst.CPU = dcpu
	m := s.Million
	m.Stats = stats
	if statsErr != nil {
		s.note("GET /v1/stats failed %d time(s) during the drain; the first: %v", stats.Errors, statsErr)
	}
	rec.mu.Lock()
	first, last := rec.first, rec.last
	rec.mu.Unlock()
	if s.Received > 1 && last.After(first) {
		m.ReleaseRate = float64(s.Received) / last.Sub(first).Seconds()
	}
	if maxRate > 0 && m.ReleaseRate > 0 {
		dev := 100 * (m.ReleaseRate - maxRate) / maxRate
		m.ReleaseDeviation = &dev
	}
	if p, ok := s.DaemonMetrics["published"]; ok {
		s.ExtraPublishes = int(p) - s.Received
		if s.ExtraPublishes != 0 {
			s.note("the daemon published %.0f messages, %d received: %+d (duplicates or retries; JetStream's duplicate window drops a repeat of an ID)", p, s.Received, s.ExtraPublishes)
		}
	}
	s.finish(all)
	return s
}

// pollStats GETs url one request at a time, every apart (0: back to back),
// from the instant at until the returned function is called, which returns
// the latencies (request to the last byte of the body) of the requests
// answered 200, with Errors counting the others, and the first error. It
// sends the admin token of a daemon run with -pprof (a daemon without a
// token serves a request with one too).
func pollStats(url string, at time.Time, every time.Duration) func() (*Timing, error) {
	ctx, cancel := context.WithCancel(context.Background())
	var (
		ds       []time.Duration
		errs     int
		firstErr error
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-time.After(time.Until(at)):
		case <-ctx.Done():
			return
		}
		client := &http.Client{Timeout: 10 * time.Second}
		for ctx.Err() == nil {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				firstErr, errs = err, errs+1
				return
			}
			req.Header.Set("Authorization", "Bearer "+pprofToken)
			t0 := time.Now()
			resp, err := client.Do(req)
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err == nil && resp.StatusCode != http.StatusOK {
					err = fmt.Errorf("status %d", resp.StatusCode)
				}
			}
			switch {
			case ctx.Err() != nil:
				return // cut short by the end of the drain: not an answer
			case err != nil:
				if firstErr == nil {
					firstErr = err
				}
				errs++
			default:
				ds = append(ds, time.Since(t0))
			}
			if every > 0 {
				select {
				case <-time.After(every): // the pause between polls
				case <-ctx.Done():
				}
			}
		}
	}()
	return func() (*Timing, error) {
		cancel()
		<-done
		tm := timing(ds)
		if tm == nil {
			tm = &Timing{}
		}
		tm.Errors = errs
		return tm, firstErr
	}
}

// millionRuns returns the million group's runs that were measured.
func (r *Report) millionRuns() []*Scenario {
	var out []*Scenario
	for _, s := range r.Scenarios {
		if s.Group == "million" && s.Million != nil && s.Burst != nil {
			out = append(out, s)
		}
	}
	return out
}

// millionTargets: all delivered once, the first within 10 ms, GET
// /v1/stats p99 < 100 ms during the drain; with max_rate, the release rate
// within 5% of it.
func (r *Report) millionTargets(yes func(bool) *bool) {
	for _, s := range r.millionRuns() {
		m, b := s.Million, s.Burst
		name := fmt.Sprintf("%s due within 1 s, %s", humanCount(float64(s.Messages)), strings.ReplaceAll(s.Pairing, " -> ", "->"))
		ok := s.Status == "ok"
		if m.MaxRate > 0 {
			t := Target{Name: fmt.Sprintf("%s, max_rate %s/s: release rate (messages / (last - first))", name, humanCount(m.MaxRate)), Goal: "within 5% of max_rate"}
			if m.ReleaseDeviation != nil {
				t.Measured = fmt.Sprintf("%.0f msg/s = %+.1f%%", m.ReleaseRate, *m.ReleaseDeviation)
				t.Met = yes(ok && math.Abs(*m.ReleaseDeviation) <= 5)
			}
			r.Targets = append(r.Targets, t)
			continue
		}
		r.Targets = append(r.Targets,
			Target{Name: name + ": every message delivered once", Goal: "none missing, no duplicate, nothing published twice",
				Measured: fmt.Sprintf("%d of %d received, %d missing, %d duplicates, %d published beyond received", s.Received, s.Messages, s.Missing, s.Duplicates, s.ExtraPublishes),
				Met:      yes(ok && s.Missing == 0 && s.Duplicates == 0 && s.ExtraPublishes == 0)},
			Target{Name: name + ": the first message after T", Goal: "<= 10 ms",
				Measured: fmt.Sprintf("+%.1f ms (drain %.0f msg/s, the last +%.0f ms after T+1s)", b.FirstMS, b.DrainRate, b.LastMS),
				Met:      yes(ok && b.FirstMS <= 10)})
		t := Target{Name: name + ": GET /v1/stats during the drain", Goal: "p99 < 100 ms"}
		if st := m.Stats; st != nil && st.Samples > 0 {
			t.Measured = fmt.Sprintf("p50 %.1f, p99 %.1f, max %.1f ms (%d samples, %d errors)", st.MedianMS, st.P99MS, st.MaxMS, st.Samples, st.Errors)
			t.Met = yes(st.P99MS < 100 && st.Errors == 0)
		}
		r.Targets = append(r.Targets, t)
	}
}

// millionMarkdown renders the million section.
func (r *Report) millionMarkdown(w func(string, ...any)) {
	var ss []*Scenario
	for _, s := range r.Scenarios {
		if s.Group == "million" {
			ss = append(ss, s)
		}
	}
	if len(ss) == 0 {
		return
	}
	w("\n### A million due within one second\n\n")
	w("The messages' due times are spread evenly over T..T+1s; they are parked beforehand with store.Park from the benchmark process (the daemon's park script, 4096 per call, two in flight; parked s from T: when the last one was, negative: before T), ")
	w("then the daemon starts (ready s from T) and drains them. Arrival as in the bursts: NATS the sink stream's timestamp, Kafka the consumer's receive time. ")
	w("first: the first arrival after T; last: the last arrival after T+1s (the last due time); p50/p99: each message's arrival - its due time; drain: n / (last - T); ")
	w("release: n / (last - first arrival), against the sink's max_rate when set. Delivered: received / duplicates / missing / published beyond received (the daemon's counter; JetStream's duplicate window hides a repeat from the consumer). ")
	w("Out of order: messages that came out after one due later or due at the same millisecond and parked later (index order), overall / within a store shard (NATS) / within a Kafka key. ")
	w("GET /v1/stats: one request at a time, %s apart, from T to the end of the drain. CPU from T to the end of the drain: daemon / Redis / harness / other of available (s).\n\n", *flagMillionPoll)
	w("| pairing | load | parked beforehand s (msg/s) | parked s from T | ready s from T | first ms | p50 ms | p99 ms | last ms | drain s | drain msg/s | release msg/s (vs max_rate) | delivered: recv / dup / missing / extra | out of order: all / shard / key | GET /v1/stats ms p50 / p99 / max (samples) | CPU in the drain | status |\n")
	w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|---|\n")
	for _, s := range ss {
		b, m := s.Burst, s.Million
		if b == nil || m == nil {
			w("| %s | %s | - | - | - | - | - | - | - | - | - | - | - | - | - | - | %s |\n", s.Pairing, s.Load, s.Status)
			continue
		}
		ready := "-"
		if b.ReadySeconds != nil {
			ready = fmt.Sprintf("%+.2f", *b.ReadySeconds)
		}
		p50, p99 := "-", "-"
		if l := s.Lateness; l != nil {
			p50, p99 = f1(l.P50), f1(l.P99)
		}
		rel := f0(m.ReleaseRate)
		if m.ReleaseDeviation != nil {
			rel += fmt.Sprintf(" (%+.1f%% of %s)", *m.ReleaseDeviation, humanCount(m.MaxRate))
		}
		stats := "-"
		if st := m.Stats; st != nil && st.Samples > 0 {
			stats = fmt.Sprintf("%.1f / %.1f / %.1f (%d", st.MedianMS, st.P99MS, st.MaxMS, st.Samples)
			if st.Errors > 0 {
				stats += fmt.Sprintf(", %d errors", st.Errors)
			}
			stats += ")"
		}
		cpu := "-"
		if c := b.CPU; c != nil {
			cpu = fmt.Sprintf("%.2f / %.2f / %.2f / %.2f of %.2f", c.Daemon, c.Redis, c.Harness, c.Other, c.Available)
		}
		shard, key := "-", "-"
		if b.OutOfOrderPerShard != nil {
			shard = strconv.Itoa(*b.OutOfOrderPerShard)
		}
		if b.OutOfOrderPerKey != nil {
			key = fmt.Sprintf("%d (%d keys)", *b.OutOfOrderPerKey, b.Keys)
		}
		w("| %s | %s | %.1f (%.0f) | %s | %+.2f | %s | %s | %s | %s | %.3f | %s | %s | %d / %d / %d / %d | %d / %s / %s | %s | %s | %s |\n", s.Pairing, s.Load, s.ParkSeconds, s.ParkRate, ready, m.ReadyFromDue,
			f1(b.FirstMS), p50, p99, f1(b.LastMS), b.DrainSeconds, f0(b.DrainRate), rel, s.Received, s.Duplicates, s.Missing, s.ExtraPublishes, b.OutOfOrder, shard, key, stats, cpu, s.Status)
	}
}
