//go:build fault

package fault

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/delaybridge/delaybridge/pkg/ingest"
)

// TestPartitionOneOfTwoNATS, TestPartitionOneOfTwoKafka and
// TestPartitionOneOfTwoRabbitMQ run two daemons on one Redis and one ingest
// (a JetStream durable consumer, a Kafka consumer group, a RabbitMQ queue)
// and cut one of them off from Redis (a TCP proxy between it and Redis closes
// its connections and refuses new ones) for longer than the lease, as soon as
// the claims of a burst that came due show in Redis; the other keeps its
// connection. Messages go on arriving throughout.
//
// Guarantee: the cut instance hands its work back: it stops
// taking ingest messages and returns those it holds unparked (JetStream Nak,
// AMQP requeue, Kafka: it leaves the group, which gives its partitions to the
// other member), so the connected instance parks them; its claims come back
// to the other when their lease expires. Nothing is lost; every message is
// delivered within partitionBound of its due time, wherever it was when the
// cut began; duplicates are at most what was in flight at the cut (the
// claims held, and the ingest messages taken and not yet acknowledged).
//
// The scenario records, beside the usual figures, what the daemons held
// unacknowledged during the cut (JetStream: the durable's NumAckPending;
// RabbitMQ: the queue's unacknowledged messages; Kafka: the group's
// uncommitted records), and how many messages were later than the bound.
// The broker does not say which instance holds what: the connected one
// acknowledges within milliseconds when the machine is quiet, so the count is
// then the cut one's, but under a burst it holds hundreds itself for a
// moment, so the count is reported, not asserted (the lateness is what
// shows a hold). rabbitmqctl takes 1-3 s a reading here, so RabbitMQ gets
// few samples.

// readinessFailures is when an orchestrator takes an instance out: this
// many /readyz answers in a row not 200 (failureThreshold of the
// readinessProbe in deploy/kubernetes/deployment.yaml). One slow answer
// (a Redis PING past /readyz's 1 s on a machine running make test's other
// jobs) is not an instance that went unready.
const readinessFailures = 3

func TestPartitionOneOfTwoNATS(t *testing.T)     { testPartition(t, "nats") }
func TestPartitionOneOfTwoKafka(t *testing.T)    { testPartition(t, "kafka") }
func TestPartitionOneOfTwoRabbitMQ(t *testing.T) { testPartition(t, "rabbitmq") }

var ingestKinds = map[string]string{"nats": "NATS JetStream", "kafka": "Kafka (kfake)", "rabbitmq": "RabbitMQ"}

// partitionAckWait is the JetStream ack_wait of the partition scenarios: the
// default's order of magnitude (30 s), not the suite's 2 s, which would make
// JetStream redeliver the cut instance's messages after 2 s by itself and
// hide whether the daemon hands them back.
const partitionAckWait = 30 * time.Second

// partitionBound is how late a message may be published during the cut,
// asserted for every message, term by term:
//
//   - the later of the lease and the hand-back: a claim of the cut instance
//     comes back to the other when its lease (2 s) expires; a message the cut
//     instance holds unparked is handed back at its first failed park at
//     least ingest.DefaultHandBackAfter (2 s) after the first failure, and its
//     park retries back off doubling from 50 ms (±25%), so the step that
//     straddles it ends by twice that;
//   - 1 s (the Redis read_timeout): the cut instance learns of the cut at its
//     next Redis call; one under way when the cut began fails after at most
//     read_timeout (here the proxy closes the connection, so at once);
//   - the hand-back itself and the redelivery: the source is released
//     (JetStream stops its pull and naks, AMQP closes the channel), the
//     broker delivers the messages to the other instance, which parks them:
//     750 ms (measured: what was held is gone within 0.5 s of the release),
//     or, when longer, the time the connected instance takes to park
//     max_in_flight messages at half the two instances' rate in the probe
//     (parkRate): make test runs this beside other packages' tests on two
//     cores, where one instance parks a few hundred a second;
//   - 250 ms (scheduler.max_sleep): the connected instance's shard loop sees
//     an expired lease, or a message another instance parked, at its next
//     wake-up;
//   - 1 s of noise: this 2-core machine, shared with the brokers, Redis and
//     the test itself, fires a fault-free scenario with a p99 of 0.1-0.25 s
//     and a worst case of 0.6 s (docs/reliability.md's table); 1 s covers that
//     with room to spare on a slower machine;
//   - for Kafka, 4 s more: the cut member leaves the group when kafka-go
//     has ended its generation, which waits up to the source's revoke drain
//     (3 s, pkg/brokers/kafkabroker) for the records it handed out, the very
//     ones being handed back; then the other member sees the rebalance at its
//     next heartbeat (200 ms here), joins and syncs (1 s, measured under
//     0.5 s here), and takes the partitions from their committed offsets.
//
// probe is what the two instances parked per second before the cut
// (parkRate).
func partitionBound(kind string, probe float64) time.Duration {
	handOver := max(750*time.Millisecond, time.Duration(float64(maxInFlight)/(probe/2)*float64(time.Second)))
	b := max(lease, 2*ingest.DefaultHandBackAfter) + time.Second + handOver + 250*time.Millisecond + time.Second
	if kind == "kafka" {
		b += 3*time.Second + time.Second
	}
	return b
}

func testPartition(t *testing.T, kind string) {
	o := options{redisProxy: true, ackWait: partitionAckWait}
	switch kind {
	case "kafka":
		o.kafka = true
	case "rabbitmq":
		o.rabbitIn = true
	}
	w := newWorld(t, "partition-one-of-two-"+kind, o)
	a := w.startDaemon() // through the proxy: the one that is cut off
	b := w.startDaemonDirect()
	if kind == "kafka" {
		// Both members must own partitions before the cut, or the cut one
		// would hold nothing of the ingest.
		if !await(30*time.Second, func() bool { m, err := w.kafkaAssignment(); return err == nil && len(m) == 2 }) {
			t.Fatalf("the two daemons did not share the Kafka group's partitions within 30 s")
		}
		m, _ := w.kafkaAssignment()
		w.logf("the group's partitions by member: %v", m)
	}
	// The guarantee is that the connected instance takes the cut one's
	// work, which it can only do with the CPU for it: what the machine
	// gives the two now is measured, and the traffic is the suite's rate or
	// a quarter of the measured one, whichever is less (make test with the
	// other core busy once gave them so little that the ingest was
	// max_in_flight behind before the cut, and the connected one, alone
	// after it, fell seconds behind: 1,213 messages later than the bound).
	probe := w.parkRate(0, a, b)
	bound := partitionBound(kind, probe)
	streamRate := min(rate, max(50, int(probe/4)))
	// Longer than the bound by a second or more at any scale, so that a cut
	// instance that keeps what it holds for the whole cut is caught: a
	// message it read as the cut began with a delay under a second (a fifth
	// of them are) is then later than the bound.
	cut := scaledOutage(12*time.Second, (bound+2*time.Second-1)/time.Second*time.Second)
	w.res.Fault = fmt.Sprintf("two daemons share Redis and a %s ingest; one cut off from Redis %v (TCP proxy; lease %v) while claiming a burst, messages arriving throughout (%d/s)",
		ingestKinds[kind], cut, lease, streamRate)
	// The burst's due time, after it is all published, is the traffic
	// before the cut: kafka-go produces a record at a time here, and
	// RabbitMQ confirms them one at a time, at 500-1,700 a second beside
	// the stream (up to 2 s for the burst); JetStream in 0.15-0.3 s; and
	// no sooner than 1.5 times the burst at the probe's rate.
	lead := 2500 * time.Millisecond
	if kind != "nats" {
		lead = 5 * time.Second
	}
	lead = max(lead, time.Duration(1.5*burstSize/probe*float64(time.Second)))
	// Messages arrive from the start to a second after the cut ends.
	from := probeSize
	n := streamRate * int((lead+cut+time.Second)/time.Second)
	done := w.pub.stream(w.ctx, from, from+n, streamRate)
	at := w.burst(from+n, lead)
	w.atBurst(at, from+n)
	began := time.Now()
	w.proxy.Down(t)
	st := w.redisState() // the test's own client reaches Redis directly
	w.logf("daemon A cut off from Redis: %d claims in flight", st.inflight)

	// During the cut: what the cut instance holds unparked, sampled about
	// every half second (a RabbitMQ reading takes 1-3 s itself, so none
	// starts that would end after the cut); the two /readyz.
	var (
		heldMax, heldLast int
		heldAt            time.Duration      // when heldMax was seen, from the cut
		releasedAt        time.Duration = -1 // when the held count fell to a tenth of its max, from the cut
		samples           []string
		aNotReady, bReady = false, true
		bFailing          int                // /readyz answers of the connected instance not 200 in a row
		soleOwner         time.Duration = -1 // Kafka: when one member owned every partition
	)
	end := began.Add(cut)
	var sampleCost time.Duration
	w.logf("holding %v, reading the ingest and both /readyz about every 500 ms: daemon A is cut off from Redis (the fault)", cut)
	sampleUntil(end, 500*time.Millisecond, func() {
		if time.Until(end) > sampleCost {
			sampled := time.Now()
			h, what, err := w.heldUnparked()
			sampleCost = time.Since(sampled)
			if err == nil {
				heldLast = h
				if h > heldMax {
					heldMax, heldAt, releasedAt = h, time.Since(began), -1
				} else if releasedAt < 0 && h <= heldMax/10 {
					releasedAt = time.Since(began)
				}
				samples = append(samples, fmt.Sprintf("%s %d", dur(time.Since(began)), h))
			} else {
				w.logf("reading %s: %v", what, err)
			}
		}
		if code, _ := a.get("/readyz"); code == http.StatusServiceUnavailable {
			aNotReady = true
		}
		if code, body := b.get("/readyz"); code != http.StatusOK {
			bFailing++
			bReady = bReady && bFailing < readinessFailures
			w.logf("the connected daemon not ready during the cut (%d in a row): %d %s", bFailing, code, body)
		} else {
			bFailing = 0
		}
		if kind == "kafka" && soleOwner < 0 {
			if m, err := w.kafkaAssignment(); err == nil && len(m) == 1 {
				soleOwner = time.Since(began)
				w.logf("one member owns every partition %v after the cut: %v", soleOwner.Round(10*time.Millisecond), m)
			}
		}
	})
	w.proxy.Up(t)
	w.logf("daemon A's network to Redis back after %v; held unparked: max %d (at %v), %d at the end of the cut",
		time.Since(began).Round(10*time.Millisecond), heldMax, dur(heldAt), heldLast)
	w.waitPublished(done)
	w.settle(settleFor)

	w.res.DupBound = st.inflight + heldMax
	r := w.finish(false)

	// Lateness from the send: the sink's time minus the due time the
	// publisher asked for (its confirm + x-delay, or the burst's
	// x-deliver-at, or the confirm when that is later), or minus the due
	// time the daemon named, whichever is worse; not the named one alone: a
	// RabbitMQ message (no broker timestamp) is named a due time when it is
	// read, so one handed back and read again by the other instance would be
	// named a later one.
	sentMap, order, _ := w.pub.snapshot()
	copies := w.col.snapshot()
	burstIDs := map[string]bool{}
	for _, id := range w.pub.idRange(from+n, from+n+burstSize) {
		burstIDs[id] = true
	}
	var late []time.Duration
	var over []string
	for _, id := range order {
		cs := copies[id]
		if len(cs) == 0 {
			continue
		}
		// Nothing fires before the ingest has it: a burst message confirmed
		// after the burst's instant (its publish outlasted the lead on a
		// loaded machine: 10.6 s for the 1000 once) is due from its confirm,
		// and so is the past due time the daemon names it.
		confirmed := sentMap[id].at
		want := confirmed.Add(sentMap[id].delay)
		if burstIDs[id] {
			want = at
		}
		l := max(cs[0].at.Sub(later(want, confirmed)), cs[0].at.Sub(later(cs[0].due, confirmed)))
		late = append(late, l)
		if l > bound {
			over = append(over, id)
		}
	}
	sort.Slice(late, func(i, j int) bool { return late[i] < late[j] })
	if len(late) > 0 {
		r.P50Late = late[len(late)/2]
		r.P99Late = late[min(len(late)-1, len(late)*99/100)]
		r.MaxLate = late[len(late)-1]
	}
	owner := ""
	switch {
	case kind != "kafka":
	case soleOwner >= 0:
		owner = fmt.Sprintf("; one member owned every partition %v after the cut", dur(soleOwner))
	default:
		owner = "; the cut instance kept its partitions for the whole cut"
	}
	released := "never during the cut"
	if releasedAt >= 0 {
		released = dur(releasedAt) + " into the cut"
	}
	w.res.note("%d claims in flight at the cut; the cut instance held unparked (%s): max %d (%v into the cut), a tenth of that or less %s, %d at its end; samples %s; "+
		"cut instance /readyz 503: %v, connected instance ready throughout (never %d probes in a row not 200): %v%s; "+
		"lateness (columns) from the send (publisher's confirm + x-delay, or x-deliver-at), the worse of that and the named due time; "+
		"%d messages later than the bound %v (the later of the lease and twice the hand-back delay, + margin), worst %v; dup bound = claims in flight + max held",
		st.inflight, w.heldWhat(), heldMax, dur(heldAt), released, heldLast, strings.Join(samples, ", "), aNotReady, readinessFailures, bReady, owner,
		len(over), bound, dur(r.MaxLate))
	w.logf("lateness from the send: p50 %v p99 %v max %v; %d later than %v", r.P50Late, r.P99Late, r.MaxLate, len(over), bound)
	if !aNotReady {
		t.Errorf("the cut instance's /readyz never said 503 during the cut")
	}
	if !bReady {
		t.Errorf("the connected instance's /readyz was not 200 %d times in a row during the cut: an orchestrator would take it out", readinessFailures)
	}
	if len(over) > 0 {
		t.Errorf("%d messages were published more than %v (partitionBound: lease %v or hand-back, + margin) after their due time, worst %v (first: %v); "+
			"the cut instance held up to %d ingest messages unparked (%s)",
			len(over), bound, lease, r.MaxLate, first(over, 5), heldMax, w.heldWhat())
	}
}

// probeSize is how many messages, due at once, measure what the daemons
// park per second (parkRate).
const probeSize = 1000

// probePublishers is how many goroutines publish the probe.
const probePublishers = 8

// parkRate publishes messages [from, from+probeSize), due at once, from
// probePublishers goroutines (one publisher waiting for each confirm
// measured the publisher: 205-414/s here with the other core busy), and
// returns how many of them the daemons ds parked per second, from the first
// publish to the last park (delaybridge_ingest_messages_total{result=
// "parked"} summed over them): what the machine gives them at this moment.
func (w *world) parkRate(from int, ds ...*daemon) float64 {
	w.t.Helper()
	parked := func() float64 {
		var sum float64
		for _, d := range ds {
			sum += max(0, d.metric("delaybridge_ingest_messages_total", `result="parked"`))
		}
		return sum
	}
	base := parked()
	began := time.Now()
	next := atomic.Int64{}
	var wg sync.WaitGroup
	for range probePublishers {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < probeSize && w.ctx.Err() == nil; i = int(next.Add(1)) - 1 {
				w.pub.publish(w.ctx, from+i, began)
			}
		})
	}
	wg.Wait()
	if !await(time.Minute, func() bool { return parked() >= base+probeSize }) {
		w.t.Fatalf("probe: the daemons parked %v of %d messages in a minute", parked()-base, probeSize)
	}
	took := time.Since(began)
	r := probeSize / took.Seconds()
	w.logf("probe: the daemons parked %d messages due at once, published by %d goroutines, in %v (%.0f/s)", probeSize, probePublishers, dur(took), r)
	return r
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// startDaemonDirect is startDaemon for a daemon that connects to Redis
// directly, not through the world's proxy: cutting the proxy leaves it be.
func (w *world) startDaemonDirect() *daemon {
	w.t.Helper()
	via, direct := fmt.Sprintf(`addr: "%s"`, w.proxy.Addr), fmt.Sprintf(`addr: "%s"`, w.redis.Addr)
	if !strings.Contains(w.cfg, via) {
		w.t.Fatalf("startDaemonDirect: the configuration has no %s", via)
	}
	saved := w.cfg
	w.cfg = strings.Replace(w.cfg, via, direct, 1)
	defer func() { w.cfg = saved }()
	return w.startDaemon()
}

// heldUnparked is what the ingest broker says the daemons hold: delivered
// and not acknowledged (JetStream, RabbitMQ), or not committed (Kafka).
func (w *world) heldUnparked() (int, string, error) {
	switch {
	case w.in != nil:
		is, err := w.ingestState()
		return is.ackPending, "JetStream NumAckPending", err
	case w.kafka != nil:
		lag, err := w.kafkaLag(w.parts)
		return int(lag), "Kafka group lag", err
	case w.rabbitIn != nil:
		_, unacked, err := w.queueDepth()
		return unacked, "RabbitMQ unacknowledged", err
	}
	return 0, "", fmt.Errorf("no ingest")
}

func (w *world) heldWhat() string {
	switch {
	case w.in != nil:
		return "the durable's NumAckPending"
	case w.kafka != nil:
		return "the group's uncommitted records"
	default:
		return "the queue's unacknowledged messages"
	}
}

// kafkaAssignment returns, for each member of the daemons' group that owns
// partitions of "delayed", the partitions it owns.
func (w *world) kafkaAssignment() (map[string][]int, error) {
	c := &kafka.Client{Addr: kafka.TCP(w.kafka.Brokers...), Timeout: 3 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	res, err := c.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{"delaybridge"}})
	if err != nil {
		return nil, err
	}
	m := map[string][]int{}
	for _, g := range res.Groups {
		if g.Error != nil {
			return nil, g.Error
		}
		for _, mem := range g.Members {
			for _, tp := range mem.MemberAssignments.Topics {
				if tp.Topic == "delayed" && len(tp.Partitions) > 0 {
					m[mem.MemberID] = append(m[mem.MemberID], tp.Partitions...)
				}
			}
		}
	}
	return m, nil
}
