//go:build fault

package fault

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// Settings every scenario shares. They are the "short" operating point the
// faults need: a 2 s lease and a 2 s JetStream ack_wait, so that a crashed
// instance's claims and unacknowledged ingest messages come back quickly.
const (
	keyPrefix   = "fault"
	shards      = 16
	lease       = 2 * time.Second
	ackWait     = 2 * time.Second
	maxInFlight = 500 // ingest max_in_flight: JetStream MaxAckPending of the daemon's consumer
	maxDelayMs  = 5000
	shutdownTO  = 10 * time.Second
)

// daemonConfig is the daemon's configuration; each %[n]s is a part a
// scenario may change (world.config fills them):
//
//	%[1]s redis connection (addr, or sentinel_addrs and master_name)
//	%[2]s the ingest's broker block (NATS JetStream, or Kafka)
//	%[3]s the retry policy (max_attempts and backoff)
//	%[4]s the route's destination in the sink
//	%[5]s the sink "out"'s broker block
//	%[6]s more route settings, more sinks, more top-level sections
const daemonConfig = `
redis: {%[1]s, key_prefix: ` + keyPrefix + `, shards: 16, dial_timeout: 1s, read_timeout: 1s, write_timeout: 1s}
admin: {listen: "%%ADMIN%%"}
log: {level: info}
scheduler:
  lease: 2s
  publish_timeout: 1s
  max_sleep: 250ms
%[3]s
shutdown_timeout: 10s
ingest:
  - name: in
    %[2]s
    max_in_flight: 500
    route: {sink: out, destination: %[4]s%[6]s}
sinks:
  - name: out
    %[5]s
`

// defaultRetry is the suite's retry policy: back-off 200 ms doubling to
// 2 s, and 1000 attempts, so that retries go on well past a 10 s outage
// even for a failure that counts (attempts 1-5 take ~3 s, then one every
// 2 s).
const defaultRetry = `  max_attempts: 1000
  backoff: {initial: 200ms, max: 2s, multiplier: 2, jitter: 0.2}`

// shortRetry is a retry policy with a short budget: 3 attempts,
// back-off 100-300 ms. With publish_timeout 1 s its whole budget (three
// publishes that time out and two back-offs) is about 3.3 s: a sink outage
// longer than that would kill every due message if waiting for a sink
// counted as an attempt.
const shortRetry = `  max_attempts: 3
  backoff: {initial: 100ms, max: 300ms, multiplier: 2, jitter: 0}`

// retryBudget is shortRetry's whole budget, for the notes.
const retryBudget = 3*time.Second + 300*time.Millisecond

// options select a scenario's servers.
type options struct {
	fsync     string   // Redis appendfsync; "" is "always"
	redisArgs []string // more redis-server arguments (e.g. --maxmemory 32mb)
	kafka     bool     // Kafka ingest (kfake) instead of NATS JetStream
	rabbitIn  bool     // RabbitMQ ingest (a durable queue) instead of NATS JetStream
	partition int      // Kafka partitions (default 4)
	sink      string   // the sink's broker: "nats" (default), "rabbitmq", "kafka"
	retry     string   // the retry policy (default defaultRetry)
	// redisProxy puts a TCP proxy (testenv.Proxy) between the daemons and
	// Redis, so that a scenario can cut the network (world.proxy).
	redisProxy bool
	// sentinel runs Redis as a master with one replica, both with
	// appendfsync fsync, and a Sentinel; the daemons find the master
	// through the Sentinel (world.replica, world.sentinel).
	sentinel bool
	// cluster, when at least 3, runs Redis as a Redis Cluster of that many
	// masters without replicas (appendfsync everysec, testenv.RedisCluster);
	// the daemons use it with redis.cluster (world.cluster).
	cluster int
	// ackWait is the NATS ingest's ack_wait (default ackWait, 2 s).
	ackWait time.Duration
	// route adds settings to the ingest's route; extra adds sinks (after
	// "out") and top-level sections: YAML text.
	route, extra string
}

// world is one scenario's servers, publisher, sink collector and daemons.
type world struct {
	t     *testing.T
	name  string
	start time.Time
	rng   *rand.Rand
	opts  options
	in    *testenv.NATSServer   // ingest broker (nil with Kafka or RabbitMQ)
	parts int                   // Kafka partitions
	kafka *testenv.KafkaCluster // ingest broker with options.kafka
	// The sink's broker, one of three: out, a separate NATS server, so
	// either can be restarted alone (options.sink "nats"); rabbit, the
	// test binary's RabbitMQ node, with the queue sinkQueue ("rabbitmq");
	// sinkKafka, a kfake cluster of its own ("kafka").
	out       *testenv.NATSServer
	rabbit    *testenv.RabbitNode
	sinkQueue string
	sinkKafka *testenv.KafkaCluster
	redis     *testenv.RedisServer        // with options.sentinel: the first master
	replica   *testenv.RedisServer        // with options.sentinel
	sentinel  *testenv.RedisServer        // with options.sentinel
	proxy     *testenv.Proxy              // with options.redisProxy: what the daemons connect to
	cluster   *testenv.RedisClusterServer // with options.cluster (then redis is nil)
	// rabbitIn is the RabbitMQ node of options.rabbitIn, inQueue the
	// ingest's queue on it.
	rabbitIn *testenv.RabbitNode
	inQueue  string
	rdb      redis.UniversalClient // the test's own client: to the server, the master via Sentinel, or the cluster
	pub      *publisher
	col      *collector
	cfg      string
	cancel   context.CancelFunc
	ctx      context.Context
	res      *result
}

// publishBeganHeader is the header the faultinject build stamps every
// published message with (DELAYBRIDGE_FAULT_STAMP_PUBLISH): the daemon's
// wall clock, Unix nanoseconds, as the sink's publish began.
const publishBeganHeader = "x-fault-publish-began"

// stampPublishEnv makes a faultinject daemon stamp its publishes.
const stampPublishEnv = "DELAYBRIDGE_FAULT_STAMP_PUBLISH=" + publishBeganHeader

func newWorld(t *testing.T, name string, o options) *world {
	t.Helper()
	// Each world has servers of its own but the test binary's one RabbitMQ
	// node, which some scenarios stop: those run alone, the others side by
	// side up to -test.parallel (make fault-ci; make fault runs one at a time,
	// so that its table measures each scenario on its own).
	if o.sink != "rabbitmq" && !o.rabbitIn {
		t.Parallel()
	}
	if o.fsync == "" {
		o.fsync = "always"
	}
	if o.sink == "" {
		o.sink = "nats"
	}
	if o.retry == "" {
		o.retry = defaultRetry
	}
	if o.ackWait == 0 {
		o.ackWait = ackWait
	}
	w := &world{t: t, name: name, start: time.Now(), opts: o, rng: rand.New(rand.NewPCG(*flagSeed, seedOf(name)))}
	w.res = &result{Name: name, Seed: *flagSeed, start: w.start, DupBound: -1}
	register(w.res)
	t.Cleanup(func() {
		w.res.Wall = time.Since(w.start)
		w.res.Failed = t.Failed()
	})
	w.ctx, w.cancel = context.WithCancel(context.Background())
	t.Cleanup(w.cancel)

	switch {
	case o.cluster > 0:
		w.cluster = testenv.RedisCluster(t, o.cluster)
	case o.sentinel:
		// Redis 7 waits 5 s (repl-diskless-sync-delay) for more replicas
		// before it sends the first full sync: start it at once.
		w.redis = testenv.Redis(t, testenv.WithAppendFsync(o.fsync), testenv.WithArgs("--repl-diskless-sync-delay", "0"))
	default:
		w.redis = testenv.Redis(t, testenv.WithAppendFsync(o.fsync), testenv.WithArgs(o.redisArgs...))
	}
	var redisYAML string
	switch {
	case o.cluster > 0:
		w.rdb = w.cluster.Client()
		redisYAML = fmt.Sprintf(`cluster: true, addrs: ["%s"]`, strings.Join(w.cluster.Addrs, `", "`))
	case o.sentinel:
		w.replica = testenv.Redis(t, testenv.WithAppendFsync(o.fsync), testenv.WithArgs("--replicaof", "127.0.0.1", strconv.Itoa(w.redis.Port)))
		// A replica in production is attached long before a failover: the
		// scenario starts once this one has had its first full sync.
		rc := w.replica.Client()
		testenv.Eventually(t, 30*time.Second, func() bool {
			info, err := rc.Info(context.Background(), "replication").Result()
			return err == nil && strings.Contains(info, "master_link_status:up")
		}, "the replica did not sync with the master")
		w.sentinel = testenv.RedisSentinel(t, sentinelMaster, w.redis.Addr)
		w.rdb = redis.NewFailoverClient(&redis.FailoverOptions{MasterName: sentinelMaster, SentinelAddrs: []string{w.sentinel.Addr},
			DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
		t.Cleanup(func() { _ = w.rdb.Close() })
		redisYAML = fmt.Sprintf(`sentinel_addrs: ["%s"], master_name: %s`, w.sentinel.Addr, sentinelMaster)
	case o.redisProxy:
		w.proxy = testenv.NewProxy(t, w.redis.Addr)
		w.rdb = w.redis.Client()
		redisYAML = fmt.Sprintf(`addr: "%s"`, w.proxy.Addr)
	default:
		w.rdb = w.redis.Client()
		redisYAML = fmt.Sprintf(`addr: "%s"`, w.redis.Addr)
	}

	var sinkYAML, dest, sinkAddr string
	switch o.sink {
	case "nats":
		w.out = testenv.NATS(t)
		w.col = newNATSCollector(t, w.out.URL)
		sinkYAML, dest, sinkAddr = fmt.Sprintf(`nats: {url: "%s", jetstream: true}`, w.out.URL), "fired.fault", w.out.URL
	case "rabbitmq":
		w.rabbit = testenv.RabbitMQ(t)
		w.sinkQueue = "fault-" + name
		w.col = newRabbitCollector(t, w.rabbit, w.sinkQueue)
		sinkYAML, dest, sinkAddr = fmt.Sprintf(`rabbitmq: {url: "%s", exchange: ""}`, w.rabbit.URL), w.sinkQueue, w.rabbit.URL+" queue "+w.sinkQueue
	case "kafka":
		w.sinkKafka = testenv.Kafka(t, testenv.WithTopic(sinkTopic, sinkPartitions))
		w.col = newKafkaCollector(t, w.sinkKafka.Brokers)
		sinkYAML, dest, sinkAddr = fmt.Sprintf(`kafka: {brokers: ["%s"]}`, strings.Join(w.sinkKafka.Brokers, `", "`)), sinkTopic, strings.Join(w.sinkKafka.Brokers, ",")
	default:
		t.Fatalf("unknown sink kind %q", o.sink)
	}
	go w.col.run(w.ctx)

	var ingestYAML, ingestAddr string
	switch {
	case o.rabbitIn:
		w.rabbitIn = testenv.RabbitMQ(t)
		w.inQueue = "fault-in-" + name
		w.pub = newRabbitPublisher(t, name, w.rabbitIn, w.inQueue)
		ingestAddr = w.rabbitIn.URL + " queue " + w.inQueue
		ingestYAML = fmt.Sprintf(`rabbitmq: {url: "%s", queue: %s}`, w.rabbitIn.URL, w.inQueue)
	case o.kafka:
		if o.partition == 0 {
			o.partition = 4
		}
		w.parts = o.partition
		w.kafka = testenv.Kafka(t, testenv.WithTopic("delayed", o.partition))
		w.pub = newKafkaPublisher(t, name, w.kafka.Brokers)
		ingestAddr = strings.Join(w.kafka.Brokers, ",")
		ingestYAML = fmt.Sprintf(`kafka: {brokers: ["%s"], topic: delayed, group: delaybridge, session_timeout: 2s, commit_interval: 50ms, max_in_flight_per_partition: 500}`,
			strings.Join(w.kafka.Brokers, `", "`))
	default:
		w.in = testenv.NATS(t)
		w.pub = newNATSPublisher(t, name, w.in.URL)
		ingestAddr = w.in.URL
		ingestYAML = fmt.Sprintf(`nats: {url: "%s", subject: "delayed.>", stream: DELAYED, durable: delaybridge, ack_wait: %s}`, w.in.URL, o.ackWait)
	}
	w.cfg = fmt.Sprintf(daemonConfig, redisYAML, ingestYAML, o.retry, dest, sinkYAML, o.route) + o.extra
	t.Logf("%s: redis %s (appendfsync %s), ingest %s, %s sink %s", name, redisYAML, o.fsync, ingestAddr, o.sink, sinkAddr)
	return w
}

// sentinelMaster is the master name the Sentinel of options.sentinel
// monitors.
const sentinelMaster = "faultmaster"

// stopSink stops the sink's broker: the NATS server shut down, the RabbitMQ
// node stopped (SIGTERM, as a service manager does), the kfake cluster closed (its state
// saved). Clients see their connections closed and cannot connect.
func (w *world) stopSink() {
	w.t.Helper()
	switch {
	case w.out != nil:
		w.out.Shutdown()
	case w.rabbit != nil:
		w.rabbit.Stop(w.t)
	case w.sinkKafka != nil:
		w.sinkKafka.Close()
	}
}

// startSink starts the sink's broker again on the same ports and state
// (streams, durable queues with their persistent messages, topics with
// their records survive).
func (w *world) startSink() {
	w.t.Helper()
	switch {
	case w.out != nil:
		w.out.Restart()
	case w.rabbit != nil:
		w.rabbit.Start(w.t)
	case w.sinkKafka != nil:
		w.sinkKafka.Restart()
	}
}

func kafkaAddrs(k *testenv.KafkaCluster) []string {
	if k == nil {
		return nil
	}
	return k.Brokers
}

func seedOf(s string) uint64 {
	var h uint64 = 14695981039346656037
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// at is the time since the scenario started, for logs.
func (w *world) at() string { return time.Since(w.start).Round(10 * time.Millisecond).String() }

func (w *world) logf(format string, args ...any) {
	w.t.Helper()
	w.t.Logf("[%s %8s] %s", w.name, w.at(), fmt.Sprintf(format, args...))
}

// hold waits for d: the DURATION OF A FAULT or the moment of one (a scenario
// parameter, e.g. "the sink is away for 10 s"), never synchronisation, which
// is done with await/Eventually on an observable condition.
func (w *world) hold(d time.Duration, what string) {
	w.logf("holding %v: %s", d.Round(time.Millisecond), what)
	select {
	case <-time.After(d):
	case <-w.ctx.Done():
	}
}

// burstSize is the size of a burst of messages due at one instant.
const burstSize = 1000

// burst publishes burstSize messages (IDs from `from` on), all due `lead`
// from now, and returns their due time.
func (w *world) burst(from int, lead time.Duration) time.Time {
	at := time.Now().Add(lead)
	began := time.Now()
	w.pub.burst(w.ctx, from, from+burstSize, at)
	w.logf("burst of %d messages, all due at +%v, published in %v", burstSize, lead, time.Since(began).Round(time.Millisecond))
	return at
}

// burstAsync is burst in the background; the channel is closed when the
// broker confirmed every message.
func (w *world) burstAsync(from int, lead time.Duration) <-chan struct{} {
	done := make(chan struct{})
	at := time.Now().Add(lead)
	go func() {
		defer close(done)
		w.pub.burst(w.ctx, from, from+burstSize, at)
	}()
	return done
}

// atBurst waits until shortly before the due time of the burst published
// from ID `from` on, then polls until claims of the burst's own messages
// show (up to 2 s; claims of other traffic do not count): the moment of the
// fault. It reports whether it saw them. Polling starts 50 ms early because
// the daemon fires on time while this process (which runs the NATS servers
// too) may wake up late. Each poll is one script (heldScript), an atomic
// read of every shard: the fault follows it within a fraction of a
// millisecond, at the first moment any claim of the burst is held, while
// most of the burst is (the whole burst settles in 10-20 ms).
func (w *world) atBurst(at time.Time, from int) bool {
	w.holdUntil(at.Add(-50*time.Millisecond), "shortly before the burst's due time (scenario parameter)")
	keys := store.NewKeys(keyPrefix)
	byShard := map[int][]string{}
	for _, id := range w.pub.idRange(from, from+burstSize) {
		byShard[shardOf(id)] = append(byShard[shardOf(id)], id)
	}
	var dues []string
	var args []any
	for sh, ids := range byShard {
		// layout 1's due set, where a claim is a score with a fraction;
		// layout 2's sets of claims, where any member is one
		for i, key := range []string{keys.Due(sh), keys.InflightAt(sh, 0), keys.AheadAt(sh, 0)} {
			dues = append(dues, key)
			args = append(args, min(i, 1), len(ids))
			for _, id := range ids {
				args = append(args, id)
			}
		}
	}
	ctx := context.Background()
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		if n, err := heldScript.Run(ctx, w.rdb, dues, args...).Int(); err == nil && n > 0 {
			return true
		}
	}
	w.logf("no claim of the burst seen in Redis")
	return false
}

// heldScript counts the given messages that are claimed: in layout 1 a
// due score with a fraction (lease expiry + 0.5 or + 0.75, see
// store.Keys), in layout 2 any member of the in-flight and claimed-ahead
// sets. One script, so one atomic read.
//
//	KEYS    -> sorted sets
//	ARGV    -> per set: 1 when any member counts (else one with a
//	           fraction), the number of IDs, then the IDs
//	returns -> how many of them are claimed
var heldScript = redis.NewScript(`
local held, a = 0, 1
for _, key in ipairs(KEYS) do
  local any, n = ARGV[a] == '1', tonumber(ARGV[a + 1])
  local scores = redis.call('ZMSCORE', key, unpack(ARGV, a + 2, a + 1 + n))
  a = a + 2 + n
  for _, s in ipairs(scores) do
    if s and (any or tonumber(s) % 1 ~= 0) then held = held + 1 end
  end
end
return held
`)

// untilHolding polls until some message is in flight (claimed, not yet
// acked: a due score of lease expiry + 0.5, see store.Keys), up to timeout,
// and reports whether that happened. It reads one shard's due set per
// command, shards in turn: a single command is answered as soon as Redis
// runs it, so the fault that follows comes right after the read, while the
// claim it saw may still be held (a claim of one message lives a few ms).
func (w *world) untilHolding(timeout time.Duration) bool {
	keys := store.NewKeys(keyPrefix)
	ctx := context.Background()
	deadline := time.Now().Add(timeout)
	for sh := 0; time.Now().Before(deadline); sh = (sh + 1) % shards {
		if w.rdb.Exists(ctx, keys.InflightAt(sh, 0)).Val() > 0 { // layout 2
			return true
		}
		zs, err := w.rdb.ZRangeWithScores(ctx, keys.Due(sh), 0, -1).Result()
		if err != nil {
			continue
		}
		for _, z := range zs {
			if z.Score != math.Trunc(z.Score) {
				return true
			}
		}
	}
	return false
}

// holdUntil is hold until the moment t (a scenario parameter).
func (w *world) holdUntil(t time.Time, what string) {
	if d := time.Until(t); d > 0 {
		w.hold(d, what)
	} else {
		w.logf("already %v past the moment of: %s", -d, what)
	}
}

// sampleUntil calls f every `every` until deadline (and once at the start):
// the pace of the readings a scenario takes during a fault whose length is
// the scenario's own (a hold that reads as it waits).
func sampleUntil(deadline time.Time, every time.Duration, f func()) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		f()
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		select {
		case <-tick.C:
		case <-time.After(left):
			return
		}
	}
}

// randDur is uniform in [lo, hi).
func (w *world) randDur(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(w.rng.Int64N(int64(hi-lo)))
}

// await polls cond (from a ticker) until it is true or timeout passes, and
// reports which. Unlike testenv.Eventually it does not fail the test, so
// that a scenario can still measure and report what it got.
func await(timeout time.Duration, cond func() bool) bool {
	deadline := time.After(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if cond() {
			return true
		}
		select {
		case <-deadline:
			return cond()
		case <-tick.C:
		}
	}
}

// ---------------------------------------------------------------------------
// daemon

// daemon is one delaybridge process (restarted in place after a kill).
type daemon struct {
	w       *world
	bin     string
	env     []string
	cfgPath string
	admin   string
	proc    *testenv.Process
	starts  int
}

// startDaemon writes the world's config with a fresh admin port and runs
// `delaybridge run` until /readyz answers 200.
func (w *world) startDaemon() *daemon {
	w.t.Helper()
	return w.startDaemonWith(testenv.Build(w.t))
}

// startDaemonWith is startDaemon with another binary (e.g. the faultinject
// build) and environment.
func (w *world) startDaemonWith(bin string, env ...string) *daemon {
	w.t.Helper()
	d := w.newDaemon(bin, env...)
	d.start()
	return d
}

// newDaemon writes the world's config with a fresh admin port for a daemon
// that is not started yet.
func (w *world) newDaemon(bin string, env ...string) *daemon {
	w.t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(w.t))
	path := filepath.Join(w.t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(w.cfg, "%ADMIN%", addr)), 0o644); err != nil {
		w.t.Fatal(err)
	}
	return &daemon{w: w, bin: bin, env: env, cfgPath: path, admin: "http://" + addr}
}

func (d *daemon) start() {
	d.w.t.Helper()
	d.starts++
	d.proc = testenv.StartProcessWith(d.w.t, testenv.ProcessOptions{Env: d.env}, d.bin, "run", "--config", d.cfgPath)
	began := time.Now()
	testenv.Eventually(d.w.t, 60*time.Second, func() bool {
		if d.proc.Exited() {
			d.w.t.Fatalf("delaybridge exited at start:\n%s", d.proc.Output())
		}
		code, _ := d.get("/readyz")
		return code == http.StatusOK
	}, "delaybridge not ready")
	d.w.logf("daemon pid %d ready in %v (start #%d)", d.proc.Pid, time.Since(began).Round(time.Millisecond), d.starts)
}

// kill sends SIGKILL and waits for the process to be gone.
func (d *daemon) kill() {
	d.w.t.Helper()
	d.proc.Kill()
	d.w.logf("daemon pid %d killed (SIGKILL)", d.proc.Pid)
}

// term sends SIGTERM and returns the exit code and how long the exit took.
func (d *daemon) term(timeout time.Duration) (int, time.Duration) {
	d.w.t.Helper()
	began := time.Now()
	d.proc.Signal(syscall.SIGTERM)
	code := d.proc.Wait(timeout)
	return code, time.Since(began)
}

// del sends DELETE to an admin path and returns the status.
func (d *daemon) del(path string) int {
	c := http.Client{Timeout: 2 * time.Second}
	req, _ := http.NewRequest(http.MethodDelete, d.admin+path, nil)
	resp, err := c.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func (d *daemon) get(path string) (int, string) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(d.admin + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metric sums the samples of a Prometheus metric whose label set contains
// every one of labels (`name="value"` strings); -1 when unreachable.
func (d *daemon) metric(name string, labels ...string) float64 {
	code, body := d.get("/metrics")
	if code != http.StatusOK {
		return -1
	}
	var sum float64
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
lines:
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || (len(line) > len(name) && line[len(name)] != '{' && line[len(name)] != ' ') {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(line, l) {
				continue lines
			}
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

// ---------------------------------------------------------------------------
// publisher

// sent is one message the broker confirmed.
type sent struct {
	at    time.Time // when the ingest broker confirmed it (PubAck / acks=all)
	delay time.Duration
}

// publisher sends the scenario's messages to the ingest. IDs are
// "<scenario>-00042"; delays are drawn from the seed, so a resend carries
// the same delay. A publish that fails (broker away) is retried until the
// broker confirms it, as a real publisher would.
type publisher struct {
	t    *testing.T
	name string
	// send publishes one message with x-delay, or with x-deliver-at when
	// at is not zero.
	send func(ctx context.Context, id string, delay time.Duration, at time.Time) error
	// headers, when set, gives headers that the NATS publisher adds to (or
	// sets over) the message's own.
	headers func(id string) map[string]string
	// body, when set, gives the NATS publisher's message body (default: the
	// ID).
	body func(id string) []byte

	mu      sync.Mutex
	sent    map[string]sent
	order   []string
	retries int             // failed publish attempts (each may have stored a copy anyway)
	resent  map[string]bool // IDs with a failed attempt before the confirmed one
	failing bool
	// doomed are the IDs a scenario sends to die (rejected at ingest,
	// refused by the sink), with how: they are left out of what must be
	// delivered (snapshot's order) and must end in Redis's dead set.
	doomed map[string]string
	// cancelled are the IDs a scenario cancelled (answered 204), with the
	// time of the answer: left out of what must be delivered, and never
	// published after it.
	cancelled map[string]time.Time
}

// cancel records that the daemon answered a cancel of id with 204 at at.
func (p *publisher) cancel(id string, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cancelled[id] = at
}

// doom marks an ID as meant to die, before it is published.
func (p *publisher) doom(id, how string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.doomed[id] = how
}

// doomedSent returns the doomed IDs the broker confirmed, with how each
// dies.
func (p *publisher) doomedSent() map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := map[string]string{}
	for id, how := range p.doomed {
		if _, ok := p.sent[id]; ok {
			m[id] = how
		}
	}
	return m
}

// connectJetStream connects to the NATS server at url for the whole test,
// reconnecting forever (the scenarios restart servers), and returns the
// JetStream context of the connection.
func connectJetStream(t *testing.T, url, name string) jetstream.JetStream {
	t.Helper()
	_, js := testenv.ConnectNATS(t, url, nats.Name(name), nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond), nats.RetryOnFailedConnect(true))
	return js
}

func newNATSPublisher(t *testing.T, name, url string) *publisher {
	js := connectJetStream(t, url, "fault publisher")
	// The ingest stream exists before the daemon starts, so messages can
	// be published first; file storage survives a restart of the server.
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{
		Name: "DELAYED", Subjects: []string{"delayed.>"}, Storage: jetstream.FileStorage,
	}); err != nil {
		t.Fatal(err)
	}
	p := newPublisher(t, name)
	p.send = func(ctx context.Context, id string, delay time.Duration, at time.Time) error {
		m := nats.NewMsg("delayed.fault")
		m.Data = []byte(id)
		if p.body != nil {
			m.Data = p.body(id)
		}
		if at.IsZero() {
			m.Header.Set(envelope.HeaderDelay, strconv.FormatInt(delay.Milliseconds(), 10))
		} else {
			m.Header.Set(envelope.HeaderDeliverAt, strconv.FormatInt(at.UnixMilli(), 10))
		}
		m.Header.Set(envelope.HeaderMessageID, id)
		m.Header.Set(envelope.HeaderNatsMsgID, id) // the ingest stream drops a resend in its window
		if p.headers != nil {
			for k, v := range p.headers(id) {
				m.Header.Set(k, v)
			}
		}
		_, err := js.PublishMsg(ctx, m)
		return err
	}
	return p
}

func newPublisher(t *testing.T, name string) *publisher {
	return &publisher{t: t, name: name, sent: map[string]sent{}, resent: map[string]bool{}, doomed: map[string]string{}, cancelled: map[string]time.Time{}}
}

// delayOf is the message's delay, 0-5 s, from the seed.
func (p *publisher) delayOf(i int) time.Duration {
	r := rand.New(rand.NewPCG(*flagSeed^seedOf(p.name), uint64(i)))
	return time.Duration(r.IntN(maxDelayMs+1)) * time.Millisecond
}

func (p *publisher) id(i int) string { return fmt.Sprintf("%s-%05d", p.name, i) }

// idRange is the IDs of messages from to to-1.
func (p *publisher) idRange(from, to int) []string {
	ids := make([]string, 0, to-from)
	for i := from; i < to; i++ {
		ids = append(ids, p.id(i))
	}
	return ids
}

// publish sends message i (due at `at` when not zero, else after its
// delay) until the broker confirms it or ctx ends.
func (p *publisher) publish(ctx context.Context, i int, at time.Time) {
	id, delay := p.id(i), p.delayOf(i)
	if !at.IsZero() {
		delay = 0
	}
	for ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := p.send(pctx, id, delay, at)
		cancel()
		if err == nil {
			p.mu.Lock()
			if _, dup := p.sent[id]; !dup {
				p.order = append(p.order, id)
			}
			p.sent[id] = sent{at: time.Now(), delay: delay}
			if p.failing {
				p.failing = false
				p.t.Logf("publisher: ingest accepts publishes again (%d failed attempts so far)", p.retries)
			}
			p.mu.Unlock()
			return
		}
		p.mu.Lock()
		p.retries++
		p.resent[id] = true
		if !p.failing {
			p.failing = true
			p.t.Logf("publisher: publish of %s failed, retrying until the broker confirms: %v", id, err)
		}
		p.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond): // publisher's retry pacing
		}
	}
}

// stream publishes messages [from, to) at about rate per second in the
// background; the channel is closed when all are confirmed.
func (p *publisher) stream(ctx context.Context, from, to, rate int) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		began := time.Now()
		i := from
		for i < to && ctx.Err() == nil {
			target := from + int(time.Since(began).Seconds()*float64(rate)) + 1
			for ; i < min(target, to) && ctx.Err() == nil; i++ {
				p.publish(ctx, i, time.Time{})
			}
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
	}()
	return done
}

// burst publishes messages [from, to) as fast as the broker confirms them,
// all due at the same instant `at` (x-deliver-at): a top-of-the-minute
// burst that keeps every shard claiming and publishing at `at`.
func (p *publisher) burst(ctx context.Context, from, to int, at time.Time) {
	for i := from; i < to && ctx.Err() == nil; i++ {
		p.publish(ctx, i, at)
	}
}

func (p *publisher) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.order)
}

func (p *publisher) resentIDs() map[string]bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := make(map[string]bool, len(p.resent))
	for k := range p.resent {
		m[k] = true
	}
	return m
}

// snapshot returns what was sent: every confirmed message, the IDs that
// must be delivered in the order they were confirmed (the doomed ones left
// out), and the failed publish attempts.
func (p *publisher) snapshot() (map[string]sent, []string, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := make(map[string]sent, len(p.sent))
	for k, v := range p.sent {
		m[k] = v
	}
	order := make([]string, 0, len(p.order))
	for _, id := range p.order {
		_, doomed := p.doomed[id]
		_, cancelled := p.cancelled[id]
		if !doomed && !cancelled {
			order = append(order, id)
		}
	}
	return m, order, p.retries
}

// cancelledAt returns the cancelled IDs with the time of their 204.
func (p *publisher) cancelledAt() map[string]time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := make(map[string]time.Time, len(p.cancelled))
	for id, at := range p.cancelled {
		m[id] = at
	}
	return m
}

// ---------------------------------------------------------------------------
// collector

// copyAt is one copy of a message stored by the sink.
type copyAt struct {
	at      time.Time // the sink's timestamp (JetStream, Kafka record), or the receive time (RabbitMQ)
	began   time.Time // publishBeganHeader: when the daemon began its publish; zero without
	due     time.Time // x-delaybridge-due-at
	attempt int       // x-delaybridge-attempt
	seq     uint64
}

// describeCopies lists copies as attempt@sink time, for a failure's log.
func describeCopies(cs []copyAt) string {
	var b strings.Builder
	for i, c := range cs {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "attempt %d at %s", c.attempt, c.at.Format("15:04:05.000"))
	}
	if len(cs) == 0 {
		return "none"
	}
	return b.String()
}

// waitStopped waits until every thread of process pid is stopped (a
// SIGSTOP delivered), so that it sends nothing more.
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			t.Fatalf("reading the threads of process %d: %v", pid, err)
		}
		running := 0
		for _, task := range tasks {
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
			if err != nil {
				continue // the thread ended
			}
			// pid (comm) state ...: comm may hold spaces and parentheses
			if f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:])); len(f) > 0 && f[0] != "T" && f[0] != "t" {
				running++
			}
		}
		if running == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d: %d threads not stopped 5 s after SIGSTOP", pid, running)
		}
		time.Sleep(time.Millisecond) // poll
	}
}

// collector records every copy the sink got, by x-message-id. run reads the
// sink until its context ends, re-attaching whenever the sink's broker went
// away; caughtUp reports whether everything the sink held when it was
// called was read. One per sink kind: newNATSCollector, newRabbitCollector,
// newKafkaCollector.
type collector struct {
	t        *testing.T
	run      func(ctx context.Context)
	caughtUp func(ctx context.Context) bool

	mu     sync.Mutex
	copies map[string][]copyAt
	total  int
	// redelivered counts copies the sink's broker gave the collector again
	// (RabbitMQ: received, not yet acked at a stop), not counted as copies.
	redelivered int
}

func newCollectorOf(t *testing.T) *collector {
	return &collector{t: t, copies: map[string][]copyAt{}}
}

// add records one copy. IDs of the collector's own markers are left out.
func (c *collector) add(id string, cp copyAt) {
	if strings.HasPrefix(id, markerPrefix) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.copies[id] = append(c.copies[id], cp)
	c.total++
}

// markerPrefix starts the IDs of messages a collector sends to its own sink
// queue to see that it read everything before them.
const markerPrefix = "collector-marker-"

// newNATSCollector reads the sink stream FIRED from the start. The
// stream's duplicate window is JetStream's minimum (100 ms) so that it
// stores (nearly) every copy the daemon published: the counts are the
// daemon's, not hidden by JetStream's de-duplication.
func newNATSCollector(t *testing.T, url string) *collector {
	js := connectJetStream(t, url, "fault sink consumer")
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{
		Name: "FIRED", Subjects: []string{"fired.>"}, Storage: jetstream.FileStorage,
		Duplicates: 100 * time.Millisecond,
	}); err != nil {
		t.Fatal(err)
	}
	c := newCollectorOf(t)
	var (
		mu   sync.Mutex
		next uint64 = 1 // next stream sequence to read
	)
	record := func(m jetstream.Msg) {
		md, err := m.Metadata()
		if err != nil {
			return
		}
		mu.Lock()
		if md.Sequence.Stream < next {
			mu.Unlock()
			return // already read (a re-created consumer overlapping)
		}
		next = md.Sequence.Stream + 1
		mu.Unlock()
		h := m.Headers()
		cp := copyAt{at: md.Timestamp, seq: md.Sequence.Stream}
		cp.due, _ = time.Parse(time.RFC3339Nano, h.Get(envelope.HeaderDueAt))
		cp.attempt, _ = strconv.Atoi(h.Get(envelope.HeaderAttempt))
		if ns, err := strconv.ParseInt(h.Get(publishBeganHeader), 10, 64); err == nil {
			cp.began = time.Unix(0, ns)
		}
		c.add(h.Get(envelope.HeaderMessageID), cp)
	}
	c.run = func(ctx context.Context) {
		for ctx.Err() == nil {
			mu.Lock()
			start := next
			mu.Unlock()
			cons, err := js.OrderedConsumer(ctx, "FIRED", jetstream.OrderedConsumerConfig{
				DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: start})
			if err != nil {
				select {
				case <-ctx.Done():
				case <-time.After(200 * time.Millisecond): // re-try pacing while the sink server is away
				}
				continue
			}
			for ctx.Err() == nil {
				batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(500*time.Millisecond))
				if err != nil {
					break
				}
				for m := range batch.Messages() {
					record(m)
				}
				if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
					break
				}
			}
		}
	}
	c.caughtUp = func(ctx context.Context) bool {
		s, err := js.Stream(ctx, "FIRED")
		if err != nil {
			return false
		}
		info, err := s.Info(ctx)
		if err != nil {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		return next > info.State.LastSeq
	}
	return c
}

// delivered counts how many of ids have at least one copy.
func (c *collector) delivered(ids []string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, id := range ids {
		if len(c.copies[id]) > 0 {
			n++
		}
	}
	return n
}

func (c *collector) redeliveredCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.redelivered
}

func (c *collector) snapshot() map[string][]copyAt {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[string][]copyAt, len(c.copies))
	for k, v := range c.copies {
		m[k] = append([]copyAt(nil), v...)
	}
	return m
}

// ---------------------------------------------------------------------------
// Redis and ingest state

// redisState is what Redis holds: parked messages (waiting or in flight),
// those claimed (under a lease not yet acked or retried: a score on the
// wire with a fraction, see pkg/store/lua/lib/wire.lua: in flight, lease
// expiry + 0.5; claimed ahead of the due time and not published yet,
// + 0.75; a publish slot, + 0.25) and dead ones, in either layout
// (stateSets).
type redisState struct {
	parked, inflight, dead int
	inflightIDs            []string
	deadIDs                map[string]bool
	leases                 map[string]int64 // in-flight ID -> lease expiry (Unix ms, Redis clock)
	// attempts: in-flight ID -> the last attempt its holder may have
	// published (the claim's; for a claim ahead, the one before: the
	// holder publishes only after its commit, which makes it in flight).
	attempts map[string]int
	// ahead: the in-flight IDs that are claims ahead of their due time
	// (not committed, not published yet by their holder).
	ahead map[string]bool
}

// stateSet is a sorted set of a shard's parked messages (in any state
// but dead) and the mark its scores get on the wire (layout 1's score,
// store.Keys): in layout 1 the due sets (mark 0), in layout 2 also the set
// of each state, whose scores are times alone.
type stateSet struct {
	key  string
	mark float64
}

// stateSets are shard sh's sets of parked messages in both layouts (a
// layout's keys that the other does not use do not exist), the held sets
// of the first hold bands included.
func stateSets(keys store.Keys, sh int) []stateSet {
	var out []stateSet
	for p := 0; p <= store.MaxPriority; p++ {
		out = append(out, stateSet{keys.DueAt(sh, p), 0}, stateSet{keys.InflightAt(sh, p), 0.5},
			stateSet{keys.AheadAt(sh, p), 0.75}, stateSet{keys.SlotAt(sh, p), 0.25})
	}
	for b := range 4 {
		for _, key := range keys.HeldSets(sh, b) {
			out = append(out, stateSet{key, 0})
		}
	}
	return out
}

func readRedisState(ctx context.Context, rdb redis.UniversalClient) (redisState, error) {
	s := redisState{leases: map[string]int64{}, attempts: map[string]int{}, deadIDs: map[string]bool{}, ahead: map[string]bool{}}
	keys := store.NewKeys(keyPrefix)
	pipe := rdb.Pipeline()
	due := make([][]*redis.ZSliceCmd, shards)
	marks := make([][]float64, shards)
	dead := make([]*redis.StringSliceCmd, shards)
	meta := make([]*redis.MapStringStringCmd, shards)
	for i := 0; i < shards; i++ {
		for _, set := range stateSets(keys, i) {
			due[i] = append(due[i], pipe.ZRangeWithScores(ctx, set.key, 0, -1))
			marks[i] = append(marks[i], set.mark)
		}
		dead[i] = pipe.ZRange(ctx, keys.Dead(i), 0, -1)
		meta[i] = pipe.HGetAll(ctx, keys.Meta(i))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return s, err
	}
	for i := 0; i < shards; i++ {
		for _, id := range dead[i].Val() {
			s.dead++
			s.deadIDs[id] = true
		}
		for j, cmd := range due[i] {
			for _, z := range cmd.Val() {
				z.Score += marks[i][j]
				s.parked++
				if z.Score == math.Trunc(z.Score) {
					continue // waiting for its due time
				}
				id := z.Member.(string)
				// attempts|deadAt|priority|reason counts the attempts
				// before this claim (failed or abandoned), when any.
				before := 0
				if v, ok := meta[i].Val()[id]; ok {
					before, _ = strconv.Atoi(strings.SplitN(v, "|", 2)[0])
				}
				s.inflight++
				s.inflightIDs = append(s.inflightIDs, id)
				s.leases[id] = int64(z.Score)
				s.attempts[id] = before + 1
				if z.Score-math.Trunc(z.Score) == 0.75 {
					s.attempts[id] = before // claimed ahead: not published by its holder
					s.ahead[id] = true
				}
			}
		}
	}
	return s, nil
}

func (w *world) redisState() redisState {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := readRedisState(ctx, w.rdb)
	if err != nil {
		w.t.Fatalf("reading redis state: %v", err)
	}
	return s
}

// aofState is the Redis state a killed server will come back with: its AOF
// files copied into a second, private redis-server, which loads them and is
// read there. It is exact at the moment of the kill, without racing the
// daemon, which reconnects as soon as the real server is back.
func (w *world) aofState() redisState {
	w.t.Helper()
	if w.redis.Running() {
		w.t.Fatal("aofState: the redis server is running")
	}
	insp := testenv.Redis(w.t)
	insp.Kill()
	dst := filepath.Join(insp.Dir, "appendonlydir")
	if err := os.RemoveAll(dst); err != nil {
		w.t.Fatal(err)
	}
	if err := copyDir(filepath.Join(w.redis.Dir, "appendonlydir"), dst); err != nil {
		w.t.Fatal(err)
	}
	insp.Start()
	defer insp.Kill()
	c := insp.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := readRedisState(ctx, c)
	if err != nil {
		w.t.Fatalf("reading the AOF copy: %v", err)
	}
	return s
}

func copyDir(src, dst string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// ingestState is the daemon's JetStream consumer as the ingest server sees
// it: messages delivered but not acknowledged, and not yet delivered.
type ingestState struct {
	ackPending, pending int
	acked               int // delivered stream sequence minus those pending acks
}

func (w *world) ingestState() (ingestState, error) {
	if w.in == nil {
		return ingestState{}, errors.New("not a NATS ingest")
	}
	nc, err := nats.Connect(w.in.URL, nats.Name("fault inspector"))
	if err != nil {
		return ingestState{}, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return ingestState{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	cons, err := js.Consumer(ctx, "DELAYED", "delaybridge")
	if err != nil {
		return ingestState{}, err
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return ingestState{}, err
	}
	return ingestState{ackPending: info.NumAckPending, pending: int(info.NumPending),
		acked: int(info.Delivered.Stream) - info.NumAckPending}, nil
}

// ---------------------------------------------------------------------------
// the end of a scenario

// settle waits until the scenario is quiet: every sent message has a copy
// at the sink, Redis holds nothing, the ingest has nothing pending, and the
// collector has read the whole sink stream (so late duplicates are counted).
func (w *world) settle(timeout time.Duration) bool {
	w.t.Helper()
	_, order, _ := w.pub.snapshot()
	ok := await(timeout, func() bool {
		if w.col.delivered(order) < len(order) {
			return false
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		s, err := readRedisState(ctx, w.rdb)
		if err != nil || s.parked > 0 {
			return false
		}
		if w.in != nil {
			is, err := w.ingestState()
			if err != nil || is.ackPending > 0 || is.pending > 0 {
				return false
			}
		}
		if w.kafka != nil {
			if lag, err := w.kafkaLag(w.parts); err != nil || lag > 0 {
				return false
			}
		}
		if w.rabbitIn != nil {
			if ready, unacked, err := w.queueDepth(); err != nil || ready+unacked > 0 {
				return false
			}
		}
		return w.col.caughtUp(ctx)
	})
	if ok {
		w.logf("settled: every message delivered, redis empty, ingest drained")
	} else {
		w.logf("NOT settled within %v", timeout)
	}
	return ok
}

// finish computes the scenario's numbers, fills its result row and checks
// the guarantees: nothing lost (unless allowLoss), nothing early, no dead
// message, and duplicates within dupBound (when >= 0).
func (w *world) finish(allowLoss bool) *result {
	w.t.Helper()
	sentMap, order, pubRetries := w.pub.snapshot()
	copies := w.col.snapshot()
	r := w.res
	r.Sent = len(order)
	var late []time.Duration
	var lost []string
	for _, id := range order {
		cs := copies[id]
		if len(cs) == 0 {
			lost = append(lost, id)
			continue
		}
		r.Delivered++
		r.Dups += len(cs) - 1
		if len(cs) > 1 {
			r.DupIDs = append(r.DupIDs, id)
		}
		first := cs[0]
		highest := first.attempt
		for _, c := range cs[1:] {
			if c.attempt > highest {
				r.DupLaterAttempt++
				highest = c.attempt
			} else {
				r.DupSameAttempt++
			}
		}
		for _, c := range cs {
			if c.at.Before(c.due) {
				r.Early++
			}
		}
		late = append(late, first.at.Sub(first.due))
	}
	for id := range copies {
		if _, ok := sentMap[id]; !ok {
			r.Unknown++
		}
	}
	// The doomed messages must be in the dead set, not delivered; one in
	// neither is lost. Any other dead message is a failure.
	doomed := w.pub.doomedSent()
	r.Sent += len(doomed)
	rs, rsErr := readRedisState(context.Background(), w.rdb)
	deadDoomed, deliveredDoomed := 0, 0
	for id := range doomed {
		switch {
		case rs.deadIDs[id]:
			deadDoomed++
		case len(copies[id]) > 0:
			deliveredDoomed++
		default:
			lost = append(lost, id)
		}
	}
	// A message whose cancel was answered 204 is never published after
	// the answer (the contract's "Cancel means never published" and "A
	// lease is a fence"). A copy stamped with the time its publish began
	// (publishBeganHeader) is judged by that: a publish the daemon began
	// before the cancel and the broker stored after it (a frozen client's
	// buffer sent at the thaw, a broker slow to store) began while the
	// message was the daemon's to publish. An unstamped copy is judged by
	// when the sink stored it.
	storedLate, lag := 0, time.Duration(0)
	for id, at := range w.pub.cancelledAt() {
		for _, c := range copies[id] {
			began := c.began
			if began.IsZero() {
				began = c.at
			}
			switch {
			case !began.Before(at):
				w.t.Errorf("%s was published at %v (its publish began at %v), after its cancel at %v", id,
					c.at.Format(time.RFC3339Nano), began.Format(time.RFC3339Nano), at.Format(time.RFC3339Nano))
			case !c.at.Before(at):
				storedLate++
				lag = max(lag, c.at.Sub(began))
			}
		}
	}
	if storedLate > 0 {
		r.note("%d cancelled messages were stored by the sink after the cancel, their publish begun before it (stored up to %v after it began)", storedLate, lag.Round(time.Millisecond))
	}
	if n := w.col.redeliveredCount(); n > 0 {
		r.note("the collector left out %d copies RabbitMQ gave it again after the restart (received by it, not yet acked at the stop; redelivered, same attempt)", n)
	}
	if deliveredDoomed > 0 {
		w.t.Errorf("%d messages meant to die were delivered", deliveredDoomed)
	}
	r.Lost = len(lost)
	r.LostIDs = lost
	r.PublisherRetries = pubRetries
	sort.Slice(late, func(i, j int) bool { return late[i] < late[j] })
	if len(late) > 0 {
		r.P50Late = late[len(late)/2]
		r.P99Late = late[min(len(late)-1, len(late)*99/100)]
		r.MaxLate = late[len(late)-1]
	}
	if rsErr == nil {
		r.DeadLeft = rs.dead
		r.ParkedLeft = rs.parked
	}
	w.logf("sent %d, delivered %d, lost %d, duplicates %d (higher attempt %d, same attempt %d; bound %d), early %d, lateness p50 %v p99 %v max %v",
		r.Sent, r.Delivered, r.Lost, r.Dups, r.DupLaterAttempt, r.DupSameAttempt, r.DupBound, r.Early, r.P50Late, r.P99Late, r.MaxLate)

	if r.Lost > 0 && !allowLoss {
		w.t.Errorf("%d of %d messages lost; first: %v", r.Lost, r.Sent, first(lost, 20))
		w.explainLost(lost)
	}
	if r.Early > 0 {
		w.t.Errorf("%d copies were published before their due time", r.Early)
	}
	if r.Unknown > 0 {
		w.t.Errorf("%d IDs at the sink were never sent", r.Unknown)
	}
	if r.DeadLeft > deadDoomed {
		w.t.Errorf("%d messages are dead (%d of them meant to die)", r.DeadLeft, deadDoomed)
	}
	if r.DupBound >= 0 && r.Dups > r.DupBound {
		w.t.Errorf("%d duplicates, more than the %d in flight at the faults", r.Dups, r.DupBound)
	}
	return r
}

// explainLost logs what Redis knows of some lost messages.
func (w *world) explainLost(ids []string) {
	ctx := context.Background()
	keys := store.NewKeys(keyPrefix)
	for _, id := range first(ids, 5) {
		sh := shardOf(id)
		inPool, _ := w.rdb.HExists(ctx, keys.Pool(sh), id).Result()
		var where []string
		for _, set := range stateSets(keys, sh) {
			if score, err := w.rdb.ZScore(ctx, set.key, id).Result(); err == nil {
				where = append(where, fmt.Sprintf("%s %.2f", set.key, score))
			}
		}
		meta, _ := w.rdb.HGet(ctx, keys.Meta(sh), id).Result()
		w.logf("lost %s: shard %d, in pool %v, in %v, meta %q", id, sh, inPool, where, meta)
	}
}

// shardOf is docs/store.md's FNV-1a (32 bit) of the ID modulo the shard count.
func shardOf(id string) int {
	var h uint32 = 2166136261
	for i := 0; i < len(id); i++ {
		h ^= uint32(id[i])
		h *= 16777619
	}
	return int(h % shards)
}

func first(s []string, n int) []string { return s[:min(n, len(s))] }
