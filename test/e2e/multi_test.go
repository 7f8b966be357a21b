package e2e

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// TestThreeInstancesShareRedisAndIngest runs three daemons on one Redis and
// one JetStream durable consumer. They share the work; one is killed with
// SIGKILL while holding claims, and the survivors deliver everything once its
// leases expire. Duplicates can only come from the killed instance's claims.
func TestThreeInstancesShareRedisAndIngest(t *testing.T) {
	const sched = ", lease: 2s, publish_timeout: 1s"
	e := newNATSEnv(t, sched, "")
	others := []*daemon{startDaemon(t, e.config(sched)), startDaemon(t, e.config(sched))}

	var ids []string
	for i := 0; i < 600; i++ {
		id := fmt.Sprintf("x-%03d", i)
		ids = append(ids, id)
		e.publish("delayed.m", []byte(id), "x-delay", strconv.Itoa(rand.IntN(3000)), "x-message-id", id)
	}
	// Kill one instance mid-run, claims and all.
	testenv.Eventually(t, 10*time.Second, func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return len(e.fired) > 100
	}, "nothing fired")
	e.d.proc.Kill()

	// What the killed instance had read and not parked comes back from
	// JetStream ack_wait (30 s, the default) after its delivery, a second
	// or two before the kill: 30 s from the kill left too little for a
	// loaded machine (make test) to park and fire it.
	e.waitFired(60*time.Second, ids...)
	dups := 0
	for _, id := range ids {
		dups += len(e.firedCopies(id)) - 1
	}
	t.Logf("3 instances, one killed: %d delivered, %d duplicates", len(ids), dups)
	// A duplicate needs a publish whose ack was lost with the killed
	// instance: at most one claim batch per shard.
	if dups > 16*256 {
		t.Fatalf("%d duplicates", dups)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return others[0].stats().Parked == 0 }, "messages left parked")
}
