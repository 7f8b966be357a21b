//go:build fault

package fault

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// scaledOutage is an outage of d at full scale, shorter at a smaller -scale
// but never under lo.
func scaledOutage(d, lo time.Duration) time.Duration {
	return max(lo, time.Duration(math.Round(float64(d)**flagScale/float64(time.Second)))*time.Second)
}

var sinkKinds = map[string]string{"nats": "NATS JetStream", "rabbitmq": "RabbitMQ", "kafka": "Kafka (kfake)"}

// TestSinkStoppedNATS, TestSinkStoppedRabbitMQ and TestSinkStoppedKafka
// stop the sink's broker for longer than the whole retry budget while
// messages come due throughout, with a short retry budget: max_attempts 3,
// back-off 100-300 ms (a budget of about 3.3 s with publish_timeout 1 s).
// Guarantee: a publish that fails because the sink is unreachable does not
// count toward max_attempts; the sink's due messages wait in Redis (held,
// not claimed over and over) and flow again when it is back: 0 dead, 0
// lost. Duplicates need a failed publish whose message reached the broker
// anyway (bounded by the failed attempts the daemon counts); the claims in
// flight when the stop began are reported beside them.
func TestSinkStoppedNATS(t *testing.T)     { testSinkStopped(t, "nats") }
func TestSinkStoppedRabbitMQ(t *testing.T) { testSinkStopped(t, "rabbitmq") }
func TestSinkStoppedKafka(t *testing.T)    { testSinkStopped(t, "kafka") }

func testSinkStopped(t *testing.T, kind string) {
	w := newWorld(t, "sink-stopped-"+kind, options{sink: kind, retry: shortRetry})
	outage := scaledOutage(12*time.Second, 2*retryBudget)
	w.res.Fault = fmt.Sprintf("%s sink broker stopped %v while claiming a burst (retry budget ~%v: max_attempts 3, back-off 100-300 ms) while messages come due, then started",
		sinkKinds[kind], outage, retryBudget.Round(100*time.Millisecond))
	d := w.startDaemon()
	n := scaled(perScenario)
	done := w.pub.stream(w.ctx, 0, n, rate)
	w.hold(2*time.Second, "traffic before the fault (scenario parameter)")
	// The stop comes as soon as the claims of a burst of messages that
	// came due show in Redis: publishes are under way on every shard.
	at := w.burst(n, 1500*time.Millisecond)
	w.atBurst(at, n)
	before := w.redisState()
	down := time.Now()
	w.stopSink()
	w.logf("sink broker stopped in %v (%d claims in flight when the stop began)", time.Since(down).Round(time.Millisecond), before.inflight)
	notReady := await(10*time.Second, func() bool { code, _ := d.get("/readyz"); return code == http.StatusServiceUnavailable })
	w.hold(outage-time.Since(down), "the sink's broker is stopped (the fault)")
	during := w.redisState()
	deadDuring := d.metric("delaybridge_dead_total")
	w.startSink()
	away := time.Since(down)
	w.logf("sink broker started again after %v; during the outage Redis held %d parked messages, %d dead", away.Round(10*time.Millisecond), during.parked, during.dead)
	w.waitPublished(done)
	w.settle(settleFor)
	errs := d.metric("delaybridge_sink_publish_errors_total")
	retries := d.metric("delaybridge_retries_total")
	held := d.metric("delaybridge_sink_held_total")
	dead := d.metric("delaybridge_dead_total", `source="sink"`)
	w.res.DupBound = int(errs)
	w.res.note("broker away %v in all (stop to started); %d claims in flight when the stop began; /readyz 503 during the outage: %v; "+
		"%0.f failed publish attempts (the dup bound), %0.f held for the sink (attempt not counted), %0.f retries counted, delaybridge_dead_total{source=\"sink\"} %0.f",
		away.Round(100*time.Millisecond), before.inflight, notReady, errs, held, retries, dead)
	if !notReady {
		t.Errorf("/readyz did not report the sink outage")
	}
	if deadDuring > 0 || dead > 0 {
		t.Errorf("messages died because the sink was down: %0.f during the outage, delaybridge_dead_total{source=\"sink\"} %0.f at the end", deadDuring, dead)
	}
	r := w.finish(false)
	if r.MaxLate < outage/2 {
		t.Errorf("max lateness %v: the outage seems not to have delayed anything", r.MaxLate)
	}
}

// TestRedisNetworkCut cuts the network between the daemon and Redis (a TCP
// proxy closes every connection and refuses new ones) for 10 s, at the
// moment the daemon claims a burst of messages that came due: scripts are
// under way, some of them run by Redis with their replies lost. Redis
// itself keeps running. Guarantee: nothing is acknowledged to the ingest
// that is not parked, nothing is lost; a park whose reply was lost makes
// the ingest deliver the message again, which parks as a no-op (or is a
// duplicate within the dedupe window when it was delivered meanwhile); a
// claim whose ack was lost is published again after its lease.
func TestRedisNetworkCut(t *testing.T) {
	w := newWorld(t, "redis-network-cut", options{redisProxy: true})
	outage := scaledOutage(10*time.Second, 5*time.Second)
	w.res.Fault = fmt.Sprintf("network between the daemon and Redis cut %v (TCP proxy) while claiming a burst; Redis keeps running", outage)
	d := w.startDaemon()
	n := scaled(perScenario)
	done := w.pub.stream(w.ctx, 0, n, rate)
	w.hold(w.randDur(2*time.Second, 4*time.Second), "traffic before the fault (scenario parameter)")
	at := w.burst(n, 1500*time.Millisecond)
	w.atBurst(at, n)
	cut := time.Now()
	w.proxy.Down(w.t)
	st := w.redisState() // the test's own client reaches Redis directly
	w.logf("network to Redis cut: %d claims in flight", st.inflight)
	notReady := await(5*time.Second, func() bool { code, _ := d.get("/readyz"); return code == http.StatusServiceUnavailable })
	a1, err := w.ingestState()
	if err != nil {
		t.Fatal(err)
	}
	w.hold(outage-time.Since(cut), "the network to Redis is cut (the fault)")
	a2, err := w.ingestState()
	if err != nil {
		t.Fatal(err)
	}
	w.proxy.Up(w.t)
	w.logf("network to Redis back after %v; the ingest acknowledged %d -> %d meanwhile", time.Since(cut).Round(10*time.Millisecond), a1.acked, a2.acked)
	if a2.acked != a1.acked {
		t.Errorf("the ingest acknowledged %d messages while Redis was unreachable", a2.acked-a1.acked)
	}
	w.waitPublished(done)
	w.settle(settleFor)
	redeliveries := int(math.Ceil(float64(outage)/float64(ackWait))) + 1
	w.res.DupBound = st.inflight + maxInFlight*redeliveries
	dupParks := d.metric("delaybridge_ingest_messages_total", `result="duplicate"`)
	w.res.note("%d claims in flight at the cut; /readyz 503 during the cut: %v; ingest acknowledged count unchanged during the cut (%d -> %d); %0.f re-reads acknowledged as duplicates (already parked or delivered)",
		st.inflight, notReady, a1.acked, a2.acked, dupParks)
	w.finish(false)
}

// TestSentinelFailover runs Redis as a master with one replica, both with
// appendfsync everysec, and a Sentinel (down-after 1 s); the daemon finds
// the master through the Sentinel. The master is SIGKILLed while a burst is
// being parked at full speed, and not restarted: the Sentinel promotes the
// replica. Replication is asynchronous, so parks the master acknowledged
// (and the daemon then acknowledged to the ingest) that had not reached the
// replica are lost: the scenario counts them and does not fail on them, but
// each must have been confirmed by the ingest shortly before the kill.
func TestSentinelFailover(t *testing.T) {
	w := newWorld(t, "sentinel-failover-everysec", options{fsync: "everysec", sentinel: true})
	w.res.Fault = "Redis master (appendfsync everysec, one replica, Sentinel) SIGKILLed while a burst is parked; the replica promoted"
	d := w.startDaemon()
	n := scaled(perScenario)
	done := w.pub.stream(w.ctx, 0, n, rate)
	w.hold(w.randDur(2*time.Second, 4*time.Second), "traffic before the fault (scenario parameter)")
	burstDone := w.burstAsync(n, 5*time.Second)
	w.hold(100*time.Millisecond, "the burst is being parked (scenario parameter)")
	killed := time.Now()
	w.redis.Kill()
	// What the replica holds now is what the promoted master starts with.
	rep := w.replica.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	st, err := readRedisState(ctx, rep)
	cancel()
	if err != nil {
		t.Fatalf("reading the replica: %v", err)
	}
	w.logf("master killed; the replica holds %d parked, %d claims in flight", st.parked, st.inflight)
	sc := w.sentinel.Client()
	promoted := await(30*time.Second, func() bool {
		addr, err := sentinelMasterAddr(sc)
		return err == nil && addr == w.replica.Addr
	})
	failover := time.Since(killed)
	if !promoted {
		t.Fatalf("the Sentinel did not promote the replica within 30 s")
	}
	w.logf("the Sentinel promoted the replica %v after the kill", failover.Round(10*time.Millisecond))
	resumed := await(30*time.Second, func() bool { code, _ := d.get("/readyz"); return code == http.StatusOK })
	w.waitPublished(done)
	w.waitPublished(burstDone)
	w.settleAllowingLoss(settleFor)
	w.res.DupBound = st.inflight + maxInFlight
	r := w.finish(true)
	sentMap, _, _ := w.pub.snapshot()
	var worst time.Duration
	for _, id := range r.LostIDs {
		worst = max(worst, killed.Sub(sentMap[id].at))
	}
	w.res.note("the replica was promoted %v after the kill; the daemon ready again: %v; %d claims in flight on the replica at the kill", failover.Round(100*time.Millisecond), resumed, st.inflight)
	if r.Lost == 0 {
		w.res.note("0 parked-and-acknowledged messages lost: every park the master acknowledged had reached the replica (asynchronous replication on loopback lags by well under a millisecond; across a network the window is the replication lag)")
	} else {
		w.res.note("%d parked-and-acknowledged messages lost with the master (not yet replicated); the oldest was confirmed by the ingest %v before the kill (the loss window)", r.Lost, worst)
	}
	if worst > 5*time.Second {
		t.Errorf("a message confirmed %v before the kill was lost: more than asynchronous replication explains", worst)
	}
}

// sentinelMasterAddr asks a Sentinel for the master's address.
func sentinelMasterAddr(c *redis.Client) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	hp, err := c.Do(ctx, "SENTINEL", "get-master-addr-by-name", sentinelMaster).StringSlice()
	if err != nil || len(hp) != 2 {
		return "", fmt.Errorf("sentinel: %v %v", hp, err)
	}
	return net.JoinHostPort(hp[0], hp[1]), nil
}

// TestClockSkew runs three daemons on one Redis and one JetStream durable
// consumer: one with the right clock, one whose own clock is 5 minutes
// ahead and one 5 minutes behind (the faultinject build's
// DELAYBRIDGE_FAULT_CLOCK_SKEW: Go reads the vDSO clock, which no outside
// tool can skew). Every fourth message is scheduled through POST
// /v1/messages of the daemon ahead, every fourth through the one behind
// (their delay counts from the moment of ingest, read on the daemon's
// clock); the others come through the ingest (their delay counts from the
// JetStream publish time). Guarantee: due times follow Redis's clock, so
// every due time the daemons name is the sender's send time plus the delay
// (within the send's round trip), nothing is published before it, and
// nothing later than the usual bound.
func TestClockSkew(t *testing.T) {
	// A daemon that used its own clock would be 5 min off; the bounds are a
	// tenth of that, so that no load on the machine (a due time is the
	// ingest's moment, up to a confirm's latency before the send is
	// confirmed; the firing is as late as the CPUs let it be) passes for a
	// leak, and no leak passes for load.
	const (
		skew  = 5 * time.Minute
		bound = skew / 10
	)
	w := newWorld(t, "clock-skew-5m", options{})
	w.res.Fault = "three daemons share Redis and the ingest: one with the right clock, one 5 min ahead, one 5 min behind (faultinject build); a quarter of the messages POSTed to each skewed one"
	bin := testenv.BuildTagged(t, "faultinject")
	w.startDaemonWith(bin)
	ahead := w.startDaemonWith(bin, fmt.Sprintf("%s=%s", "DELAYBRIDGE_FAULT_CLOCK_SKEW", skew))
	behind := w.startDaemonWith(bin, fmt.Sprintf("%s=%s", "DELAYBRIDGE_FAULT_CLOCK_SKEW", -skew))
	for _, d := range []*daemon{ahead, behind} {
		// The daemon measured its offset to Redis's clock: the skew.
		d.proc.WaitOutput(10*time.Second, "due times follow redis's clock")
	}
	natsSend := w.pub.send
	w.pub.send = func(ctx context.Context, id string, delay time.Duration, at time.Time) error {
		switch indexOf(id) % 4 {
		case 1:
			return ahead.postMessage(ctx, id, delay)
		case 3:
			return behind.postMessage(ctx, id, delay)
		}
		return natsSend(ctx, id, delay, at)
	}
	n := scaled(perScenario)
	done := w.pub.stream(w.ctx, 0, n, rate)
	w.waitPublished(done)
	w.settle(settleFor)
	w.res.DupBound = 0
	sentMap, order, _ := w.pub.snapshot()
	copies := w.col.snapshot()
	var worst [2]time.Duration // |named due time - (confirmed send + delay)|: via the ingest, via POST
	off := 0
	for _, id := range order {
		cs := copies[id]
		if len(cs) == 0 {
			continue
		}
		s := sentMap[id]
		d := cs[0].due.Sub(s.at.Add(s.delay))
		if d < 0 {
			d = -d
		}
		k := 0
		if indexOf(id)%2 == 1 {
			k = 1
		}
		worst[k] = max(worst[k], d)
		if d > bound {
			off++
		}
	}
	w.res.note("the skewed daemons measured their offset to Redis (-5m, +5m) and said so at start; named due time minus (send confirmed + delay): at most %v through the ingest, %v through POST on the skewed daemons",
		dur(worst[0]), dur(worst[1]))
	if off > 0 {
		t.Errorf("%d messages got a due time more than %v away from their send time plus delay: a daemon's own clock leaked into it", off, bound)
	}
	r := w.finish(false)
	if r.MaxLate > bound {
		t.Errorf("a message was published %v after its due time, more than %v: a daemon's own clock leaked into when it fires", r.MaxLate, bound)
	}
}

// indexOf is the number at the end of a publisher's ID.
func indexOf(id string) int {
	n, _ := strconv.Atoi(id[strings.LastIndexByte(id, '-')+1:])
	return n
}

// postMessage schedules a message through POST /v1/messages, to the sink
// "out" and the route's destination, with the delay in ms.
func (d *daemon) postMessage(ctx context.Context, id string, delay time.Duration) error {
	body, _ := json.Marshal(map[string]any{"id": id, "delay": delay.Milliseconds(), "sink": "out", "destination": "fired.fault", "body": id})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.admin+"/v1/messages", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("POST /v1/messages: %d %s", resp.StatusCode, b)
	}
	return nil
}

// TestDeadLetterSinkDown configures a dead-letter sink (dead.sink, a NATS
// server of its own) and stops it while messages die: one in twenty is
// rejected at ingest (an unparsable x-delay), one in twenty is refused by
// the sink (a destination no stream stores: 3 attempts, then dead).
// Guarantee: every dying message is kept in Redis's dead set whatever the
// dead-letter sink does, nothing else is lost or dies; the dead-letter
// copies are best effort: the scenario reports how many the daemon had
// confirmed and how many reached the dead-letter stream once its server
// was back.
func TestDeadLetterSinkDown(t *testing.T) {
	dl := testenv.NATS(t)
	djs := connectJetStream(t, dl.URL, "fault dead-letter reader")
	if _, err := djs.CreateStream(context.Background(), jetstream.StreamConfig{
		Name: "DEAD", Subjects: []string{"dead.>"}, Storage: jetstream.FileStorage, Duplicates: 100 * time.Millisecond,
	}); err != nil {
		t.Fatal(err)
	}
	w := newWorld(t, "dead-letter-sink-down", options{retry: shortRetry, route: ", allow_override: true",
		extra: fmt.Sprintf("  - name: dl\n    nats: {url: %q, jetstream: true}\ndead: {sink: dl, destination: dead.fault}\n", dl.URL)})
	w.res.Fault = "dead-letter sink (NATS) stopped while 1 in 10 messages dies (rejected at ingest, or refused by the sink 3 times); started after"
	w.pub.headers = func(id string) map[string]string {
		switch indexOf(id) % 20 {
		case 7:
			w.pub.doom(id, "ingest")
			return map[string]string{envelope.HeaderDelay: "soon"}
		case 17:
			w.pub.doom(id, "sink")
			return map[string]string{envelope.HeaderDestination: "nostream.fault"}
		}
		return nil
	}
	d := w.startDaemon()
	dl.Shutdown()
	w.logf("dead-letter sink's server shut down")
	n := scaled(perScenario)
	done := w.pub.stream(w.ctx, 0, n, rate)
	w.waitPublished(done)
	w.settle(settleFor)
	doomed := w.pub.doomedSent()
	byHow := map[string]int{}
	for _, how := range doomed {
		byHow[how]++
	}
	letters := d.metric("delaybridge_dead_letters_total", `result="ok"`)
	failed := d.metric("delaybridge_dead_letters_total", `result="error"`)
	deadIngest := d.metric("delaybridge_dead_total", `source="ingest"`)
	deadSink := d.metric("delaybridge_dead_total", `source="sink"`)
	dl.Restart()
	w.logf("dead-letter sink's server started again")
	// An observation window, not synchronisation: copies a client buffered
	// while disconnected would arrive now.
	var stored uint64
	await(time.Second, func() bool {
		s, err := djs.Stream(context.Background(), "DEAD")
		if err != nil {
			return false
		}
		info, err := s.Info(context.Background())
		if err != nil {
			return false
		}
		stored = info.State.Msgs
		return int(stored) >= len(doomed)
	})
	w.res.note("%d messages died (%d rejected at ingest, %d refused by the sink), delaybridge_dead_total ingest %0.f / sink %0.f, all kept in Redis's dead set; dead-letter copies confirmed %0.f, failed %0.f while its server was down; %d copies in the dead-letter stream after it came back",
		len(doomed), byHow["ingest"], byHow["sink"], deadIngest, deadSink, letters, failed, stored)
	w.finish(false)
}
