package ops

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// The gauges that DelaybridgeIngestPaused and DelaybridgeRedisMemoryNearLimit
// use, on the real binary: delaybridge_ingest_paused goes to 1 when
// limits.max_parked_messages is reached and back to 0 when cancels make room;
// delaybridge_redis_memory_used_bytes is Redis's used_memory and
// delaybridge_redis_memory_limit_bytes reports maxmemory and max_redis_memory.
func TestPausedAndMemoryGauges(t *testing.T) {
	redis := testenv.Redis(t, testenv.WithArgs("--maxmemory", "256mb", "--maxmemory-policy", "noeviction"))
	ns := testenv.NATS(t)
	js := jetStream(t, ns, map[string]string{"DELAYED": "delayed.>"})
	d := startDaemon(t, fmt.Sprintf(`
redis: {addr: "%s", key_prefix: gauges}
admin: {listen: "%%ADMIN%%"}
limits: {max_parked_messages: 3, max_redis_memory: 200000000}
shutdown_timeout: 20s
ingest:
  - name: in
    nats: {url: "%s", subject: "delayed.>", stream: DELAYED, durable: delaybridge}
    route: {sink: out, destination: fired.ok}
sinks:
  - name: out
    nats: {url: "%s", jetstream: true}
`, redis.Addr, ns.URL, ns.URL))
	defer d.stop()
	paused := func() float64 {
		v, ok := value(d.metrics(), "delaybridge_ingest_paused", map[string]string{"ingest": "in"})
		if !ok {
			t.Fatal("no delaybridge_ingest_paused{ingest=\"in\"}")
		}
		return v
	}

	fams := d.metrics()
	if v := paused(); v != 0 {
		t.Fatalf("delaybridge_ingest_paused = %v before any message, want 0", v)
	}
	if used, _ := value(fams, "delaybridge_redis_memory_used_bytes", nil); used < 100_000 || used > 256<<20 {
		t.Errorf("delaybridge_redis_memory_used_bytes = %v, want Redis's used_memory", used)
	}
	for limit, want := range map[string]float64{"maxmemory": 256 << 20, "max_redis_memory": 200000000} {
		if got, _ := value(fams, "delaybridge_redis_memory_limit_bytes", map[string]string{"limit": limit}); got != want {
			t.Errorf("delaybridge_redis_memory_limit_bytes{limit=%q} = %v, want %v", limit, got, want)
		}
	}

	// Messages due in an hour, one at a time (a batch is let through whole while
	// under the limit): the fourth finds 3 parked and ingest pauses.
	n := 0
	for paused() == 0 {
		if n == 10 {
			t.Fatalf("%d messages sent, delaybridge_ingest_paused still 0 at max_parked_messages 3", n)
		}
		id := fmt.Sprintf("m%d", n)
		n++
		publish(t, js, "delayed.x", "x-delay", "1h", "x-message-id", id)
		testenv.Eventually(t, 20*time.Second, func() bool {
			code, _ := d.do(http.MethodGet, "/v1/messages/"+id)
			return code == http.StatusOK || paused() == 1
		}, "%s neither parked nor ingest paused", id)
	}
	if n != 4 {
		t.Errorf("paused after %d messages, want 4", n)
	}
	if v, _ := value(d.metrics(), "delaybridge_ingest_paused", map[string]string{"ingest": "in", "reason": "max_parked_messages"}); v != 1 {
		t.Errorf(`delaybridge_ingest_paused{ingest="in",reason="max_parked_messages"} = %v, want 1`, v)
	}

	// Cancelling what is parked makes room: the rest is parked and ingest resumes.
	testenv.Eventually(t, 20*time.Second, func() bool {
		for i := range n {
			d.do(http.MethodDelete, fmt.Sprintf("/v1/messages/m%d", i)) // 404 for one not parked (yet)
		}
		return paused() == 0
	}, "delaybridge_ingest_paused still 1 after making room")
}
