//go:build bench

package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// natsDaemonConfig: a JetStream ingest (stream DELAYED) routed to a
// JetStream sink (stream FIRED). Everything else is the default a user gets.
// The sink is the last item: a line "    max_rate: N" appended belongs to it.
const natsDaemonConfig = `
redis: {addr: "%s", key_prefix: bench, shards: 16}
admin: {listen: "%%ADMIN%%"}
ingest:
  - name: in
    nats: {url: "%s", subject: "delayed.>", stream: DELAYED, durable: delaybridge}
    route: {sink: out, destination: fired.bench}
sinks:
  - name: out
    nats: {url: "%s", jetstream: true}
`

var scenarioSeq int

// nextPrefix returns a short x-message-id prefix unique in this run.
func nextPrefix(kind string) string {
	scenarioSeq++
	return fmt.Sprintf("%s%d", kind[:1], scenarioSeq)
}

// dueAtHeader reads the x-delaybridge-due-at header the daemon adds.
func dueAtHeader(h nats.Header) (time.Time, bool) {
	v := h.Get(envelope.HeaderDueAt)
	if v == "" {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	return t, err == nil
}

// runDaemonNATS runs the real daemon between a JetStream ingest and a
// JetStream sink under load l and measures it.
func (e *env) runDaemonNATS(t *testing.T, l natsLoad) *Scenario {
	s := &Scenario{Pairing: "NATS -> NATS", System: "delaybridge", Group: l.group, Load: l.name(), Kind: l.kind,
		Messages: l.n, TargetRate: l.rate, Delay: l.delay.String(), BodyBytes: *flagBody, ParkedBefore: max(l.preParked, l.kept)}
	if l.cfg == "" && *flagNATSCfg != "" {
		s.System += " (" + strings.TrimSpace(*flagNATSCfg) + ")"
	}
	if l.variant != "" {
		s.System += " (" + l.variant + ")"
	}
	switch l.kind {
	case "spread":
		s.Delay = fmt.Sprintf("due over %s from +%s", l.window, spreadLead)
	case "burst":
		s.Delay = fmt.Sprintf("all due at +%s", l.lead)
	}
	t.Logf("== %s %s: %s", s.Pairing, s.System, s.Load)
	ctx := context.Background()
	if l.kept == 0 {
		if err := e.rdb.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	_, js := e.connect(t, "bench publisher")
	_, jsc := e.connect(t, "bench sink consumer")
	freshStream(t, js, jetstream.StreamConfig{Name: "DELAYED", Subjects: []string{"delayed.>"}, Storage: jetstream.FileStorage})
	freshStream(t, js, jetstream.StreamConfig{Name: "FIRED", Subjects: []string{"fired.>"}, Storage: jetstream.FileStorage})
	defer func() {
		_ = js.DeleteStream(ctx, "DELAYED")
		_ = js.DeleteStream(ctx, "FIRED")
	}()

	if l.preParked > 0 {
		mem0 := redisUsedMemory(t, e.rdb)
		start := time.Now()
		parkFar(t, e.rdb, l.preParked, *flagBody)
		mem1 := redisUsedMemory(t, e.rdb)
		s.note("pre-parked %d far-future messages (%d-byte bodies) with store.Park in %.1fs; Redis used_memory +%.0f MB (%.0f B/msg)",
			l.preParked, *flagBody, time.Since(start).Seconds(), (mem1-mem0)/1e6, (mem1-mem0)/float64(l.preParked))
	}
	if l.preParked > 0 {
		// The preload grew the AOF past Redis's auto-rewrite threshold: let that
		// rewrite (a fork writing the whole dataset) happen now rather than
		// during the measured run, whose question is the size of the sets.
		rewriteAOF(t, e.rdb)
	}

	bin := l.bin
	if bin == "" {
		bin = e.bin
	}
	cfg := l.cfg
	if cfg == "" {
		cfg = *flagNATSCfg
	}
	d, out := e.startDaemonBin(t, bin, fmt.Sprintf(natsDaemonConfig, e.redis.Addr, e.nats.URL, e.nats.URL)+cfg)
	if d == nil {
		s.Status = "failed"
		s.note("daemon exited at start: %s", lastBytes(out, 500))
		return s
	}
	s.DaemonReadySeconds = d.ready.Seconds()
	prefix := nextPrefix(l.kind)
	rec := newRecorder(l.n, prefix)
	cc := consumeFired(t, jsc, "FIRED", "fired.>", rec, dueAtHeader)
	parked := watchAckFloor(t, jsc, "DELAYED", "delaybridge", uint64(l.n))
	stopPerf := func() {}
	if l.kind != "spread" {
		name := fmt.Sprintf("nats-%s-parked%d", l.kind, max(l.preParked, l.kept))
		if l.variant != "" { // the features runs: one profile per variant
			name += "-" + strings.Map(func(r rune) rune {
				if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
					return r
				}
				return '-'
			}, strings.ToLower(l.variant))
		}
		stopPerf = startPerf(t, name, d.proc.Pid, redisPid(e.rdb))
		stopProfile := startProfile(t, name, d)
		defer stopProfile()
	}
	cpu := startCPU(d.proc.Pid, e.rdb)

	body := make([]byte, *flagBody)
	delayMS := strconv.FormatInt(l.delay.Milliseconds(), 10)
	t0 := time.Now()
	burstAt := t0.Add(l.lead).Truncate(time.Millisecond)
	burstAtMS := strconv.FormatInt(burstAt.UnixMilli(), 10)
	mk := func(i int) *nats.Msg {
		m := &nats.Msg{Subject: "delayed.bench", Data: body, Header: nats.Header{}}
		m.Header["x-message-id"] = []string{msgID(prefix, i)}
		switch l.kind {
		case "spread":
			due := t0.Add(spreadLead + time.Duration(int64(l.window)*int64(i)/int64(l.n)))
			m.Header["x-deliver-at"] = []string{strconv.FormatInt(due.UnixMilli(), 10)}
		case "burst":
			m.Header["x-deliver-at"] = []string{burstAtMS}
		default:
			m.Header["x-delay"] = []string{delayMS}
		}
		return m
	}
	drainCPU := func() *DrainCPU { return nil }
	if l.kind == "burst" {
		drainCPU = cpuFrom(burstAt, d.proc.Pid, e.rdb)
	}
	pr := publish(t, js, l.n, l.rate, mk)
	all := rec.wait(30*time.Second+l.lead, time.Duration(l.n/500)*time.Second+2*time.Minute+l.lead)
	dcpu := drainCPU()
	parkedAt := parked()
	cpu.stop(s)
	stopPerf()
	s.DaemonMetrics = d.metrics(t)
	cc.Stop()
	d.stop(t)

	rec.fill(s)
	s.PublishErrors = pr.errs
	s.setPublish(pr)
	if !parkedAt.IsZero() {
		s.ParkSeconds = parkedAt.Sub(pr.first).Seconds()
		s.ParkRate = float64(l.n) / s.ParkSeconds
	}
	s.setEndToEnd(pr.first, rec)
	switch {
	case l.kind == "spread" && s.Received > 0:
		firstDue := t0.Add(spreadLead)
		s.FireRate = float64(s.Received) / rec.last.Sub(firstDue).Seconds()
	case l.kind == "burst":
		s.setBurst(pr.first, burstAt, 0, parkedAt, rec, benchShardOf(prefix), nil)
		s.Burst.CPU = dcpu
	}
	s.finish(all)
	return s
}

// watchAckFloor polls the durable consumer of stream until its ack floor
// reaches seq (every message up to seq acknowledged, i.e. parked) and
// returns a function that returns that moment (zero if never reached). The
// function waits up to ackFloorGrace for the floor: the last messages can
// reach the sink before their ingest acks are recorded (a message parked
// after its due time fires at once), so the floor may trail the last
// arrival a little.
func watchAckFloor(t *testing.T, js jetstream.JetStream, stream, durable string, seq uint64) func() time.Time {
	ctx, cancel := context.WithCancel(context.Background())
	var (
		mu sync.Mutex
		at time.Time
		wg sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		var cons jetstream.Consumer
		for ctx.Err() == nil {
			if cons == nil {
				c, err := js.Consumer(ctx, stream, durable)
				if err != nil {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				cons = c
			}
			info, err := cons.Info(ctx)
			if err == nil && info.AckFloor.Stream >= seq {
				mu.Lock()
				at = time.Now()
				mu.Unlock()
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	return func() time.Time {
		grace := time.NewTimer(ackFloorGrace)
		select {
		case <-finished:
		case <-grace.C:
		}
		grace.Stop()
		cancel()
		<-finished
		mu.Lock()
		defer mu.Unlock()
		return at
	}
}

// ackFloorGrace is how long after the last arrival at the sink the ingest
// consumer's ack floor is still awaited.
const ackFloorGrace = 10 * time.Second

// parkFar parks n messages due in 30 days directly with store.Park (the
// daemon's scripts and layout), in batches of 4096 from two goroutines.
func parkFar(t *testing.T, rdb *redis.Client, n, bodySize int) {
	t.Helper()
	st := store.New(rdb, store.Options{Prefix: "bench", Shards: 16})
	due := time.Now().Add(30 * 24 * time.Hour)
	parkMessages(t, st, n, bodySize, "f", func(int) time.Time { return due })
}

// parkMessages parks n messages with IDs prefix-0000001.. and bodySize-byte
// bodies, message i due at dueOf(i), directly with store.Park (the daemon's
// scripts and layout) in batches of 4096 from two goroutines.
func parkMessages(t *testing.T, st *store.Store, n, bodySize int, prefix string, dueOf func(i int) time.Time) {
	t.Helper()
	// Random bytes: the worst case for an AOF rewrite's RDB preamble, which
	// compresses each value with LZF (memory does not depend on content).
	body := make([]byte, bodySize)
	rnd := rand.New(rand.NewPCG(1, uint64(bodySize)))
	for i := range body {
		body[i] = byte(rnd.Uint32())
	}
	now := time.Now().Truncate(time.Millisecond)
	parkEach(t, st, n, func(i int) *envelope.Message {
		return &envelope.Message{
			ID: fmt.Sprintf("%s-%07d", prefix, i+1), DueAt: dueOf(i).Truncate(time.Millisecond),
			Sink: "out", Destination: "fired.bench", Ingest: "in", IngestedAt: now, Body: body,
		}
	})
}

// parkEach parks the n messages mk(0..n-1) directly with store.Park (the
// daemon's scripts and layout) in batches of 4096 from two goroutines.
func parkEach(t *testing.T, st *store.Store, n int, mk func(i int) *envelope.Message) {
	t.Helper()
	const batch, workers = 4096, 2
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msgs := make([]*envelope.Message, 0, batch)
			for from := w * batch; from < n; from += workers * batch {
				msgs = msgs[:0]
				for i := from; i < min(from+batch, n); i++ {
					msgs = append(msgs, mk(i))
				}
				if _, err := st.Park(context.Background(), msgs); err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		t.Fatalf("park: %v", firstErr)
	}
}

// rewriteAOF runs BGREWRITEAOF and waits until no rewrite is in progress.
func rewriteAOF(t *testing.T, rdb *redis.Client) {
	t.Helper()
	ctx := context.Background()
	_ = rdb.BgRewriteAOF(ctx).Err() // "already in progress" is fine too
	deadline := time.Now().Add(5 * time.Minute)
	for {
		info, err := rdb.Info(ctx, "persistence").Result()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(info, "aof_rewrite_in_progress:0") && !strings.Contains(info, "aof_rewrite_scheduled:1") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("AOF rewrite did not finish within 5 minutes")
		}
		<-time.After(100 * time.Millisecond) // polling a server state with a deadline
	}
}
