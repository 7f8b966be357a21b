//go:build bench

package bench

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// The burst scenarios (-only burst): n messages, all due at the same
// instant T a few seconds ahead, published as fast as possible beforehand
// (x-deliver-at = T), so that at T everything is parked and due at once.
// Measured from T: how fast the burst drains (n / (last stored - T)), how
// late the first and the last message are, and in which order they come
// out. NATS -> NATS and Kafka -> Kafka through the daemon; NATS's own
// message schedules (one subject per schedule, Nats-Schedule: @at T) and
// the floor of the sink side (the same messages published with
// PublishAsync to the same sink stream from T, runPublishFloor) for the
// sizes up to -burst-native, in the same run.

var (
	flagBurst       = flag.String("burst", "20000,200000", "sizes of the same-instant bursts (-only burst)")
	flagBurstNative = flag.Int("burst-native", 20_000, "largest burst also run through NATS's native message schedules (one stream subject per message)")
	flagBurstLead   = flag.Duration("burst-lead", 0, "how far ahead of the first publish a burst is due; 0: 2 s + 1 s per 8k messages")
	flagBurstKeys   = flag.Int("burst-keys", 64, "distinct Kafka keys of the Kafka -> Kafka burst (per-key order is checked)")
)

// Burst is what a same-instant burst measured, from the instant T all its
// messages were due (the million group: from the first of the due times
// spread over T..T+window).
type Burst struct {
	DueAt         string  `json:"due_at"`                       // T, RFC 3339 with ms
	WindowSeconds float64 `json:"due_window_seconds,omitempty"` // the due times cover T..T+window; 0: all due at T
	LeadSeconds   float64 `json:"lead_seconds"`                 // T - first publish (million: T - first park)
	// ReadySeconds is when the last message was parked (delaybridge: the
	// ingest consumer's ack floor or the parked counter; native schedules:
	// the last PubAck), relative to T: negative is before T. Absent when it
	// was not observed.
	ReadySeconds *float64 `json:"ready_seconds_from_due,omitempty"`
	DrainSeconds float64  `json:"drain_seconds"`     // last stored - T
	DrainRate    float64  `json:"drain_rate"`        // received / DrainSeconds
	FirstMS      float64  `json:"first_lateness_ms"` // first stored - T
	LastMS       float64  `json:"last_lateness_ms"`  // last stored - (T + window)
	// Order: how many messages came out after a message published later.
	// All are due at the same instant, so due order is kept whatever the
	// order; these count the tie order against publish order: overall,
	// within a store shard (ID order; NATS -> NATS only, whose sink stream
	// has one order), within a Kafka key (Kafka -> Kafka: a key's records
	// share a partition, whose order is the order of publishing).
	OutOfOrder         int  `json:"out_of_order_overall"`
	OutOfOrderPerShard *int `json:"out_of_order_within_shard,omitempty"`
	OutOfOrderPerKey   *int `json:"out_of_order_within_key,omitempty"`
	Keys               int  `json:"keys,omitempty"`
	// CPU is what each process used from T to the end of the wait for the
	// last message (up to 20 ms after it): where the drain's time went.
	CPU *DrainCPU `json:"drain_cpu,omitempty"`
}

// DrainCPU is CPU seconds used from the instant a burst was due until it
// had drained.
type DrainCPU struct {
	Wall      float64 `json:"wall_seconds"`
	Available float64 `json:"available_cpu_seconds"` // CPUs x wall
	Daemon    float64 `json:"daemon"`
	Redis     float64 `json:"redis"`
	Harness   float64 `json:"harness"` // this process: nats-server or kfake, the consumer
	Other     float64 `json:"other_processes"`
}

// cpuFrom measures CPU as startCPU does, from the instant at (a goroutine
// waits for it). The returned function ends the measurement; it returns nil
// when at had not come.
func cpuFrom(at time.Time, pid int, rdb *redis.Client) func() *DrainCPU {
	var (
		mu sync.Mutex
		m  *cpuMeter
	)
	timer := time.AfterFunc(time.Until(at), func() {
		c := startCPU(pid, rdb)
		mu.Lock()
		m = c
		mu.Unlock()
	})
	return func() *DrainCPU {
		timer.Stop()
		mu.Lock()
		defer mu.Unlock()
		if m == nil {
			return nil
		}
		return m.drain()
	}
}

// runBursts runs every burst size through the daemon (NATS -> NATS, Kafka
// -> Kafka) and, up to -burst-native, through NATS's native schedules right
// after the daemon's NATS run.
func runBursts(t *testing.T, e *env, rep *Report) {
	for _, f := range strings.Split(*flagBurst, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			t.Fatalf("-burst: bad size %q", f)
		}
		l := natsLoad{kind: "burst", n: n, lead: burstLead(n), group: "burst"}
		rep.add(t, e.runDaemonNATS(t, l))
		if n <= *flagBurstNative {
			rep.add(t, e.runNativeSchedules(t, l))
			rep.add(t, e.runPublishFloor(t, l))
		}
		s := &Scenario{Pairing: "Kafka -> Kafka", System: "delaybridge", Group: "burst", Load: l.name(), Kind: l.kind,
			Messages: n, Delay: fmt.Sprintf("all due at +%s", l.lead), BodyBytes: *flagBody}
		t.Logf("== %s %s: %s", s.Pairing, s.System, s.Load)
		runKafkaToKafka(t, e, l, s)
		rep.add(t, s)
	}
}

// floorSystem is the System of the burst's floor runs (runPublishFloor).
const floorSystem = "floor: PublishAsync"

// setBurst fills s.Burst from the recorder of a burst first published at
// start and due at at (the million group: due over at..at+window). ready is
// when the last message was parked (zero: not observed). shardOf and keyOf
// (optional) give a message index's store shard and key for the order
// counts.
func (s *Scenario) setBurst(start, at time.Time, window time.Duration, ready time.Time, rec *recorder, shardOf, keyOf func(int) int) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	b := &Burst{DueAt: at.UTC().Format(time.RFC3339Nano), WindowSeconds: window.Seconds(), LeadSeconds: at.Sub(start).Seconds()}
	s.Burst = b
	if !ready.IsZero() {
		r := ready.Sub(at).Seconds()
		b.ReadySeconds = &r
		if r > 0 {
			s.note("the last message was parked %.2f s after the first due time: the drain includes parking (raise -burst-lead or -million-lead)", r)
		}
	}
	if len(rec.lat) == 0 {
		return
	}
	b.DrainSeconds = rec.last.Sub(at).Seconds()
	if b.DrainSeconds > 0 {
		b.DrainRate = float64(len(rec.lat)) / b.DrainSeconds
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.FirstMS, b.LastMS = ms(rec.first.Sub(at)), ms(rec.last.Sub(at.Add(window)))
	b.OutOfOrder = outOfOrder(rec.order, nil)
	if shardOf != nil {
		n := outOfOrder(rec.order, shardOf)
		b.OutOfOrderPerShard = &n
	}
	if keyOf != nil {
		n := outOfOrder(rec.order, keyOf)
		b.OutOfOrderPerKey = &n
		b.Keys = *flagBurstKeys
	}
}

// outOfOrder counts the indexes of order that come after a larger index of
// the same group (all one group when groupOf is nil).
func outOfOrder(order []int32, groupOf func(int) int) int {
	highest := map[int]int32{}
	n := 0
	for _, i := range order {
		g := 0
		if groupOf != nil {
			g = groupOf(int(i))
		}
		if h, ok := highest[g]; ok && i < h {
			n++
			continue
		}
		highest[g] = i
	}
	return n
}

// benchShardOf is the store shard of a message of the benchmark's daemon
// config (16 shards).
func benchShardOf(prefix string) func(int) int {
	return func(i int) int { return store.ShardOf(msgID(prefix, i), 16) }
}

// kafkaToKafkaConfig: a Kafka ingest (topic in, consumer group bench-seq)
// routed to a Kafka sink (topic out). The sink is the last item: a line
// "    max_rate: N" appended belongs to it.
func kafkaToKafkaConfig(e *env, kc *testenv.KafkaCluster, in, out, seq string) string {
	brokers := strings.Join(kc.Brokers, `", "`)
	return fmt.Sprintf(`
redis: {addr: "%s", key_prefix: bench, shards: 16}
admin: {listen: "%%ADMIN%%"}
ingest:
  - name: in
    kafka: {brokers: ["%s"], topic: %s, group: bench-%s, start_offset: first}
    route: {sink: kafka, destination: %s}
sinks:
  - name: kafka
    kafka: {brokers: ["%s"]}
`, e.redis.Addr, brokers, in, seq, out, brokers)
}

// readKafka records every record of topic (partitions 0..partitions-1, a
// reader each, 10 ms MaxWait) in rec, as the message x-message-id due at
// x-delaybridge-due-at, arrived at the consumer's receive time (recordTime:
// at the record's timestamp). The returned function stops the readers and
// waits for them.
func readKafka(kc *testenv.KafkaCluster, topic string, partitions int, rec *recorder, recordTime bool) func() {
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for p := range partitions {
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: kc.Brokers, Topic: topic, Partition: p, MinBytes: 1, MaxBytes: 16 << 20, MaxWait: 10 * time.Millisecond})
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer r.Close()
			for {
				m, err := r.ReadMessage(ctx)
				if err != nil {
					return
				}
				at := time.Now()
				if recordTime {
					at = m.Time
				}
				var id, dueS string
				for _, h := range m.Headers {
					switch strings.ToLower(h.Key) {
					case envelope.HeaderMessageID:
						id = string(h.Value)
					case envelope.HeaderDueAt:
						dueS = string(h.Value)
					}
				}
				if due, err := time.Parse(time.RFC3339Nano, dueS); err == nil {
					rec.record(id, at, due)
				}
			}
		}()
	}
	return func() { stop(); wg.Wait() }
}

// runKafkaToKafka: records produced to a Kafka topic (kfake, in this
// process) with x-delay (or, for a burst, x-deliver-at) and a key
// (-burst-keys of them, murmur2-partitioned like the daemon's sink), delivered
// by the daemon to another topic. Arrival is the consumer's receive time (a
// reader per partition, 10 ms MaxWait): the record was stored before it.
func runKafkaToKafka(t *testing.T, e *env, l natsLoad, s *Scenario) {
	ctx := context.Background()
	kc := sharedKafka(t)
	seq := nextPrefix(l.kind)
	in, out := "delayed-"+seq, "fired-"+seq
	kc.CreateTopic(t, in, 4)
	kc.CreateTopic(t, out, 4)
	if err := e.rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	d := startPairingDaemon(t, e, kafkaToKafkaConfig(e, kc, in, out, seq), s)
	if d == nil {
		return
	}
	s.DaemonReadySeconds = d.ready.Seconds()
	rec := newRecorder(l.n, seq)
	defer readKafka(kc, out, 4, rec, false)()
	parked := watchParked(t, d, l.n)
	cpu := startCPU(d.proc.Pid, e.rdb)
	w := &kafka.Writer{Addr: kafka.TCP(kc.Brokers...), Topic: in, RequiredAcks: kafka.RequireAll,
		BatchSize: 1000, BatchTimeout: time.Millisecond, Balancer: &kafka.Murmur2Balancer{},
		Transport: &kafka.Transport{}} // not the shared default: its metadata cache misses topics created since
	defer w.Close()
	body := make([]byte, *flagBody)
	t0 := time.Now()
	at := t0.Add(l.lead).Truncate(time.Millisecond)
	drainCPU := cpuFrom(at, d.proc.Pid, e.rdb)
	when := []kafka.Header{{Key: "x-delay", Value: []byte(strconv.FormatInt(l.delay.Milliseconds(), 10))}}
	if l.kind == "burst" {
		when = []kafka.Header{{Key: "x-deliver-at", Value: []byte(strconv.FormatInt(at.UnixMilli(), 10))}}
	}
	keys := max(1, *flagBurstKeys)
	keyOf := func(i int) int { return i % keys }
	first, last := pace(l.n, l.rate, 1000, func(from, to int) {
		batch := make([]kafka.Message, 0, to-from)
		for i := from; i < to; i++ {
			batch = append(batch, kafka.Message{Key: []byte("k" + strconv.Itoa(keyOf(i))), Value: body,
				Headers: append([]kafka.Header{{Key: "x-message-id", Value: []byte(msgID(seq, i))}}, when...)})
		}
		var err error
		for try := 0; try < 5; try++ {
			if err = w.WriteMessages(ctx, batch...); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			if s.PublishErrors == 0 {
				s.note("first produce error: %v", err)
			}
			s.PublishErrors += int64(to - from)
		}
	})
	all := rec.wait(30*time.Second+l.lead, time.Duration(l.n/500)*time.Second+2*time.Minute+l.lead)
	dcpu := drainCPU()
	parkedAt := parked()
	cpu.stop(s)
	if !parkedAt.IsZero() {
		s.ParkSeconds = parkedAt.Sub(first).Seconds()
		s.ParkRate = float64(l.n) / s.ParkSeconds
	}
	s.DaemonMetrics = d.metrics(t)
	d.stop(t)
	rec.fill(s)
	s.setPublish(&pubResult{first: first, last: last})
	s.setEndToEnd(first, rec)
	if l.kind == "burst" {
		// Four readers record concurrently: only a partition's order (so a
		// key's) is the order of the sink topic.
		s.setBurst(first, at, 0, parkedAt, rec, nil, keyOf)
		s.Burst.CPU = dcpu
	}
	s.finish(all)
}

// burstTargets adds, for every burst size measured through native
// schedules, two targets: drain rate >= 1.2x native's, and the
// last message at most half as late as native's last, same run.
func (r *Report) burstTargets(yes func(bool) *bool) {
	for _, nat := range r.Scenarios {
		if nat.Group != "burst" || nat.System != "NATS schedules" || nat.Burst == nil {
			continue
		}
		db := r.burstDaemonNATS(nat.Messages)
		size := humanCount(float64(nat.Messages))
		t := Target{Name: fmt.Sprintf("burst of %s due at one instant, NATS->NATS: drain rate vs native schedules", size), Goal: ">= 1.2x native, same run"}
		t2 := Target{Name: fmt.Sprintf("burst of %s due at one instant, NATS->NATS: lateness of the last message vs native's last", size), Goal: "<= 0.5x native's, same run"}
		if db != nil && nat.Burst.DrainRate > 0 && nat.Burst.LastMS > 0 {
			x := db.Burst.DrainRate / nat.Burst.DrainRate
			t.Measured = fmt.Sprintf("%.0f vs %.0f msg/s = %.2fx", db.Burst.DrainRate, nat.Burst.DrainRate, x)
			t.Met = yes(x >= 1.2 && db.Status == "ok")
			y := db.Burst.LastMS / nat.Burst.LastMS
			t2.Measured = fmt.Sprintf("+%.0f ms vs +%.0f ms = %.2fx", db.Burst.LastMS, nat.Burst.LastMS, y)
			t2.Met = yes(y <= 0.5 && db.Status == "ok")
		}
		r.Targets = append(r.Targets, t, t2)
	}
	for _, fl := range r.Scenarios {
		if fl.Group != "burst" || fl.System != floorSystem || fl.Burst == nil {
			continue
		}
		t := Target{Name: fmt.Sprintf("burst of %s due at one instant, NATS->NATS: drain rate vs the floor (the same messages published with PublishAsync to the sink stream)", humanCount(float64(fl.Messages))),
			Goal: ">= 80% of the floor, same run"}
		if db := r.burstDaemonNATS(fl.Messages); db != nil && fl.Burst.DrainRate > 0 && fl.Status == "ok" {
			p := 100 * db.Burst.DrainRate / fl.Burst.DrainRate
			t.Measured = fmt.Sprintf("%.0f vs %.0f msg/s = %.0f%% (last message +%.0f ms vs +%.0f ms)", db.Burst.DrainRate, fl.Burst.DrainRate, p, db.Burst.LastMS, fl.Burst.LastMS)
			t.Met = yes(p >= 80 && db.Status == "ok")
		}
		r.Targets = append(r.Targets, t)
	}
}

// burstDaemonNATS is the daemon's NATS -> NATS burst of n messages (the
// last one measured), or nil.
func (r *Report) burstDaemonNATS(n int) *Scenario {
	var db *Scenario
	for _, s := range r.Scenarios {
		if s.Group == "burst" && s.Pairing == "NATS -> NATS" && s.System == "delaybridge" && s.Messages == n && s.Burst != nil {
			db = s
		}
	}
	return db
}

// burstFloor is the floor run of a burst of n messages, or nil.
func (r *Report) burstFloor(n int) *Scenario {
	for _, s := range r.Scenarios {
		if s.Group == "burst" && s.System == floorSystem && s.Messages == n && s.Burst != nil && s.Burst.DrainRate > 0 {
			return s
		}
	}
	return nil
}

// burstMarkdown renders the burst section.
func (r *Report) burstMarkdown(w func(string, ...any)) {
	var ss []*Scenario
	for _, s := range r.Scenarios {
		if s.Group == "burst" && s.Status != "pending" {
			ss = append(ss, s)
		}
	}
	if len(ss) == 0 {
		return
	}
	w("\n### Same-instant bursts\n\n")
	w("Every message has the same due time T (`x-deliver-at`; native schedules: `Nats-Schedule: @at T`, one subject each), published as fast as possible from T - lead. ")
	w("parked: when the last one was parked (ingest ack floor / parked counter; native: last PubAck), seconds from T (negative: before T). ")
	w("drain: n / (last stored - T); NATS: sink stream timestamps, Kafka: the consumer's receive time. Lateness (ms after T): first, p50, p99, last. ")
	w("Out of order: messages that came out after one published later, overall / within a store shard (NATS: the sink stream's order) / within a Kafka key (a partition's order). All are due at the same instant, so due order holds whatever the order; these count the tie order.\n\n")
	w("%s: the same messages as the daemon publishes (its headers and body), built beforehand and published with PublishAsync (16384 in flight) to the same sink stream from T = the first publish, measured as the drain: the sink side's floor. ", floorSystem)
	w("vs floor: drain msg/s as a share of the floor's of the same size, same run.\n\n")
	w("CPU from T to the end of the drain: seconds used by the daemon / Redis / the benchmark process (nats-server or kfake, consumer) / other processes, of the CPUs x wall available.\n\n")
	w("| pairing | system | msgs | lead s | parked s from T | drain s | drain msg/s | vs floor | first ms | p50 ms | p99 ms | last ms | out of order: all / shard / key | CPU in the drain: daemon / Redis / harness / other of available | status |\n")
	w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|\n")
	for _, s := range ss {
		b := s.Burst
		if b == nil {
			w("| %s | %s | %d | - | - | - | - | - | - | - | - | - | - | - | %s |\n", s.Pairing, s.System, s.Messages, s.Status)
			continue
		}
		vs := "-"
		if fl := r.burstFloor(s.Messages); fl != nil && s.Pairing == "NATS -> NATS" && b.DrainRate > 0 {
			vs = fmt.Sprintf("%.0f%%", 100*b.DrainRate/fl.Burst.DrainRate)
		}
		ready := "-"
		if b.ReadySeconds != nil {
			ready = fmt.Sprintf("%+.2f", *b.ReadySeconds)
		}
		p50, p99 := "-", "-"
		if l := s.Lateness; l != nil {
			p50, p99 = f1(l.P50), f1(l.P99)
		}
		shard, key := "-", "-"
		if b.OutOfOrderPerShard != nil {
			shard = strconv.Itoa(*b.OutOfOrderPerShard)
		}
		if b.OutOfOrderPerKey != nil {
			key = fmt.Sprintf("%d (%d keys)", *b.OutOfOrderPerKey, b.Keys)
		}
		cpu := "-"
		if c := b.CPU; c != nil {
			cpu = fmt.Sprintf("%.2f / %.2f / %.2f / %.2f of %.2f", c.Daemon, c.Redis, c.Harness, c.Other, c.Available)
		}
		w("| %s | %s | %d | %.1f | %s | %.3f | %s | %s | %s | %s | %s | %s | %d / %s / %s | %s | %s |\n", s.Pairing, s.System, s.Messages, b.LeadSeconds, ready,
			b.DrainSeconds, f0(b.DrainRate), vs, f1(b.FirstMS), p50, p99, f1(b.LastMS), b.OutOfOrder, shard, key, cpu, s.Status)
	}
}
