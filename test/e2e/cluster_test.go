package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// TestRedisClusterEndToEnd runs the daemon on a 3-master Redis Cluster: the
// 16 shards spread over the masters, every script stays in one slot, and a
// master restarted mid-run (its slots unavailable meanwhile) loses nothing.
func TestRedisClusterEndToEnd(t *testing.T) {
	t.Parallel() // servers of its own, no timing bound (harness_test.go)
	cluster := testenv.RedisCluster(t, 3)
	ns := testenv.NATS(t)
	nc, err := nats.Connect(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	for name, subj := range map[string]string{"DELAYED": "delayed.>", "FIRED": "fired.>"} {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subj}}); err != nil {
			t.Fatal(err)
		}
	}
	fired := make(chan string, 10000)
	var firedN atomic.Int64
	cons, _ := js.OrderedConsumer(ctx, "FIRED", jetstream.OrderedConsumerConfig{})
	cc, err := cons.Consume(func(m jetstream.Msg) {
		firedN.Add(1)
		fired <- m.Headers().Get(envelope.HeaderMessageID)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()

	d := startDaemon(t, fmt.Sprintf(`
redis: {addrs: ["%s"], cluster: true, key_prefix: e2e, read_timeout: 1s, dial_timeout: 1s}
admin: {listen: "%%ADMIN%%"}
scheduler: {max_sleep: 250ms, backoff: {initial: 100ms, max: 1s}}
ingest:
  - name: in
    nats: {url: "%s", subject: "delayed.>", stream: DELAYED}
    route: {sink: out, destination: fired.x}
sinks:
  - name: out
    nats: {url: "%s", jetstream: true}
`, strings.Join(cluster.Addrs, `", "`), ns.URL, ns.URL))

	publish := func(id string, delay int) {
		m := nats.NewMsg("delayed.x")
		m.Header.Set("x-delay", strconv.Itoa(delay))
		m.Header.Set("x-message-id", id)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]bool{}
	for i := 0; i < 300; i++ {
		id := fmt.Sprintf("c-%03d", i)
		want[id] = true
		publish(id, 1000+rand.IntN(3000))
	}
	// All parked (or, on a machine slow enough to take a second, parked and
	// fired already) before a master stops.
	testenv.Eventually(t, 10*time.Second, func() bool { return d.stats().Parked+firedN.Load() >= 300 }, "not all parked")

	// Every master holds some shards.
	for i, node := range cluster.Nodes {
		n, err := node.Client().DBSize(ctx).Result()
		if err != nil || n == 0 {
			t.Errorf("master %d holds %d keys (%v): shards not spread", i, n, err)
		}
	}

	// Restart a master while messages come due; more arrive meanwhile.
	victim := cluster.Nodes[1]
	victim.Stop()
	for i := 300; i < 400; i++ {
		id := fmt.Sprintf("c-%03d", i)
		want[id] = true
		publish(id, rand.IntN(2000))
	}
	victim.Start()
	cluster.WaitHealthy(30 * time.Second)

	got := map[string]int{}
	deadline := time.After(60 * time.Second)
	for len(got) < len(want) {
		select {
		case id := <-fired:
			got[id]++
		case <-deadline:
			var missing []string
			for id := range want {
				if got[id] == 0 {
					missing = append(missing, id)
				}
			}
			t.Fatalf("%d of %d delivered; missing %v", len(got), len(want), missing)
		}
	}
	dups := 0
	for _, n := range got {
		dups += n - 1
	}
	t.Logf("cluster: %d delivered, %d duplicates across the master restart", len(got), dups)
}

// TestReadyWhileAReplicaHangs: a replica that hangs (SIGSTOP) leaves a
// cluster whose masters all answer, and the daemon ready. /readyz read the
// masters' eviction policy, and go-redis looks the masters up first from a
// node taken at random: one probe in four or so waited on the hung replica
// past its time and answered 503 ("read the layout ... context deadline
// exceeded").
func TestReadyWhileAReplicaHangs(t *testing.T) {
	t.Parallel() // servers of its own, no timing bound (harness_test.go)
	cluster := testenv.RedisCluster(t, 3)
	replica := cluster.AddReplica(cluster.Nodes[0])
	ns := testenv.NATS(t)
	d := startDaemon(t, fmt.Sprintf(`
redis: {addrs: ["%s"], cluster: true, key_prefix: e2e, read_timeout: 1s, dial_timeout: 1s}
admin: {listen: "%%ADMIN%%"}
ingest:
  - name: in
    nats: {url: "%s", subject: "delayed.>"}
    route: {sink: out, destination: fired.x}
sinks:
  - name: out
    nats: {url: "%s"}
`, strings.Join(cluster.Addrs, `", "`), ns.URL, ns.URL))
	replica.Signal(syscall.SIGSTOP)
	defer replica.Signal(syscall.SIGCONT)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for i := 0; i < 30; i++ {
		if code, body := d.get("/readyz", nil); code != http.StatusOK {
			t.Fatalf("probe %d with a replica hung: /readyz %d %s", i, code, body)
		}
		<-tick.C
	}
}
