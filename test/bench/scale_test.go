//go:build bench

package bench

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// The scale-out scenarios (-only scale): NATS -> NATS with 1 or 3 daemons
// on one Redis or on a 3-master Redis Cluster, at the maximum rate and at a
// fixed rate. The daemons of a run share one config: the same Redis (hence
// the same 16 shards, every daemon running a loop per shard) and the same
// JetStream durable consumer (hence the same ingest).

var (
	flagScaleRate    = flag.Float64("scale-rate", 5000, "fixed publish rate (msg/s) of the scale-out runs")
	flagScaleN       = flag.Int("scale-n", 0, "messages of the scale-out maximum-rate runs; 0: -n")
	flagScaleSetups  = flag.String("scale-setups", "1x1,3x1,1xC,3xC", "scale-out setups: <daemons>x1 (one Redis) or <daemons>xC (3-master Redis Cluster)")
	flagScaleLoads   = flag.String("scale-loads", "max,rate", "scale-out loads: max (-scale-n as fast as possible), rate (-scale-rate for -rate-duration)")
	flagScaleRepeats = flag.Int("scale-repeat", 1, "passes over the scale-out setups; every second pass runs them in reverse order")
)

// scaleSetup is one topology of the scale-out runs.
type scaleSetup struct {
	daemons int
	cluster bool // a 3-master Redis Cluster instead of one redis-server
}

func (s scaleSetup) String() string {
	r := "1 Redis"
	if s.cluster {
		r = "Redis Cluster (3 masters)"
	}
	d := "1 daemon"
	if s.daemons > 1 {
		d = fmt.Sprintf("%d daemons", s.daemons)
	}
	return d + ", " + r
}

func parseScaleSetups(t *testing.T) []scaleSetup {
	var out []scaleSetup
	for _, f := range strings.Split(*flagScaleSetups, ",") {
		f = strings.TrimSpace(f)
		n, kind, ok := strings.Cut(f, "x")
		d, err := strconv.Atoi(n)
		if !ok || err != nil || d < 1 || (kind != "1" && kind != "C") {
			t.Fatalf("-scale-setups: bad setup %q (want e.g. 3x1 or 3xC)", f)
		}
		out = append(out, scaleSetup{daemons: d, cluster: kind == "C"})
	}
	return out
}

// scaleRedis is the Redis side of a scale-out run: the clients to flush it and
// to read each node's CPU, and the daemon's redis: block.
type scaleRedis struct {
	nodes []*redis.Client
	yaml  string
}

var scaleCluster *testenv.RedisClusterServer

func (e *env) scaleRedis(t *testing.T, cluster bool) scaleRedis {
	if !cluster {
		return scaleRedis{nodes: []*redis.Client{e.rdb}, yaml: fmt.Sprintf(`{addr: "%s", key_prefix: bench, shards: 16}`, e.redis.Addr)}
	}
	if scaleCluster == nil {
		t.Log("starting a 3-master Redis Cluster (AOF everysec on every node)")
		scaleCluster = testenv.RedisCluster(t, 3)
	}
	r := scaleRedis{yaml: fmt.Sprintf(`{addrs: ["%s"], cluster: true, key_prefix: bench, shards: 16}`, strings.Join(scaleCluster.Addrs, `", "`))}
	for _, n := range scaleCluster.Nodes {
		r.nodes = append(r.nodes, n.Client())
	}
	return r
}

// flush empties every node (on a cluster each master holds its own slots).
func (r scaleRedis) flush(t *testing.T) {
	for _, c := range r.nodes {
		if err := c.FlushAll(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// runScale runs every scale-out setup under the maximum-rate and the fixed-rate
// load, -scale-repeat times.
func runScale(t *testing.T, e *env, rep *Report) {
	n := *flagScaleN
	if n == 0 {
		n = *flagN
	}
	rate := *flagScaleRate
	var loads []natsLoad
	for _, k := range strings.Split(*flagScaleLoads, ",") {
		switch strings.TrimSpace(k) {
		case "max":
			loads = append(loads, natsLoad{kind: "max", n: n, delay: *flagDelay})
		case "rate":
			loads = append(loads, natsLoad{kind: "rate", n: int(rate * flagRateD.Seconds()), rate: rate, delay: *flagDelay})
		default:
			t.Fatalf("-scale-loads: unknown load %q (max, rate)", k)
		}
	}
	setups := parseScaleSetups(t)
	for pass := 0; pass < max(1, *flagScaleRepeats); pass++ {
		order := append([]scaleSetup(nil), setups...)
		if pass%2 == 1 {
			for i, j := 0, len(order)-1; i < j; i, j = i+1, j-1 {
				order[i], order[j] = order[j], order[i]
			}
		}
		for _, su := range order {
			for _, l := range loads {
				s := e.runScaleNATS(t, su, l)
				s.Pass = pass + 1
				rep.add(t, s)
			}
		}
	}
}

// runScaleNATS is runDaemonNATS with su.daemons daemons on the Redis of su.
func (e *env) runScaleNATS(t *testing.T, su scaleSetup, l natsLoad) *Scenario {
	s := &Scenario{Pairing: "NATS -> NATS", System: "delaybridge", Setup: su.String(), Daemons: su.daemons,
		Load: l.name(), Kind: l.kind, Messages: l.n, TargetRate: l.rate, Delay: l.delay.String(), BodyBytes: *flagBody}
	s.RedisNodes = 1
	if su.cluster {
		s.RedisNodes = 3
	}
	t.Logf("== scale-out %s: %s", s.Setup, s.Load)
	ctx := context.Background()
	rs := e.scaleRedis(t, su.cluster)
	rs.flush(t)
	_, js := e.connect(t, "bench publisher")
	_, jsc := e.connect(t, "bench sink consumer")
	freshStream(t, js, jetstream.StreamConfig{Name: "DELAYED", Subjects: []string{"delayed.>"}, Storage: jetstream.FileStorage})
	// The sink sets Nats-Msg-Id and JetStream drops a repeated ID within the
	// stream's duplicate window: the smallest window (100 ms) lets the
	// consumer see nearly every duplicate; the daemons' published counters
	// count all of them.
	freshStream(t, js, jetstream.StreamConfig{Name: "FIRED", Subjects: []string{"fired.>"}, Storage: jetstream.FileStorage, Duplicates: 100 * time.Millisecond})
	defer func() {
		_ = js.DeleteStream(ctx, "DELAYED")
		_ = js.DeleteStream(ctx, "FIRED")
	}()

	cfg := fmt.Sprintf(`
redis: %s
admin: {listen: "%%ADMIN%%"}
ingest:
  - name: in
    nats: {url: "%s", subject: "delayed.>", stream: DELAYED, durable: delaybridge}
    route: {sink: out, destination: fired.bench}
sinks:
  - name: out
    nats: {url: "%s", jetstream: true}
`, rs.yaml, e.nats.URL, e.nats.URL)
	var ds []*daemon
	for i := 0; i < su.daemons; i++ {
		d, out := e.startDaemon(t, cfg)
		if d == nil {
			for _, d := range ds {
				d.stop(t)
			}
			s.Status = "failed"
			s.note("daemon %d exited at start: %s", i+1, lastBytes(out, 500))
			return s
		}
		ds = append(ds, d)
	}

	prefix := nextPrefix(l.kind)
	rec := newRecorder(l.n, prefix)
	cc := consumeFired(t, jsc, "FIRED", "fired.>", rec, dueAtHeader)
	parked := watchAckFloorScale(jsc, "DELAYED", "delaybridge", uint64(l.n))
	var pids []int
	for _, d := range ds {
		pids = append(pids, d.proc.Pid)
	}
	cpu := startMultiCPU(pids, rs.nodes)

	body := make([]byte, *flagBody)
	delayMS := strconv.FormatInt(l.delay.Milliseconds(), 10)
	pr := publish(t, js, l.n, l.rate, func(i int) *nats.Msg {
		m := &nats.Msg{Subject: "delayed.bench", Data: body, Header: nats.Header{}}
		m.Header["x-message-id"] = []string{msgID(prefix, i)}
		m.Header["x-delay"] = []string{delayMS}
		return m
	})
	all := rec.wait(30*time.Second, time.Duration(l.n/500)*time.Second+2*time.Minute)
	parkedAt, polls := parked()
	cpu.stop(s)
	if parkedAt.IsZero() && all {
		s.note("ack floor watcher: %s", polls)
		e.explainAckFloor(t, jsc, s, rec, l.n)
	}

	// The sink's stream stores a message before its PubAck reaches the
	// daemon, which counts it then: wait (briefly) until the daemons'
	// published counters account for every message received.
	var each []map[string]float64
	until(5*time.Second, func() bool {
		each = each[:0]
		var sum float64
		for _, d := range ds {
			m := d.metrics(t)
			each = append(each, m)
			sum += m["published"]
		}
		return int64(sum) >= rec.count.Load() || !all
	})
	rec.fill(s)
	s.PublishErrors = pr.errs
	s.setPublish(pr)
	if !parkedAt.IsZero() {
		s.ParkSeconds = parkedAt.Sub(pr.first).Seconds()
		s.ParkRate = float64(l.n) / s.ParkSeconds
	}
	cc.Stop()
	for _, d := range ds {
		d.stop(t)
	}
	s.setEndToEnd(pr.first, rec)
	if su.cluster {
		s.note("shards per master: %s", shardsPerMaster(t, rs.nodes[0], 16))
	}
	// fired/s: messages received / (earliest due time -> last arrival).
	rec.mu.Lock()
	if len(rec.dues) > 0 {
		first := rec.dues[0]
		for _, d := range rec.dues {
			if d.Before(first) {
				first = d
			}
		}
		if span := rec.last.Sub(first).Seconds(); span > 0 {
			s.FireRate = float64(len(rec.lat)) / span
		}
	}
	rec.mu.Unlock()

	var published float64
	for _, m := range each {
		s.DaemonParked = append(s.DaemonParked, m["ingest.parked"])
		s.DaemonPublished = append(s.DaemonPublished, m["published"])
		published += m["published"]
	}
	s.ExtraPublishes = int(published) - s.Received
	s.DaemonMetricsEach = each
	s.DaemonMetrics = mergeMetrics(each)
	s.finish(all)
	if s.ExtraPublishes > 0 {
		s.note("the daemons published %d messages more than were received (duplicates or retries; the sink stream's 100 ms duplicate window hides repeats that close together)", s.ExtraPublishes)
	}
	return s
}

// watchAckFloorScale is watchAckFloor with a bound on each consumer info
// request (so one slow answer of the JetStream API cannot hide the moment)
// and a summary of its polls for the notes when it never saw the floor
// within ackFloorGrace of the last arrival.
func watchAckFloorScale(js jetstream.JetStream, stream, durable string, seq uint64) func() (time.Time, string) {
	ctx, cancel := context.WithCancel(context.Background())
	type result struct {
		at    time.Time
		polls string
	}
	done := make(chan result, 1)
	go func() {
		var (
			cons                 jetstream.Consumer
			calls, errs, slowest int
			lastErr              error
			lastFloor            uint64
			lastOK               time.Time
			tick                 = time.NewTicker(20 * time.Millisecond)
		)
		defer tick.Stop()
		start := time.Now()
		for {
			if cons == nil {
				if c, err := js.Consumer(ctx, stream, durable); err == nil {
					cons = c
				}
			}
			if cons != nil {
				calls++
				cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
				t0 := time.Now()
				info, err := cons.Info(cctx)
				ccancel()
				slowest = max(slowest, int(time.Since(t0).Milliseconds()))
				switch {
				case err != nil:
					errs++
					lastErr = err
				case info.AckFloor.Stream >= seq:
					done <- result{at: time.Now()}
					return
				default:
					lastFloor, lastOK = info.AckFloor.Stream, time.Now()
				}
			}
			select {
			case <-ctx.Done():
				done <- result{polls: fmt.Sprintf("%d info requests in %.1f s, %d failed (last: %v), slowest %d ms, last floor seen %d at +%.1f s",
					calls, time.Since(start).Seconds(), errs, lastErr, slowest, lastFloor, lastOK.Sub(start).Seconds())}
				return
			case <-tick.C:
			}
		}
	}()
	return func() (time.Time, string) {
		grace := time.NewTimer(ackFloorGrace) // see watchAckFloor
		defer grace.Stop()
		select {
		case r := <-done:
			return r.at, r.polls
		case <-grace.C:
		}
		cancel()
		r := <-done
		return r.at, r.polls
	}
}

// explainAckFloor runs when every message arrived at the sink but the
// ingest consumer's ack floor never reached the last one (an ack the server
// did not record): it notes the consumer's state, then keeps the daemons
// running past the consumer's ack_wait (30 s) to see whether the
// redelivery parks and fires a message a second time.
func (e *env) explainAckFloor(t *testing.T, js jetstream.JetStream, s *Scenario, rec *recorder, n int) {
	ctx := context.Background()
	cons, err := js.Consumer(ctx, "DELAYED", "delaybridge")
	if err != nil {
		s.note("the ingest consumer's ack floor never reached the last message; consumer info: %v", err)
		return
	}
	info := func() string {
		ci, err := cons.Info(ctx)
		if err != nil {
			return err.Error()
		}
		return fmt.Sprintf("ack floor %d of %d, %d ack pending, %d redelivered, %d delivered", ci.AckFloor.Stream, n, ci.NumAckPending, ci.NumRedelivered, ci.Delivered.Stream)
	}
	s.note("the ingest consumer's ack floor never reached the last message: %s", info())
	start := time.Now()
	reached := until(45*time.Second, func() bool {
		ci, err := cons.Info(ctx)
		return err == nil && ci.AckFloor.Stream >= uint64(n)
	})
	dupsBefore := rec.dupCount()
	until(5*time.Second, func() bool { return rec.dupCount() > dupsBefore })
	s.note("%.1f s later (ack floor reached: %v): %s; duplicates at the sink since: %d", time.Since(start).Seconds(), reached, info(), rec.dupCount()-dupsBefore)
}

// shardsPerMaster says how many of the shards' hash tags {0}..{shards-1}
// fall in each master's slots (CLUSTER KEYSLOT, CLUSTER SLOTS).
func shardsPerMaster(t *testing.T, node *redis.Client, shards int) string {
	ctx := context.Background()
	slots, err := node.ClusterSlots(ctx).Result()
	if err != nil {
		return "unknown: " + err.Error()
	}
	count := map[string]int{}
	for sh := 0; sh < shards; sh++ {
		slot, err := node.ClusterKeySlot(ctx, fmt.Sprintf("bench:{%d}:due", sh)).Result()
		if err != nil {
			return "unknown: " + err.Error()
		}
		for _, r := range slots {
			if int64(r.Start) <= slot && slot <= int64(r.End) && len(r.Nodes) > 0 {
				count[r.Nodes[0].Addr]++
			}
		}
	}
	var out []string
	for addr, n := range count {
		out = append(out, fmt.Sprintf("%s: %d", addr, n))
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// dupCount is how many duplicates arrived so far.
func (r *recorder) dupCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dups
}

// until calls cond every 50 ms until it returns true or timeout passes.
func until(timeout time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if cond() {
			return true
		}
		select {
		case <-deadline.C:
			return cond()
		case <-tick.C:
		}
	}
}

// mergeMetrics adds up the daemons' counters and histogram counts; means are
// weighted by their counts.
func mergeMetrics(each []map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for _, m := range each {
		for k, v := range m {
			if strings.HasSuffix(k, ".mean") {
				c := m[strings.TrimSuffix(k, ".mean")+".count"]
				out[k] += v * c // a weighted sum for now
				continue
			}
			out[k] += v
		}
	}
	for k, v := range out {
		if base, ok := strings.CutSuffix(k, ".mean"); ok {
			if c := out[base+".count"]; c > 0 {
				out[k] = v / c
			}
		}
	}
	return out
}

// multiCPU is cpuMeter for several daemons and several Redis nodes.
type multiCPU struct {
	pids                 []int
	nodes                []*redis.Client
	daemon0              []float64
	redis0, self0, busy0 float64
	forks0               float64
	wall0                time.Time
	load0                string
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func sumRedis(nodes []*redis.Client, f func(*redis.Client) float64) float64 {
	var s float64
	for _, n := range nodes {
		s += f(n)
	}
	return s
}

func startMultiCPU(pids []int, nodes []*redis.Client) *multiCPU {
	c := &multiCPU{pids: pids, nodes: nodes, load0: loadAvg()}
	for _, p := range pids {
		c.daemon0 = append(c.daemon0, procCPU(p))
	}
	c.redis0, c.forks0 = sumRedis(nodes, redisCPU), sumRedis(nodes, redisForks)
	c.self0, c.busy0, c.wall0 = procCPU(0), machineBusy(), time.Now()
	return c
}

func (c *multiCPU) stop(s *Scenario) {
	s.WallSeconds = time.Since(c.wall0).Seconds()
	s.DaemonCPUSeconds = 0
	for i, p := range c.pids {
		v := procCPU(p) - c.daemon0[i]
		s.DaemonCPUEach = append(s.DaemonCPUEach, v)
		s.DaemonRSSEach = append(s.DaemonRSSEach, procHWM(p))
		s.DaemonCPUSeconds += v
		s.DaemonPeakRSSMB = max(s.DaemonPeakRSSMB, procHWM(p))
	}
	s.RedisCPUSeconds = sumRedis(c.nodes, redisCPU) - c.redis0
	s.HarnessCPUSeconds = procCPU(0) - c.self0
	s.OtherCPUSeconds = machineBusy() - c.busy0 - s.HarnessCPUSeconds - s.RedisCPUSeconds - s.DaemonCPUSeconds
	s.MachineCPUs = runtime.NumCPU()
	s.LoadAvgBefore, s.LoadAvgAfter = c.load0, loadAvg()
	if f := sumRedis(c.nodes, redisForks) - c.forks0; f > 0 {
		s.note("Redis forked %.0f time(s) during the run (AOF rewrite)", f)
	}
}

// scaleMarkdown renders the scale-out section: one row per run, then how
// the daemons split the work.
func (r *Report) scaleMarkdown(w func(string, ...any)) {
	var ss []*Scenario
	for _, s := range r.Scenarios {
		if s.Setup != "" {
			ss = append(ss, s)
		}
	}
	if len(ss) == 0 {
		return
	}
	sort.SliceStable(ss, func(i, j int) bool { return ss[i].Kind < ss[j].Kind }) // max before rate, run order within
	w("\n### Scale-out: NATS -> NATS with 1 or 3 daemons, one Redis or a 3-master Redis Cluster\n\n")
	w("The daemons of a run share one config: one Redis keyspace (16 shards, every daemon runs a loop per shard) and one JetStream durable consumer. ")
	w("parked/s: messages / (first publish -> ingest consumer's ack floor at the last message); fired/s: messages / (earliest due time -> last arrival at the sink stream); ")
	w("lateness: sink stream timestamp - due time. dup: duplicates seen by the consumer (the sink stream's duplicate window is 100 ms, the minimum); ")
	w("extra pub: the daemons' `delaybridge_sink_published_total` minus the messages received (0 = no message was published twice). ")
	w("CPU: utime+stime per daemon (/proc), Redis = sum of INFO cpu over the nodes, other = every other process of the machine; available = CPUs x wall. ")
	w("load: /proc/loadavg (1, 5, 15 min) before -> after the run.\n\n")
	w("| pass | setup | load | msgs | parked/s | fired/s | end-to-end/s | p50 ms | p99 ms | max ms | dup | extra pub | daemon CPU s (each) | daemon CPU s/10k (all) | Redis CPU s | harness / other CPU s of available | load before -> after | status |\n")
	w("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---|---|\n")
	for _, s := range ss {
		p50, p99, mx := "-", "-", "-"
		if l := s.Lateness; l != nil {
			p50, p99, mx = f1(l.P50), f1(l.P99), f1(l.Max)
		}
		var each []string
		for _, v := range s.DaemonCPUEach {
			each = append(each, fmt.Sprintf("%.1f", v))
		}
		w("| %d | %s | %s | %d | %s | %s | %s | %s | %s | %s | %d | %d | %s | %s | %.1f | %.1f / %.1f of %.0f | %s -> %s | %s |\n",
			s.Pass, s.Setup, s.Load, s.Messages, f0(s.ParkRate), f0(s.FireRate), f0(s.Throughput), p50, p99, mx, s.Duplicates, s.ExtraPublishes,
			strings.Join(each, " / "), f2(s.DaemonCPUPer10k), s.RedisCPUSeconds, s.HarnessCPUSeconds, s.OtherCPUSeconds,
			float64(s.MachineCPUs)*s.WallSeconds, s.LoadAvgBefore, s.LoadAvgAfter, s.Status)
	}
	w("\nHow the daemons split the work (messages parked by each daemon's ingest / published by each daemon's scheduler; claim batch and wake-ups summed over the daemons):\n\n")
	w("| pass | setup | load | parked by each | published by each | claim batch | claim ms | park ms | wake-ups timer/notify/batch |\n|---:|---|---|---|---|---:|---:|---:|---|\n")
	for _, s := range ss {
		dm := s.DaemonMetrics
		if dm == nil {
			continue
		}
		join := func(v []float64) string {
			var out []string
			for _, x := range v {
				out = append(out, fmt.Sprintf("%.0f", x))
			}
			return strings.Join(out, " / ")
		}
		w("| %d | %s | %s | %s | %s | %s | %s | %s | %.0f/%.0f/%.0f |\n", s.Pass, s.Setup, s.Load, join(s.DaemonParked), join(s.DaemonPublished),
			f1(dm["claim_batch_size.mean"]), f2(dm["script_seconds.claim.mean"]*1000), f2(dm["park_seconds.mean"]*1000),
			dm["wakeups.timer"], dm["wakeups.notify"], dm["wakeups.batch"])
	}
}
